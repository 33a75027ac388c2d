"""optax's norm-based and stateless blocks, for `chain`: `scale_by_trust_ratio`,
`scale_by_param_block_norm`, `scale_by_param_block_rms`, `normalize_by_update_norm`,
`scale_by_polyak`, `scale_by_distance_over_gradients`, `scale_by_factored_rms`,
`keep_params_nonnegative`, `add_noise` (optax's names, arguments and math).

Hyperparameters may be numbers, 0-d tensors or schedules (`accepts_schedules`)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import optree
import torch
from torch import Tensor

from ..algorithms.catalogue_more import trust_ratio
from ..core.base import GradientTransformation, Params, State, Updates, empty_init
from ..core.hyperparams import accepts_schedules
from ..engine.ops import safe_sqrt
from ..transforms.clipping import Scalar, abs_sq, coef, map_updates
from ._common import (
    _check_state,
    _count,
    _increment,
    check_params,
    leafwise,
    make_key,
    norm,
    normal_like,
    present,
    require_value,
    split,
    sq_norm,
)
from .loss_step_math import polyak_step_size

__all__ = [
    "AddNoiseState",
    "FactoredState",
    "ScaleByDistanceOverGradientsState",
    "add_noise",
    "keep_params_nonnegative",
    "normalize_by_update_norm",
    "scale_by_distance_over_gradients",
    "scale_by_factored_rms",
    "scale_by_param_block_norm",
    "scale_by_param_block_rms",
    "scale_by_polyak",
    "scale_by_trust_ratio",
]


def _safe_norm(x: Tensor, min_norm: Any) -> Tensor:
    """``max(|x|, min_norm)``, with a zero gradient (not NaN) at a zero `x` (optax's ``safe_norm``)."""
    n = torch.linalg.vector_norm(x)
    small = n <= min_norm
    safe = torch.linalg.vector_norm(torch.where(small, torch.ones_like(x), x))
    return torch.where(small, torch.as_tensor(min_norm, dtype=n.dtype, device=n.device), safe)


def _safe_rms(x: Tensor, min_rms: Any) -> Tensor:
    """``max(rms(x), min_rms)``, with optax's safe gradient (``safe_root_mean_squares``)."""
    rms = torch.sqrt(abs_sq(x).mean())
    small = rms <= min_rms
    safe = torch.sqrt(abs_sq(torch.where(small, torch.ones_like(x), x)).mean())
    return torch.where(small, torch.as_tensor(min_rms, dtype=rms.dtype, device=rms.device), safe)


def _trust_ratio_update(
    min_norm: Scalar, trust_coefficient: Scalar, eps: Scalar,
    updates: Updates, state: State, params: Params | None = None, **extra_args: Any,
) -> tuple[Updates, State]:  # fmt: skip
    who = "scale_by_trust_ratio update"
    check_params(who, params)

    def one(u: Tensor, p: Tensor) -> tuple[Tensor]:
        p_norm, u_norm = _safe_norm(p, coef(min_norm, p)), _safe_norm(u, coef(min_norm, u))
        return (u * trust_ratio(p_norm, u_norm, coef(trust_coefficient, u), coef(eps, u)),)

    return leafwise(who, one, updates, params)[0], state


@accepts_schedules
def scale_by_trust_ratio(
    min_norm: Scalar = 0.0, trust_coefficient: Scalar = 1.0, eps: Scalar = 0.0
) -> GradientTransformation:
    """Scale each leaf's update by the trust ratio ``trust_coefficient * |param| /
    (|update| + eps)`` (LARS, LAMB; optax's ``scale_by_trust_ratio``); 1 where either
    norm is zero. Norms below `min_norm` count as `min_norm`. `update` needs the params.
    The ratio is ``fo.Lars``'s (``trust_ratio`` in algorithms/catalogue_more.py), without
    the weight-decay term timm adds to its denominator.

    Example:
        >>> import torch, funcopt as fo
        >>> tx = fo.scale_by_trust_ratio()
        >>> tx.update([torch.tensor([3.0, 4.0])], fo.EmptyState(), [torch.tensor([0.0, 10.0])])[0]
        [tensor([6., 8.])]
    """
    return GradientTransformation(
        empty_init, functools.partial(_trust_ratio_update, min_norm, trust_coefficient, eps)
    )


def _block_update(
    rms: bool,
    min_scale: Scalar,
    updates: Updates,
    state: State,
    params: Params | None = None,
    **extra_args: Any,
) -> tuple[Updates, State]:
    who = f"scale_by_param_block_{'rms' if rms else 'norm'} update"
    check_params(who, params)
    measure = _safe_rms if rms else _safe_norm
    return leafwise(who, lambda u, p: (u * measure(p, coef(min_scale, p)),), updates, params)[0], state


@accepts_schedules
def scale_by_param_block_norm(min_scale: Scalar = 1e-3) -> GradientTransformation:
    """Multiply each leaf's update by its param's norm, at least `min_scale` (optax's
    ``scale_by_param_block_norm``). `update` needs the params.

    Example:
        >>> import torch, funcopt as fo
        >>> tx = fo.scale_by_param_block_norm()
        >>> tx.update([torch.ones(2)], fo.EmptyState(), [torch.tensor([3.0, 4.0])])[0]
        [tensor([5., 5.])]
    """
    return GradientTransformation(empty_init, functools.partial(_block_update, False, min_scale))


@accepts_schedules
def scale_by_param_block_rms(min_scale: Scalar = 1e-3) -> GradientTransformation:
    """Multiply each leaf's update by its param's root mean square, at least
    `min_scale` (optax's ``scale_by_param_block_rms``). `update` needs the params.

    Example:
        >>> import torch, funcopt as fo
        >>> tx = fo.scale_by_param_block_rms()
        >>> tx.update([torch.ones(2)], fo.EmptyState(), [torch.tensor([1.0, 7.0])])[0]
        [tensor([5., 5.])]
    """
    return GradientTransformation(empty_init, functools.partial(_block_update, True, min_scale))


def _normalize_update(
    scale_factor: Scalar, eps: Scalar, updates: Updates, state: State, params: Params | None = None,
    **extra_args: Any,
) -> tuple[Updates, State]:  # fmt: skip
    if not present(updates):
        return updates, state
    g_norm = (norm(updates) + eps) / scale_factor
    return map_updates(lambda u: u / g_norm.to(u.dtype), updates), state


@accepts_schedules
def normalize_by_update_norm(scale_factor: Scalar = 1.0, eps: Scalar = 1e-6) -> GradientTransformation:
    """Divide the updates by their global norm (plus `eps`), times `scale_factor`
    (optax's ``normalize_by_update_norm``).

    Example:
        >>> import torch, funcopt as fo
        >>> fo.normalize_by_update_norm(eps=0.0).update([torch.tensor([3.0, 4.0])], fo.EmptyState())[0]
        [tensor([0.6000, 0.8000])]
    """
    return GradientTransformation(empty_init, functools.partial(_normalize_update, scale_factor, eps))


def _nonnegative_update(
    updates: Updates, state: State, params: Params | None = None, **extra_args: Any
) -> tuple[Updates, State]:
    who = "keep_params_nonnegative update"
    check_params(who, params)
    return leafwise(who, lambda u, p: (torch.where((p + u) < 0.0, -p, u),), updates, params)[0], state


def keep_params_nonnegative() -> GradientTransformation:
    """Change the updates so that no param becomes negative (it is set to 0 instead):
    last in a chain (optax's ``keep_params_nonnegative``). `update` needs the params.

    Example:
        >>> import torch, funcopt as fo
        >>> tx = fo.keep_params_nonnegative()
        >>> tx.update([torch.tensor([-2.0, -0.5])], fo.EmptyState(), [torch.tensor([1.0, 1.0])])[0]
        [tensor([-1.0000, -0.5000])]
    """
    return GradientTransformation(empty_init, _nonnegative_update)


# ---------------------------------------------------------------- Polyak, DoG-style


def _polyak_update(
    f_min: Scalar, max_learning_rate: Scalar, eps: Scalar, variant: str,
    updates: Updates, state: State, params: Params | None = None, *, value: Any = None, **extra_args: Any,
) -> tuple[Updates, State]:  # fmt: skip
    value = require_value("scale_by_polyak", value)
    if not present(updates):
        return updates, state
    grad_sq_norm = sq_norm(updates)
    value = torch.as_tensor(value).to(dtype=grad_sq_norm.dtype, device=grad_sq_norm.device)
    step = polyak_step_size(
        value, grad_sq_norm, f_min=f_min, max_lr=max_learning_rate, eps=eps, variant=variant
    )
    return map_updates(lambda u: step.to(u.dtype) * u, updates), state


@accepts_schedules
def scale_by_polyak(
    f_min: Scalar = 0.0, max_learning_rate: Scalar = 1.0, eps: Scalar = 0.0, variant: str = "sps"
) -> GradientTransformation:
    """Scale the updates by the Polyak step size ``min((loss - f_min) / |g|^2,
    max_learning_rate)`` (Loizou et al. 2021; optax's ``scale_by_polyak``); ``"sps+"``
    clips the gap at 0. `update` needs the loss: ``update(g, state, params, value=loss)``.

    Example:
        >>> import torch, funcopt as fo
        >>> tx = fo.scale_by_polyak()
        >>> tx.update([torch.tensor([1.0, 1.0])], fo.EmptyState(), value=torch.tensor(0.5))[0]
        [tensor([0.2500, 0.2500])]
    """
    if variant not in ("sps", "sps+"):
        raise ValueError(f"scale_by_polyak: variant must be 'sps' or 'sps+', got {variant!r}")
    return GradientTransformation(
        empty_init, functools.partial(_polyak_update, f_min, max_learning_rate, eps, variant)
    )


class ScaleByDistanceOverGradientsState(NamedTuple):
    """Per param: the largest distance from the initial params, the running sum of
    squared gradients, and the initial params (optax's names)."""

    max_dist: Params
    grad_sum_of_squares: Params
    init_params: Params


def _dog_init(
    reps_rel: Scalar, param_dtype: torch.dtype, params: Params
) -> ScaleByDistanceOverGradientsState:
    return ScaleByDistanceOverGradientsState(
        optree.tree_map(lambda p: reps_rel * (1 + safe_sqrt((p * p).sum())), params),
        optree.tree_map(lambda p: torch.zeros(1, dtype=p.dtype, device=p.device), params),
        optree.tree_map(lambda p: p.to(param_dtype), params),
    )


def _dog_update(
    eps: Scalar, global_scale: Scalar, updates: Updates, state: State, params: Params | None = None,
    **extra_args: Any,
) -> tuple[Updates, State]:  # fmt: skip
    who = "scale_by_distance_over_gradients update"
    _check_state(state, ScaleByDistanceOverGradientsState, who)
    check_params(who, params)

    def one(g: Tensor, d0: Tensor, s0: Tensor, p: Tensor, p0: Tensor) -> tuple[Tensor, ...]:
        d = torch.maximum(d0, safe_sqrt(torch.square(p - p0).sum()))  # (0 at the first step)
        s = s0 + torch.square(g).sum()
        eta = global_scale * (d / torch.sqrt(s + eps))
        return (eta * g).reshape(g.shape), d, s

    out, d, s = leafwise(
        who, one, updates, state.max_dist, state.grad_sum_of_squares, params, state.init_params, n_out=3
    )
    return out, ScaleByDistanceOverGradientsState(d, s, state.init_params)


def scale_by_distance_over_gradients(
    reps_rel: Scalar = 1e-6,
    eps: Scalar = 1e-8,
    param_dtype: torch.dtype = torch.float32,
    global_scale: Scalar = 1.0,
) -> GradientTransformation:
    """DoG's layer-wise step size (Ivgi et al. 2023; optax's
    ``scale_by_distance_over_gradients``): each leaf's update times ``max distance of its
    param from the initial one / sqrt(sum of its squared gradients)``. The initial
    params are kept in `param_dtype`. `update` needs the params.

    Example:
        >>> import torch, funcopt as fo
        >>> tx = fo.scale_by_distance_over_gradients(reps_rel=0.5, eps=0.0)
        >>> p = [torch.zeros(2)]
        >>> tx.update([torch.tensor([3.0, 4.0])], tx.init(p), p)[0]  # 0.5 / 5
        [tensor([0.3000, 0.4000])]
    """
    return GradientTransformation(
        functools.partial(_dog_init, reps_rel, param_dtype), functools.partial(_dog_update, eps, global_scale)
    )


# ---------------------------------------------------------------- factored RMS (Adafactor)


def _decay_rate_pow(i: Any, exponent: Any = 0.8) -> Any:
    """``1 - (i + 1)**(-exponent)``, in float32 as optax computes it."""
    t = (i + 1).to(torch.float32) if isinstance(i, Tensor) else torch.tensor(i + 1, dtype=torch.float32)
    return 1.0 - t ** (-exponent)


def _factored_dims(shape: tuple[int, ...], factored: bool, min_dim: int) -> tuple[int, int] | None:
    """The two largest dimensions (second largest first), if both count, else None."""
    if not factored or len(shape) < 2:
        return None
    order = sorted(range(len(shape)), key=lambda d: (shape[d], d))  # numpy's stable argsort
    if shape[order[-2]] < min_dim:
        return None
    return order[-2], order[-1]


class FactoredState(NamedTuple):
    """The step count and, per param, the row and column averages (factored params) or
    the full average (the others), a ``(1,)`` placeholder where one is unused."""

    count: Tensor  # type: ignore[assignment]  # optax's name, which shadows tuple.count
    v_row: Params
    v_col: Params
    v: Params


def _factored_init(factored: bool, min_dim: int, params: Params) -> FactoredState:
    def part(p: Tensor, which: str) -> Tensor:
        dims = _factored_dims(tuple(p.shape), factored, min_dim)
        one = torch.zeros(1, dtype=p.dtype, device=p.device)
        if dims is None:
            return torch.zeros_like(p) if which == "v" else one
        d1, d0 = dims
        if which == "v":
            return one
        return torch.zeros_like(p).sum(dim=d0 if which == "row" else d1)

    return FactoredState(
        _count(params),
        optree.tree_map(lambda p: part(p, "row"), params),
        optree.tree_map(lambda p: part(p, "col"), params),
        optree.tree_map(lambda p: part(p, "v"), params),
    )


def _factored_update(
    factored: bool, decay_rate: Scalar, step_offset: Any, min_dim: int, epsilon: Scalar, decay_rate_fn: Callable,
    updates: Updates, state: State, params: Params | None = None, **extra_args: Any,
) -> tuple[Updates, State]:  # fmt: skip
    who = "scale_by_factored_rms update"
    _check_state(state, FactoredState, who)
    check_params(who, params)
    rate = decay_rate_fn(state.count - step_offset, decay_rate)

    def one(g: Tensor, vr: Tensor, vc: Tensor, v: Tensor, p: Tensor) -> tuple[Tensor, ...]:
        dims = _factored_dims(tuple(p.shape), factored, min_dim)
        r = rate.to(g.dtype) if isinstance(rate, Tensor) and rate.dtype.itemsize > g.dtype.itemsize else rate
        g2 = abs_sq(g) + epsilon
        one_ = torch.zeros(1, dtype=p.dtype, device=p.device)
        if dims is None:
            new_v = (r * v + (1.0 - r) * g2).to(p.dtype)
            return g * new_v**-0.5, one_, one_, new_v
        d1, d0 = dims
        new_vr = (r * vr + (1.0 - r) * g2.mean(dim=d0)).to(p.dtype)
        new_vc = (r * vc + (1.0 - r) * g2.mean(dim=d1)).to(p.dtype)
        reduced_d1 = d1 - 1 if d1 > d0 else d1
        row_factor = (new_vr / new_vr.mean(dim=reduced_d1, keepdim=True)) ** -0.5
        u = g * row_factor.unsqueeze(d0) * (new_vc**-0.5).unsqueeze(d1)
        return u, new_vr, new_vc, one_

    out, vr, vc, v = leafwise(who, one, updates, state.v_row, state.v_col, state.v, params, n_out=4)
    return out, FactoredState(_increment(state.count), vr, vc, v)


def scale_by_factored_rms(
    factored: bool = True,
    decay_rate: Scalar = 0.8,
    step_offset: int = 0,
    min_dim_size_to_factor: int = 128,
    epsilon: Scalar = 1e-30,
    decay_rate_fn: Callable[[Any, Any], Any] = _decay_rate_pow,
) -> GradientTransformation:
    """Adafactor's scaling (Shazeer and Stern 2018; optax's ``scale_by_factored_rms``):
    the second moment of a matrix kept as row and column averages (over its two largest
    dimensions, both at least `min_dim_size_to_factor`), in full for the other params.
    The decay at step ``count`` is ``decay_rate_fn(count - step_offset, decay_rate)``.
    `update` needs the params.

    Example:
        >>> import torch, funcopt as fo
        >>> tx = fo.scale_by_factored_rms()
        >>> p = [torch.zeros(2)]
        >>> tx.update([torch.tensor([3.0, -4.0])], tx.init(p), p)[0]  # the first step: the sign
        [tensor([ 1., -1.])]
    """
    return GradientTransformation(
        functools.partial(_factored_init, factored, min_dim_size_to_factor),
        functools.partial(
            _factored_update,
            factored,
            decay_rate,
            step_offset,
            min_dim_size_to_factor,
            epsilon,
            decay_rate_fn,
        ),
    )


# ---------------------------------------------------------------- noise


class AddNoiseState(NamedTuple):
    """The step count and the random key (a 0-d int64 tensor) of `add_noise`."""

    count: Tensor  # type: ignore[assignment]  # optax's name, which shadows tuple.count
    rng_key: Tensor


def _noise_init(key: int | Tensor, params: Params) -> AddNoiseState:
    count = _count(params)
    return AddNoiseState(count, make_key(key, count.device))


def _noise_update(
    eta: Scalar,
    gamma: Scalar,
    updates: Updates,
    state: State,
    params: Params | None = None,
    **extra_args: Any,
) -> tuple[Updates, State]:
    _check_state(state, AddNoiseState, "add_noise update")
    count = _increment(state.count)
    std = torch.sqrt(eta / count.to(torch.float64) ** gamma)
    rng_key, sample_key = split(state.rng_key)
    leaves, treedef = optree.tree_flatten(updates, none_is_leaf=True)
    tensors = [u for u in leaves if u is not None]
    noise = iter(normal_like(sample_key, tensors))
    out = [None if u is None else u + std.to(u.dtype) * next(noise) for u in leaves]
    return treedef.unflatten(out), AddNoiseState(count, rng_key)


@accepts_schedules
def add_noise(eta: Scalar, gamma: Scalar, key: int | Tensor = 0) -> GradientTransformation:
    """Add Gaussian noise of variance ``eta / count**gamma`` to the updates (Neelakantan
    et al. 2015; optax's ``add_noise``). The noise comes from a pure counter-based
    generator keyed by `key` (an int, or a 0-d int64 tensor), held in the state: the
    same key gives the same noise, under vmap and torch.compile too (not jax's numbers).

    Example:
        >>> import torch, funcopt as fo
        >>> tx = fo.add_noise(eta=0.01, gamma=0.55, key=0)
        >>> g = [torch.zeros(1000)]
        >>> u, _ = tx.update(g, tx.init(g))
        >>> round(u[0].std().item(), 2)  # sqrt(0.01)
        0.1
    """
    return GradientTransformation(
        functools.partial(_noise_init, key), functools.partial(_noise_update, eta, gamma)
    )
