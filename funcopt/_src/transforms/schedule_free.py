"""Schedule-free optimization (Defazio et al., 2024), as its authors' `schedulefree` package
computes it: `schedule_free` around any base optimizer, and its SGD and AdamW shortcuts."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import optree
import torch
from torch import Tensor

from ..core.base import (
    GradientTransformation,
    MaskedNode,
    Params,
    State,
    Updates,
    a_kind,
    chain,
    check_transformation,
)
from ..core.hyperparams import (
    _check_state,
    _counter,
    _device,
    _increment,
    _update,
)
from .blocks import add_decayed_weights, scale_by_learning_rate
from .moments import scale_by_rms
from .schedule_free_math import PURE, averaging, interpolate
from .schedules import linear_schedule
from .wrappers import _fill_skipped, _lowest_dtype, _map_updates

__all__ = [
    "ScheduleFreeState",
    "schedule_free",
    "schedule_free_adamw",
    "schedule_free_eval_params",
    "schedule_free_sgd",
]


class ScheduleFreeState(NamedTuple):
    """The state of `schedule_free` (optax's fields).

    Attributes:
        b1: the interpolation weight ``b1``, for `schedule_free_eval_params`.
        weight_sum: the sum of the averaging weights ``max_lr ** weight_lr_power``.
        step_count: the step the next update takes (from 1).
        max_lr: the largest learning rate so far.
        base_optimizer_state: the base optimizer's state.
        z: the base optimizer's iterate.
    """

    b1: Tensor
    weight_sum: Tensor
    step_count: Tensor
    max_lr: Tensor
    base_optimizer_state: State
    z: Params


def schedule_free(
    base_optimizer: GradientTransformation,
    learning_rate: float | Tensor | Callable[[Tensor], Any],
    b1: float | Tensor = 0.9,
    weight_lr_power: float | Tensor = 2.0,
    state_dtype: torch.dtype | None = None,
    r: float | Tensor = 0.0,
) -> GradientTransformation:
    """Schedule-Free learning (Defazio et al., 2024), as its authors' ``schedulefree``
    package computes it (``optax.contrib.schedule_free``'s arguments).

    Replaces the momentum of `base_optimizer` by interpolation and averaging: the
    base optimizer steps a sequence ``z``; the params you hold (``y``, where gradients
    are computed) are ``b1 * x + (1 - b1) * z`` with ``x`` the running average of the
    ``z``, weighted at step ``t`` (from 1) by ``t ** r * max_lr ** weight_lr_power``.
    Evaluate at ``x``, which `schedule_free_eval_params` gives. No decaying schedule is
    needed; `learning_rate` (a number, or a schedule for the warmup) is the one
    `base_optimizer` uses. A schedule is read at the step count from 0, as the base
    optimizer reads its own, so that the averaging weight and the base step of a step
    see the same learning rate (optax reads it one step later here: docs/wrappers.md).
    Give `base_optimizer` no momentum of its own.

    Args:
        base_optimizer: the optimizer stepping ``z`` (SGD, or Adam with ``b1 = 0``).
        learning_rate: the base optimizer's learning rate, or its schedule.
        b1: the interpolation weight (> 0).
        weight_lr_power: the power of the learning rate in the averaging weights.
        state_dtype: dtype of ``z`` (default: the params').
        r: the power of the step in the averaging weights (the authors' polynomial
            weighting; 0: none).

    Example:
        >>> import torch, funcopt as fo
        >>> tx = fo.schedule_free(fo.sgd(lr=0.1), learning_rate=0.1)
        >>> params = [torch.tensor([4.0])]
        >>> state = tx.init(params)
        >>> for _ in range(3):  # minimize x ** 2
        ...     updates, state = tx.update([2 * params[0]], state, params)
        ...     params = fo.apply_updates(params, updates)
        >>> params[0], fo.schedule_free_eval_params(state, params)[0]  # y, where gradients are taken; x
        (tensor([2.5242]), tensor([2.5835]))
    """
    check_transformation(base_optimizer, "schedule_free")
    if not isinstance(b1, Tensor) and not b1 > 0:
        raise ValueError(f"schedule_free: b1 must be > 0, got {b1}")
    return GradientTransformation(
        functools.partial(_free_init, base_optimizer, b1, state_dtype),
        functools.partial(_free_update, base_optimizer, learning_rate, b1, weight_lr_power, r=r),
    )


def _free_init(
    base_optimizer: GradientTransformation,
    b1: float | Tensor,
    state_dtype: torch.dtype | None,
    params: Params,
) -> ScheduleFreeState:
    dtype = _lowest_dtype(params)  # no scalar of the state promotes a param
    device = _device(params)
    z = optree.tree_map(
        lambda p: MaskedNode() if p is None else p.to(state_dtype or p.dtype, copy=True),
        params,
        none_is_leaf=True,
    )
    return ScheduleFreeState(
        b1=b1.to(dtype) if isinstance(b1, Tensor) else torch.tensor(b1, dtype=dtype, device=device),
        weight_sum=torch.zeros((), dtype=dtype, device=device),
        step_count=_counter(params, 1),
        max_lr=torch.zeros((), dtype=dtype, device=device),
        base_optimizer_state=base_optimizer.init(params),
        z=z,
    )


def _free_update(
    base_optimizer: GradientTransformation,
    learning_rate: float | Tensor | Callable[[Tensor], Any],
    b1: float | Tensor,
    weight_lr_power: float | Tensor,
    grads: Updates,
    state: ScheduleFreeState,
    params: Params | None = None,
    *,
    r: float | Tensor = 0.0,  # by keyword: a transformation pickled before r existed still loads
    **extra_args: Any,
) -> tuple[Updates, ScheduleFreeState]:
    who = "schedule_free update"
    _check_state(state, ScheduleFreeState, who)
    if params is None:
        raise ValueError(
            f"{who}: pass the params (update(grads, state, params)); schedule-free steps from them"
        )
    # the schedule at the count from 0, where the base optimizer reads its own
    lr = learning_rate(state.step_count - 1) if callable(learning_rate) else learning_rate
    lr = lr.to(state.max_lr.dtype) if isinstance(lr, Tensor) else torch.full_like(state.max_lr, lr)
    step = state.step_count.to(state.max_lr.dtype)
    ck, max_lr, total_weight = averaging(step, lr, state.max_lr, state.weight_sum, r, weight_lr_power)
    base_updates, base_state = _update(base_optimizer, grads, state.base_optimizer_state, params, extra_args)

    def leaf(u: Tensor, z: Tensor, y: Tensor) -> _Pair:
        # the base optimizer's update u is the direction with lr = -1
        out, new_z = interpolate(PURE, None, y, z, u, -1.0, ck, b1)
        return _Pair(out.to(y.dtype), new_z.to(z.dtype))

    what = "the state's z and the params"
    pairs = _map_updates(leaf, base_updates, state.z, params, who=who, what=what)
    updates = optree.tree_map(lambda x: None if x is None else x.update, pairs, none_is_leaf=True)
    new_z = optree.tree_map(lambda x: None if x is None else x.z, pairs, none_is_leaf=True)
    return updates, ScheduleFreeState(
        b1=state.b1,
        weight_sum=total_weight,
        step_count=_increment(state.step_count),
        max_lr=max_lr,
        base_optimizer_state=base_state,
        z=_fill_skipped(new_z, state.z),
    )


class _Pair:
    """A leaf's update and new z (a pytree leaf: optree does not look inside)."""

    __slots__ = ("update", "z")

    def __init__(self, update: Tensor, z: Tensor) -> None:
        self.update, self.z = update, z


def schedule_free_eval_params(state: ScheduleFreeState, params: Params) -> Params:
    """The params to evaluate a `schedule_free` model at (the average ``x``), from its
    state and the params being trained (as ``optax.contrib.schedule_free_eval_params``).

    Example:
        >>> import torch, funcopt as fo
        >>> tx = fo.schedule_free(fo.adagrad(lr=0.1), learning_rate=0.1)
        >>> params = {"w": torch.ones(2)}
        >>> state = tx.init(params)
        >>> fo.schedule_free_eval_params(state, params)["w"]  # before any step: the params
        tensor([1., 1.])
    """
    if not isinstance(state, ScheduleFreeState):
        raise ValueError(
            f"schedule_free_eval_params needs the ScheduleFreeState of a schedule_free transformation, got "
            f"{a_kind(state)}"
        )
    b1 = state.b1
    return _map_updates(
        lambda y, z: ((y - (1.0 - b1) * z) / b1).to(y.dtype),
        params,
        state.z,
        who="schedule_free_eval_params",
        what="the state's z",
    )


def _warmup(learning_rate: float | Tensor, warmup_steps: int | None, who: str) -> Any:
    """The authors' warmup: ``learning_rate * (count + 1) / warmup_steps`` at the step
    count from 0 (so the first step's, not 0) up to `learning_rate` at step
    `warmup_steps`, then constant; 0 or None: no warmup."""

    if warmup_steps is None:
        return learning_rate
    if isinstance(warmup_steps, bool) or not isinstance(warmup_steps, int) or warmup_steps < 0:
        raise ValueError(f"{who}: warmup_steps must be an int >= 0 (0: no warmup), got {warmup_steps!r}")
    if warmup_steps == 0:
        return learning_rate
    return linear_schedule(learning_rate / warmup_steps, learning_rate, transition_steps=warmup_steps - 1)


def schedule_free_sgd(
    learning_rate: float | Tensor = 1.0,
    warmup_steps: int | None = 0,
    b1: float | Tensor = 0.9,
    weight_decay: float | Tensor | None = None,
    weight_lr_power: float | Tensor = 2.0,
    state_dtype: torch.dtype | None = None,
    r: float | Tensor = 0.0,
) -> GradientTransformation:
    """Schedule-Free SGD, as the authors' ``schedulefree.SGDScheduleFree`` computes it
    (``optax.contrib.schedule_free_sgd``'s arguments, and `r`): `schedule_free` around
    ``sgd(learning_rate)`` (with `weight_decay` added to the gradients first, if given),
    the learning rate warmed up linearly over `warmup_steps` (0 or None: no warmup), the
    first step at ``learning_rate / warmup_steps``.

    Example:
        >>> import torch, funcopt as fo
        >>> tx = fo.schedule_free_sgd(learning_rate=0.1, warmup_steps=2)
        >>> params = [torch.tensor([4.0])]
        >>> state = tx.init(params)
        >>> for _ in range(3):
        ...     updates, state = tx.update([2 * params[0]], state, params)
        ...     params = fo.apply_updates(params, updates)
        >>> fo.schedule_free_eval_params(state, params)[0]
        tensor([2.6925])
    """

    lr = _warmup(learning_rate, warmup_steps, "schedule_free_sgd")
    optimizer = scale_by_learning_rate(lr)
    if weight_decay is not None:
        optimizer = chain(add_decayed_weights(weight_decay), optimizer)
    return schedule_free(optimizer, lr, b1=b1, weight_lr_power=weight_lr_power, state_dtype=state_dtype, r=r)


def schedule_free_adamw(
    learning_rate: float | Tensor = 0.0025,
    warmup_steps: int | None = 0,
    b1: float | Tensor = 0.9,
    b2: float | Tensor = 0.999,
    eps: float | Tensor = 1e-8,
    weight_decay: float | Tensor = 0.0,
    weight_lr_power: float | Tensor = 2.0,
    state_dtype: torch.dtype | None = None,
    r: float | Tensor = 0.0,
) -> GradientTransformation:
    """Schedule-Free AdamW, as the authors' ``schedulefree.AdamWScheduleFree`` computes it
    (``optax.contrib.schedule_free_adamw``'s arguments, and `r`): `schedule_free` around
    AdamW without its momentum (``scale_by_rms`` with Adam's bias correction and eps
    outside the root, decoupled weight decay, the learning rate), the learning rate
    warmed up linearly over `warmup_steps` (0 or None: no warmup), the first step at
    ``learning_rate / warmup_steps``.

    Example:
        >>> import torch, funcopt as fo
        >>> tx = fo.schedule_free_adamw(learning_rate=1.0)
        >>> params = [torch.tensor([1.0, 2.0, 3.0])]
        >>> state = tx.init(params)
        >>> for _ in range(5):  # minimize the sum of squares
        ...     updates, state = tx.update([2 * params[0]], state, params)
        ...     params = fo.apply_updates(params, updates)
        >>> round(float((fo.schedule_free_eval_params(state, params)[0] ** 2).sum()), 3)
        0.413
    """

    lr = _warmup(learning_rate, warmup_steps, "schedule_free_adamw")
    optimizer = chain(
        scale_by_rms(decay=b2, eps=eps, eps_in_sqrt=False, bias_correction=True),
        add_decayed_weights(weight_decay),
        scale_by_learning_rate(lr),
    )
    return schedule_free(optimizer, lr, b1=b1, weight_lr_power=weight_lr_power, state_dtype=state_dtype, r=r)


torch.serialization.add_safe_globals([ScheduleFreeState])  # load with torch.load(weights_only=True)
