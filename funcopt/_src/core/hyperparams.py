"""Any hyperparameter may be a schedule: `with_schedules` and `accepts_schedules` keep a step
count in the state and evaluate the schedules at it, then take the step of the factory with
those values. Also the small helpers every wrapper shares (counters, `update` with extra
arguments, state checks)."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Collection, Mapping
from typing import Any, NamedTuple

import optree
import torch
from torch import Tensor

from .base import (
    GradientTransformation,
    Params,
    State,
    Updates,
    readable,
    tracing,
)


def _increment(count: Tensor) -> Tensor:
    """``count + 1``, staying at the dtype's largest value instead of overflowing
    (optax's ``safe_increment``)."""
    info = torch.iinfo(count.dtype) if not count.is_floating_point() else torch.finfo(count.dtype)
    return torch.where(count < info.max, count + 1, count)


def _tensors(tree: Any) -> list[Tensor]:
    return [x for x in optree.tree_leaves(tree, none_is_leaf=True) if isinstance(x, Tensor)]


def _device(tree: Any) -> torch.device:
    """Where a wrapper keeps its counters: on the device of the first tensor of `tree`."""
    tensors = _tensors(tree)
    return tensors[0].device if tensors else torch.device("cpu")


def _counter(tree: Any, value: int = 0) -> Tensor:
    return torch.full((), value, dtype=torch.int32, device=_device(tree))


def _update(
    tx: GradientTransformation,
    updates: Updates,
    state: State,
    params: Params | None,
    extra_args: dict[str, Any],
) -> tuple[Updates, State]:
    """`tx`'s update, given the extra keyword arguments only where there are some (not
    every transformation accepts them)."""
    if extra_args:
        return tx.update(updates, state, params, **extra_args)
    return tx.update(updates, state, params)


def _check_state(state: Any, kind: type | tuple[type, ...], who: str) -> None:
    if not isinstance(state, kind):
        names = " or ".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
        raise TypeError(
            f"{who} got a state of type {type(state).__name__}; pass the {names} that init returned"
        )


def has_schedule(value: Any) -> bool:
    """Whether a hyperparameter is a schedule (a callable), or a pair holding one."""
    if isinstance(value, (tuple, list)):
        return any(callable(v) for v in value)
    return callable(value)


def _at(value: Any, count: Any) -> Any:
    """`value` at step `count`: a schedule evaluated there, a tuple element by element;
    anything else as it is."""
    if isinstance(value, (tuple, list)):
        return tuple(_at(v, count) for v in value)
    return value(count) if callable(value) else value


class ScheduledState(NamedTuple):
    """The state of a factory's transformation with a scheduled hyperparameter
    (`with_schedules`; also `fo.sgd`'s with a dampening, which its first step skips):
    the step count the schedules are evaluated at, and the state of the transformation
    with the values of the step."""

    count: Tensor  # type: ignore[assignment]  # optax's name (it hides tuple.count)
    inner_state: State


def with_schedules(
    factory: Callable[..., GradientTransformation],
    hyperparams: Mapping[str, Any],
    static_args: Collection[str] = (),
) -> GradientTransformation:
    """``factory(**hyperparams)``, where any hyperparameter may be a schedule.

    For factories to accept a schedule for any hyperparameter (``fo.adamw(lr=
    fo.warmup_cosine_decay_schedule(...))``): with no callable among `hyperparams`
    (nor in a pair such as ``betas=(schedule, 0.999)``) this is ``factory(**hyperparams)``
    itself. Otherwise the state is a `ScheduledState`, and each update evaluates the
    schedules at its count, then takes the step of ``factory`` with those values
    (tensors, where the schedules return tensors). Names in `static_args` are callables
    that are not schedules.

    Example:
        >>> import torch, funcopt as fo
        >>> from funcopt._src.core.hyperparams import with_schedules
        >>> tx = with_schedules(fo.adamax, {"lr": lambda count: 0.1 * (count + 1)})
        >>> params = [torch.zeros(1)]
        >>> state = tx.init(params)
        >>> for _ in range(2):
        ...     updates, state = tx.update([torch.ones(1)], state, params)
        >>> updates[0], int(state.count)
        (tensor([-0.2000]), 2)
    """
    hyperparams = dict(hyperparams)
    scheduled = {k for k, v in hyperparams.items() if k not in static_args and has_schedule(v)}
    if not scheduled:
        return factory(**hyperparams)
    fixed = {k: v for k, v in hyperparams.items() if k not in scheduled}
    schedules = {k: v for k, v in hyperparams.items() if k in scheduled}
    return GradientTransformation(
        functools.partial(_scheduled_init, factory, fixed, schedules),
        functools.partial(_scheduled_update, factory, fixed, schedules),
    )


def accepts_schedules(
    factory: Callable[..., GradientTransformation],
) -> Callable[..., GradientTransformation]:
    """`factory`, with any of its hyperparameters given as a schedule (see
    `with_schedules`): ``fo.scale_by_adam(b1=fo.linear_schedule(0.8, 0.9, 100))``."""
    signature = inspect.signature(factory)

    @functools.wraps(factory)
    def build(*args: Any, **kwargs: Any) -> GradientTransformation:
        hyperparams = signature.bind(*args, **kwargs).arguments
        if not any(has_schedule(v) for v in hyperparams.values()):
            return factory(**hyperparams)
        # the state refers to `build` (which pickles by its name), not to `factory`
        return with_schedules(build, hyperparams)

    return build


def _scheduled_init(
    factory: Callable[..., GradientTransformation],
    fixed: dict[str, Any],
    schedules: dict[str, Any],
    params: Params,
) -> ScheduledState:
    count = _counter(params)
    values = {k: _at(v, count) for k, v in schedules.items()}
    return ScheduledState(count, factory(**fixed, **values).init(params))


def _scheduled_update(
    factory: Callable[..., GradientTransformation],
    fixed: dict[str, Any],
    schedules: dict[str, Any],
    updates: Updates,
    state: ScheduledState,
    params: Params | None = None,
    **extra_args: Any,
) -> tuple[Updates, ScheduledState]:
    _check_state(
        state, ScheduledState, "update (counting its steps: a scheduled hyperparameter, or SGD's dampening)"
    )
    # a count that Python may read gives the schedules an int: exact values in double
    # precision, as Python numbers, which keep the inner step on its fast paths
    count = state.count.item() if not tracing() and readable(state.count) else state.count
    values = {k: _at(v, count) for k, v in schedules.items()}
    updates, inner_state = _update(factory(**fixed, **values), updates, state.inner_state, params, extra_args)
    return updates, ScheduledState(_increment(state.count), inner_state)
