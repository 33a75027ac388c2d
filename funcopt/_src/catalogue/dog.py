"""optax.contrib's distance-over-gradients optimizers (optax's names, arguments and
math): `dog` and `dowg`, with their ``scale_by_*`` blocks. Their step size is the
distance travelled from the initial params over the accumulated gradient norms, so
`update` needs the params."""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import optree
import torch
from torch import Tensor

from ..core.base import GradientTransformation, Params, State, Updates, chain
from ..engine.ops import safe_sqrt
from ..transforms.blocks import add_decayed_weights, identity, scale_by_learning_rate
from ..transforms.clipping import Scalar
from ._common import _check_state, _lowest_dtype, check_params, copy, device_of, norm, scalar, sq_norm

__all__ = [
    "DoGState",
    "DoWGState",
    "dog",
    "dowg",
    "scale_by_dog",
    "scale_by_dowg",
]


# ---------------------------------------------------------------- DoG, DoWG


class DoGState(NamedTuple):
    """Whether no step was taken yet, the initial params, the largest distance from them
    and the running sum of squared gradient norms (optax's names)."""

    is_init_step: Tensor
    init_params: Params
    max_dist: Tensor
    sum_sq_norm_grads: Tensor


def _dog_init(init_step: tuple[str, Any], params: Params) -> DoGState:
    kind, value = init_step
    dtype, device = _lowest_dtype(params), device_of(params)
    if kind == "distance":
        r = value
    elif kind == "heuristic":
        r = value * (1 + norm(params))
    else:
        r = 0.0
    flag = torch.ones((), dtype=torch.bool, device=device)
    return DoGState(flag, copy(params), scalar(r, dtype, device), torch.zeros((), dtype=dtype, device=device))


def _dog_update(
    init_step: tuple[str, Any], eps: Scalar, updates: Updates, state: State, params: Params | None = None,
    **extra_args: Any,
) -> tuple[Updates, State]:  # fmt: skip
    who = "scale_by_dog update"
    _check_state(state, DoGState, who)
    check_params(who, params)
    dist = norm(optree.tree_map(torch.sub, state.init_params, params))  # type: ignore[arg-type]
    max_dist = torch.maximum(state.max_dist, dist.to(state.max_dist.dtype))
    sum_sq = state.sum_sq_norm_grads + sq_norm(updates)
    lr = max_dist / torch.sqrt(sum_sq + eps)
    if init_step[0] == "learning_rate":
        lr = torch.where(state.is_init_step, scalar(init_step[1], lr.dtype, lr.device), lr)
    out = optree.tree_map(lambda u: None if u is None else lr.to(u.dtype) * u, updates, none_is_leaf=True)
    return out, DoGState(torch.zeros_like(state.is_init_step), state.init_params, max_dist, sum_sq)


def scale_by_dog(init_step: tuple[str, Any], eps: Scalar = 1e-8) -> GradientTransformation:
    """DoG's step size (Ivgi et al. 2023; optax.contrib's ``scale_by_dog``): ``max
    distance from the initial params / sqrt(sum of squared gradient norms)``.
    `init_step` is ``("distance", r)``, ``("heuristic", c)`` (``r = c * (1 + |params|)``)
    or ``("learning_rate", lr)`` (the first step's). `update` needs the params.

    Example:
        >>> import torch, funcopt as fo
        >>> tx = fo.scale_by_dog(("distance", 0.5), eps=0.0)
        >>> p = [torch.zeros(2)]
        >>> tx.update([torch.tensor([3.0, 4.0])], tx.init(p), p)[0]
        [tensor([0.3000, 0.4000])]
    """
    kinds = ("distance", "learning_rate", "heuristic")
    if not (isinstance(init_step, tuple) and len(init_step) == 2 and init_step[0] in kinds):
        raise ValueError(
            f"scale_by_dog: init_step must be a pair (kind, value), kind one of {kinds}; got {init_step!r}"
        )
    return GradientTransformation(
        functools.partial(_dog_init, init_step), functools.partial(_dog_update, init_step, eps)
    )


