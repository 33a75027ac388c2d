"""Clipping building blocks for `chain` (optax's names and math): `clip`,
`clip_by_global_norm`, `clip_by_block_rms`, `adaptive_grad_clip`.

Each is stateless; ``None`` leaves pass through as None. A tensor hyperparameter stays a
tensor (cast to each leaf's dtype), so that these work under ``vmap``, ``grad`` and
``torch.compile``."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import optree
import torch
from torch import Tensor

from ..core.base import (
    GradientTransformation,
    Params,
    State,
    Updates,
    empty_init,
    flatten_together,
    real_dtype,
)
from ..core.hyperparams import accepts_schedules
from ..engine.ops import safe_sqrt

Scalar = float | Tensor
"""A hyperparameter: a Python number or a 0-d tensor."""


def coef(value: Any, t: Tensor) -> Any:
    """A hyperparameter as a coefficient of leaf `t`: a tensor in `t`'s (real) dtype, so
    that a 0-d float64 tensor does not promote a float32 leaf; a number as it is."""
    return value.to(real_dtype(t)) if isinstance(value, Tensor) else value


def abs_sq(t: Tensor) -> Tensor:
    """``|t|^2`` elementwise, real for a complex `t` (optax's ``numerics.abs_sq``)."""
    return t.real.square() + t.imag.square() if t.is_complex() else t * t


def map_updates(fn: Any, updates: Updates) -> Updates:
    """`fn` on each present leaf of `updates`; None leaves stay None."""
    return optree.tree_map(lambda u: None if u is None else fn(u), updates, none_is_leaf=True)


def _check_nonnegative(name: str, value: Scalar) -> None:
    if not isinstance(value, Tensor) and not value >= 0:
        raise ValueError(f"{name} must be non-negative, got {value}")


@accepts_schedules
def clip(max_delta: Scalar) -> GradientTransformation:
    """Clip the updates elementwise to ``[-max_delta, max_delta]`` (optax's ``clip``).

    Example:
        >>> import torch, funcopt as fo
        >>> clipped, _ = fo.clip(1.0).update([torch.tensor([-3.0, 0.5])], fo.EmptyState())
        >>> clipped[0]
        tensor([-1.0000,  0.5000])
    """
    _check_nonnegative("clip: max_delta", max_delta)
    # module-level functions, not closures, so that the transformation pickles
    return GradientTransformation(empty_init, functools.partial(_clip_update, max_delta))


def _clip_update(
    max_delta: Scalar, updates: Updates, state: State, params: Params | None = None, **extra_args: Any
) -> tuple[Updates, State]:
    def one(u: Tensor) -> Tensor:
        m = coef(max_delta, u)
        return torch.clamp(u, -m, m)

    return map_updates(one, updates), state


@accepts_schedules
def clip_by_global_norm(max_norm: Scalar) -> GradientTransformation:
    """Scale the updates so that their global L2 norm is at most `max_norm`.

    optax's rule: updates whose norm is below `max_norm` pass unchanged, others are
    multiplied by ``max_norm / norm``. (``torch.nn.utils.clip_grad_norm_`` multiplies
    by ``min(1, max_norm / (norm + 1e-6))``, which differs from it by about
    ``1e-6 / norm`` in relative terms.) ``None`` leaves are ignored. The coefficient
    stays a tensor, so this works under ``vmap``, ``grad`` and ``torch.compile``.

    Example:
        >>> import torch, funcopt as fo
        >>> clipped, _ = fo.clip_by_global_norm(1.0).update([torch.tensor([3.0, 4.0])], fo.EmptyState())
        >>> clipped[0]
        tensor([0.6000, 0.8000])
    """
    _check_nonnegative("clip_by_global_norm: max_norm", max_norm)
    return GradientTransformation(empty_init, functools.partial(_clip_by_global_norm_update, max_norm))


def global_norm(leaves: Sequence[Tensor]) -> Tensor:
    """The L2 norm of all `leaves` together, on the first one's device (per-leaf norms
    first, so that a DTensor reduces its norm across shards)."""
    device = leaves[0].device
    norms = [torch.linalg.vector_norm(u).to(device) for u in leaves]
    return torch.linalg.vector_norm(torch.stack(norms))


def _clip_by_global_norm_update(
    max_norm: Scalar, updates: Updates, state: State, params: Params | None = None, **extra_args: Any
) -> tuple[Updates, State]:
    (leaves,), unflatten = flatten_together(updates)
    present = [u for u in leaves if u is not None]
    if not present:
        return updates, state
    norm = global_norm(present)
    # optax: where(norm < max_norm, u, u / norm * max_norm); written as one coefficient,
    # which has no division by a zero norm, so its gradient has no NaN there
    m = coef(max_norm, norm)
    factor = m / torch.clamp(norm, min=m)
    clipped = [None if u is None else u * factor.to(real_dtype(u)) for u in leaves]
    return unflatten(clipped), state


@accepts_schedules
def clip_by_block_rms(threshold: Scalar) -> GradientTransformation:
    """Scale each leaf of the updates (a block: a weight vector or matrix) so that its
    root mean square is at most `threshold` (optax's ``clip_by_block_rms``).

    Example:
        >>> import torch, funcopt as fo
        >>> clipped, _ = fo.clip_by_block_rms(1.0).update([torch.tensor([4.0, 0.0])], fo.EmptyState())
        >>> clipped[0]  # its rms was sqrt(8)
        tensor([1.4142, 0.0000])
    """
    _check_nonnegative("clip_by_block_rms: threshold", threshold)
    return GradientTransformation(empty_init, functools.partial(_clip_by_block_rms_update, threshold))


def _clip_by_block_rms_update(
    threshold: Scalar, updates: Updates, state: State, params: Params | None = None, **extra_args: Any
) -> tuple[Updates, State]:
    def one(u: Tensor) -> Tensor:
        rms = safe_sqrt(abs_sq(u).mean())  # a derivative of 0 where the block is all 0
        return u / torch.clamp(rms / coef(threshold, u), min=1.0)

    return map_updates(one, updates), state


def unitwise_norm(t: Tensor, axis: int | tuple[int, ...] | None = None) -> Tensor:
    """The L2 norm of each unit of `t` (kept dimensions, broadcastable to `t`), as
    optax's ``unitwise_norm``: over `axis`, else the whole of a scalar or vector, the
    first axis of a 2-d or 3-d tensor (a linear layer's inputs), the first three of a
    4-d one (a convolution's HWI) and the first four of a 5-d one."""
    if axis is None:
        if t.squeeze().ndim <= 1:
            axis = tuple(range(t.ndim))
        elif t.ndim in (2, 3):
            axis = 0
        elif t.ndim in (4, 5):
            axis = tuple(range(t.ndim - 1))
        else:
            raise ValueError(
                f"adaptive_grad_clip: a leaf of shape {tuple(t.shape)} has no default units (it does for "
                "1 to 5 dimensions); pass axis=... to say over which dimensions to take the norm"
            )
    return torch.linalg.vector_norm(t, dim=axis, keepdim=True)


@accepts_schedules
def adaptive_grad_clip(
    clipping: Scalar, eps: Scalar = 1e-3, axis: int | tuple[int, ...] | None = None
) -> GradientTransformation:
    """Clip each unit of the updates to at most ``clipping * max(norm of its param, eps)``
    (optax's ``adaptive_grad_clip``, Brock et al. 2021); units as `unitwise_norm`
    says. `update` needs the params.

    Example:
        >>> import torch, funcopt as fo
        >>> tx = fo.adaptive_grad_clip(0.1)
        >>> updates, _ = tx.update([torch.tensor([3.0, 4.0])], fo.EmptyState(), [torch.tensor([0.0, 10.0])])
        >>> updates[0]  # norm 5, clipped to 0.1 * 10
        tensor([0.6000, 0.8000])
    """
    _check_nonnegative("adaptive_grad_clip: clipping", clipping)
    _check_nonnegative("adaptive_grad_clip: eps", eps)
    return GradientTransformation(
        empty_init, functools.partial(_adaptive_grad_clip_update, clipping, eps, axis)
    )


def _adaptive_grad_clip_update(
    clipping: Scalar,
    eps: Scalar,
    axis: int | tuple[int, ...] | None,
    updates: Updates,
    state: State,
    params: Params | None = None,
    **extra_args: Any,
) -> tuple[Updates, State]:
    if params is None:
        raise ValueError("adaptive_grad_clip needs the params: call update(grads, state, params)")
    (gs, ps), unflatten = flatten_together(
        updates,
        params,
        names=("adaptive_grad_clip update: updates", "params"),
        hint="Pass params with the structure of the updates.",
    )
    out: list[Tensor | None] = []
    for i, (g, p) in enumerate(zip(gs, ps)):
        if g is None:
            out.append(None)
            continue
        if p is None:
            raise ValueError(f"adaptive_grad_clip: leaf {i} has an update but its param is None")
        g_norm = unitwise_norm(g, axis)
        max_norm = coef(clipping, g) * torch.clamp(unitwise_norm(p, axis), min=coef(eps, p)).to(g_norm.dtype)
        clipped = g * (max_norm / torch.clamp(g_norm, min=1e-6))  # optax's div_eps: no division by zero
        out.append(torch.where(g_norm < max_norm, g, clipped))
    return unflatten(out), state