def dog(
    learning_rate: Any = 1.0,
    init_step: tuple[str, Any] = ("heuristic", 1e-6),
    eps: Scalar = 1e-8,
    weight_decay: Scalar | None = None,
    mask: Any = None,
) -> GradientTransformation:
    """DoG (optax.contrib's ``dog``): weight decay if given, `scale_by_dog`, the
    learning rate (a multiplier, 1 by default).

    Example:
        >>> import torch, funcopt as fo
        >>> len(fo.dog().init([torch.zeros(2)]))
        3
    """
    return chain(
        add_decayed_weights(weight_decay, mask) if weight_decay is not None else identity(),
        scale_by_dog(init_step, eps),
        scale_by_learning_rate(learning_rate),
    )


class DoWGState(NamedTuple):
    """The initial params, the weighted sum of squared gradient norms and the estimated
    squared distance (optax's names)."""

    init_params: Params
    weighted_sq_norm_grads: Tensor
    estim_sq_dist: Tensor


def _dowg_init(init_estim_sq_dist: Scalar | None, eps: Scalar, params: Params) -> DoWGState:
    dtype, device = _lowest_dtype(params), device_of(params)
    r = eps if init_estim_sq_dist is None else init_estim_sq_dist
    return DoWGState(copy(params), torch.zeros((), dtype=dtype, device=device), scalar(r, dtype, device))


def _dowg_update(
    eps: Scalar, updates: Updates, state: State, params: Params | None = None, **extra_args: Any
) -> tuple[Updates, State]:
    who = "scale_by_dowg update"
    _check_state(state, DoWGState, who)
    check_params(who, params)
    sq_dist = sq_norm(optree.tree_map(torch.sub, state.init_params, params))  # type: ignore[arg-type]
    estim = torch.maximum(state.estim_sq_dist, sq_dist.to(state.estim_sq_dist.dtype))
    weighted = estim * sq_norm(updates) + state.weighted_sq_norm_grads
    lr = estim / (safe_sqrt(weighted) + eps)
    out = optree.tree_map(lambda u: None if u is None else lr.to(u.dtype) * u, updates, none_is_leaf=True)
    return out, DoWGState(state.init_params, weighted, estim)


def scale_by_dowg(init_estim_sq_dist: Scalar | None = None, eps: Scalar = 1e-4) -> GradientTransformation:
    """DoWG's step size (Khaled et al. 2023; optax.contrib's ``scale_by_dowg``): DoG with
    gradient norms weighted by the squared distance. `update` needs the params.

    Example:
        >>> import torch, funcopt as fo
        >>> tx = fo.scale_by_dowg(init_estim_sq_dist=1.0, eps=0.0)
        >>> p = [torch.zeros(2)]
        >>> tx.update([torch.tensor([3.0, 4.0])], tx.init(p), p)[0]
        [tensor([0.6000, 0.8000])]
    """
    return GradientTransformation(
        functools.partial(_dowg_init, init_estim_sq_dist, eps), functools.partial(_dowg_update, eps)
    )


def dowg(
    learning_rate: Any = 1.0,
    init_estim_sq_dist: Scalar | None = None,
    eps: Scalar = 1e-4,
    weight_decay: Scalar | None = None,
    mask: Any = None,
) -> GradientTransformation:
    """DoWG (optax.contrib's ``dowg``): weight decay if given, `scale_by_dowg`, the
    learning rate (a multiplier, 1 by default).

    Example:
        >>> import torch, funcopt as fo
        >>> len(fo.dowg().init([torch.zeros(2)]))
        3
    """
    return chain(
        add_decayed_weights(weight_decay, mask) if weight_decay is not None else identity(),
        scale_by_dowg(init_estim_sq_dist, eps),
        scale_by_learning_rate(learning_rate),
    )
