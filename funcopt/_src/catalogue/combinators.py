"""optax's combinators, tree utilities and schedules that funcopt lacked: `apply_every`,
`freeze`, `selective_transform`, `multi_transform`, `snapshot`,
`inject_stateful_hyperparams`, `periodic_update`, `incremental_update`,
`per_example_global_norm_clip`, `warmup_constant_schedule`,
`piecewise_interpolate_schedule` (optax's names, arguments and math)."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NamedTuple, Protocol, runtime_checkable

import optree
import torch
from torch import Tensor

from ..core.base import GradientTransformation, Params, State, Updates, a_kind, check_transformation
from ..core.hyperparams import _check_state as _check_wrapper_state
from ..transforms.blocks import set_to_zero
from ..transforms.clipping import Scalar
from ..transforms.masking import masked, partition
from ..transforms.schedule_math import _interpolate_math
from ..transforms.schedules import _check_scalar, _check_steps, _Schedule, linear_schedule
from ._common import _count, _highest_dtype, _increment, device_of, leafwise, pick, present, zeros

__all__ = [
    "ApplyEvery",
    "InjectStatefulHyperparamsState",
    "SnapshotState",
    "StatefulSchedule",
    "WrappedScheduleState",
    "apply_every",
    "freeze",
    "incremental_update",
    "inject_stateful_hyperparams",
    "multi_transform",
    "per_example_global_norm_clip",
    "periodic_update",
    "piecewise_interpolate_schedule",
    "selective_transform",
    "snapshot",
    "warmup_constant_schedule",
]


# ---------------------------------------------------------------- accumulation


class ApplyEvery(NamedTuple):
    """The mini-steps taken modulo k, and the gradients accumulated (optax's names)."""

    count: Tensor  # type: ignore[assignment]  # optax's name, which shadows tuple.count
    grad_acc: Params


def _every_init(params: Params) -> ApplyEvery:
    return ApplyEvery(_count(params), zeros(params))


def _every_update(
    k: int, updates: Updates, state: State, params: Params | None = None, **extra_args: Any
) -> tuple[Updates, State]:
    who = "apply_every update"
    _check_wrapper_state(state, ApplyEvery, who)
    c = state.count % k
    keep, emit = c != 0, c == (k - 1)

    def one(g: Tensor, acc0: Tensor) -> tuple[Tensor, ...]:
        acc = keep.to(acc0.dtype) * acc0 + g
        return emit.to(acc.dtype) * acc, acc

    out, acc = leafwise(who, one, updates, state.grad_acc, n_out=2)
    return out, ApplyEvery(_increment(state.count) % k, acc)


def apply_every(k: int = 1) -> GradientTransformation:
    """Accumulate gradients, and let their sum through every `k` steps, zeros between
    (optax's ``apply_every``; `fo.MultiSteps` is the fuller tool).

    Example:
        >>> import torch, funcopt as fo
        >>> tx = fo.apply_every(2)
        >>> g = [torch.ones(2)]
        >>> u, s = tx.update(g, tx.init(g))
        >>> u, tx.update(g, s)[0]
        ([tensor([0., 0.])], [tensor([2., 2.])])
    """
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"apply_every: k must be a positive int, got {k!r}")
    return GradientTransformation(_every_init, functools.partial(_every_update, k))


# ---------------------------------------------------------------- freezing, partitions


def freeze(mask: Any) -> GradientTransformation:
    """Zero the updates where `mask` is True (a bool, a pytree of bools like the params,
    or a prefix of one), leaving the others as they are (optax's ``freeze``).

    Example:
        >>> import torch, funcopt as fo
        >>> tx = fo.freeze({"w": True, "b": False})
        >>> g = {"w": torch.ones(2), "b": torch.ones(2)}
        >>> tx.update(g, tx.init(g))[0]
        {'w': tensor([0., 0.]), 'b': tensor([1., 1.])}
    """
    return masked(set_to_zero(), mask)


def _freeze_labels(freeze_mask: Any, params: Params) -> Any:
    if isinstance(freeze_mask, bool):
        return optree.tree_map(lambda _: "freeze" if freeze_mask else "train", params)
    return optree.tree_map(lambda m: "freeze" if m else "train", freeze_mask)


def selective_transform(optimizer: GradientTransformation, *, freeze_mask: Any) -> GradientTransformation:
    """`optimizer` on the params where `freeze_mask` is False, zero updates where it is
    True (optax's ``selective_transform``); the frozen params hold no optimizer state.

    Example:
        >>> import torch, funcopt as fo
        >>> tx = fo.selective_transform(fo.scale(-0.1), freeze_mask={"w": True, "b": False})
        >>> g = {"w": torch.ones(2), "b": torch.ones(2)}
        >>> tx.update(g, tx.init(g))[0]
        {'w': tensor([0., 0.]), 'b': tensor([-0.1000, -0.1000])}
    """
    check_transformation(optimizer, "selective_transform")
    return partition(
        {"train": optimizer, "freeze": set_to_zero()}, functools.partial(_freeze_labels, freeze_mask)
    )


def multi_transform(
    transforms: Mapping[Any, GradientTransformation], param_labels: Any
) -> GradientTransformation:
    """optax's older name of `partition`: each param's updates go through the
    transformation of its label.

    Example:
        >>> import torch, funcopt as fo
        >>> tx = fo.multi_transform({"a": fo.scale(2.0), "b": fo.scale(0.0)}, {"w": "a", "v": "b"})
        >>> g = {"w": torch.ones(1), "v": torch.ones(1)}
        >>> tx.update(g, tx.init(g))[0]
        {'w': tensor([2.]), 'v': tensor([0.])}
    """
    return partition(transforms, param_labels)


# ---------------------------------------------------------------- monitoring


class SnapshotState(NamedTuple):
    """The last measurement of `snapshot`, under its name."""

    measurement: dict[str, Any]


def _snapshot_init(name: str, measure: Callable[[Any], Any], params: Params) -> SnapshotState:
    return SnapshotState({name: measure(params)})


def _snapshot_update(
    name: str, measure: Callable[[Any], Any], updates: Updates, state: State, params: Params | None = None,
    **extra_args: Any,
) -> tuple[Updates, State]:  # fmt: skip
    _check_wrapper_state(state, SnapshotState, "snapshot update")
    return updates, SnapshotState({name: measure(updates)})


def snapshot(measure_name: str, measure: Callable[[Updates], Any]) -> GradientTransformation:
    """Keep ``measure(updates)`` in the state, under `measure_name`, the updates passing
    unchanged (optax's ``snapshot``); `init` measures the params. `measure` must return
    trees of one structure, shapes and dtypes, for params and updates alike.

    Example:
        >>> import torch, funcopt as fo
        >>> tx = fo.snapshot("norm", lambda t: torch.linalg.vector_norm(t[0]))
        >>> _, s = tx.update([torch.tensor([3.0, 4.0])], tx.init([torch.zeros(2)]))
        >>> s.measurement
        {'norm': tensor(5.)}
    """
    if not callable(measure):
        raise TypeError(f"snapshot: measure must be a function of the updates, got {a_kind(measure)}")
    return GradientTransformation(
        functools.partial(_snapshot_init, measure_name, measure),
        functools.partial(_snapshot_update, measure_name, measure),
    )


# ---------------------------------------------------------------- tree updates


def periodic_update(new_tensors: Params, old_tensors: Params, steps: Any, update_period: Any) -> Params:
    """`new_tensors` at every `update_period`-th step (``steps % update_period == 0``),
    else `old_tensors` (optax's ``periodic_update``, for target networks); branch-free.

    Example:
        >>> import torch, funcopt as fo
        >>> fo.periodic_update([torch.ones(1)], [torch.zeros(1)], torch.tensor(4), 2)
        [tensor([1.])]
    """
    due = torch.as_tensor(steps % update_period == 0)
    return pick(due, new_tensors, old_tensors)


def incremental_update(new_tensors: Params, old_tensors: Params, step_size: Scalar) -> Params:
    """``step_size * new + (1 - step_size) * old`` leaf by leaf (Polyak averaging of
    target networks; optax's ``incremental_update``); a None leaf of `new_tensors` stays None.

    Example:
        >>> import torch, funcopt as fo
        >>> fo.incremental_update([torch.ones(1)], [torch.zeros(1)], 0.25)
        [tensor([0.2500])]
    """
    return optree.tree_map(
        lambda new, old: None if new is None else step_size * new + (1.0 - step_size) * old,
        new_tensors,
        old_tensors,
        none_is_leaf=True,
    )


def per_example_global_norm_clip(grads: Any, l2_norm_clip: Scalar) -> tuple[Any, Tensor]:
    """Clip each example's gradient (the leaves' slices along dimension 0) to global
    norm at most `l2_norm_clip`, then sum over examples (DP-SGD; optax's
    ``per_example_global_norm_clip``). Returns the summed gradients and how many
    examples were clipped.

    Example:
        >>> import torch, funcopt as fo
        >>> g = [torch.tensor([[3.0, 4.0], [0.3, 0.4]])]  # two examples
        >>> fo.per_example_global_norm_clip(g, 1.0)
        ([tensor([0.9000, 1.2000])], tensor(1))
    """
    leaves = present(grads)
    sizes = {x.shape[0] if x.ndim else None for x in leaves}
    if not leaves or None in sizes or len(sizes) != 1:
        raise ValueError(
            "per_example_global_norm_clip expects gradients with a batch dimension of one size in the 0th "
            f"axis of every leaf, got shapes {[tuple(x.shape) for x in leaves]}"
        )
    norms = torch.sqrt(
        functools.reduce(torch.add, [torch.sum(x.reshape(x.shape[0], -1) ** 2, dim=1) for x in leaves])
    )
    multipliers = torch.nan_to_num(torch.clamp(l2_norm_clip / norms, max=1.0), nan=1.0)
    clipped = optree.tree_map(
        lambda g: None if g is None else torch.tensordot(multipliers.to(g.dtype), g, dims=1),
        grads,
        none_is_leaf=True,
    )
    return clipped, torch.sum(multipliers < 1.0)


# ---------------------------------------------------------------- schedules


def warmup_constant_schedule(init_value: Scalar, peak_value: Scalar, warmup_steps: int) -> Any:
    """From `init_value` linearly to `peak_value` over `warmup_steps` steps, then
    `peak_value` (optax's ``warmup_constant_schedule``).

    Example:
        >>> import funcopt as fo
        >>> s = fo.warmup_constant_schedule(0.0, 1.0, 10)
        >>> s(0), s(5), s(100)
        (0.0, 0.5, 1.0)
    """
    return linear_schedule(init_value=init_value, end_value=peak_value, transition_steps=warmup_steps)


def piecewise_interpolate_schedule(
    interpolate_type: str, init_value: Scalar, boundaries_and_scales: Mapping[int, Scalar] | None = None
) -> Any:
    """Interpolate (``"linear"`` or ``"cosine"``) between the running products of
    `init_value` and the scales, each reached at its boundary (optax's
    ``piecewise_interpolate_schedule``).

    Example:
        >>> import funcopt as fo
        >>> s = fo.piecewise_interpolate_schedule("linear", 1.0, {10: 0.5})
        >>> s(0), s(5), s(20)
        (1.0, 0.75, 0.5)
    """
    fn = "piecewise_interpolate_schedule"
    if interpolate_type not in ("linear", "cosine"):
        raise ValueError(f"{fn}: interpolate_type must be 'linear' or 'cosine', got {interpolate_type!r}")
    _check_scalar(fn, "init_value", init_value)
    items = dict(sorted((boundaries_and_scales or {}).items()))
    for boundary, scale in items.items():
        _check_steps(fn, "each boundary", boundary)
        _check_scalar(fn, f"the scale at boundary {boundary}", scale)
        if not isinstance(scale, Tensor) and not scale >= 0:
            raise ValueError(f"{fn} expects non-negative scales, got {scale} at boundary {boundary}")
    hyper = {"init_value": init_value, "boundaries_and_scales": items}
    args = {"interpolate_type": interpolate_type, "init_value": init_value, "boundaries_and_scales": items}
    return _Schedule(fn, _interpolate_math, hyper, {"cosine": interpolate_type == "cosine"}, args)


# ---------------------------------------------------------------- stateful hyperparameters


@runtime_checkable
class StatefulSchedule(Protocol):
    """A schedule with a state (optax's ``StatefulSchedule``): ``init() -> state``,
    ``update(state, **extra_args) -> state`` and ``__call__(state, **extra_args) -> value``;
    the extra arguments are those of the optimizer's update (a loss ``value``)."""

    def init(self) -> Any: ...

    def update(self, state: Any, **extra_args: Any) -> Any: ...

    def __call__(self, state: Any, **extra_args: Any) -> Any: ...


class WrappedScheduleState(NamedTuple):
    """The step count of a plain schedule inside `inject_stateful_hyperparams`."""

    count: Tensor  # type: ignore[assignment]  # optax's name, which shadows tuple.count


class _WrappedSchedule:
    """A plain schedule (a function of the count) as a `StatefulSchedule`."""

    def __init__(self, schedule_fn: Callable[[Any], Any]) -> None:
        self.schedule_fn = schedule_fn

    def init(self) -> WrappedScheduleState:
        return WrappedScheduleState(torch.zeros((), dtype=torch.int32))

    def update(self, state: WrappedScheduleState, **extra_args: Any) -> WrappedScheduleState:
        return WrappedScheduleState(_increment(state.count))

    def __call__(self, state: WrappedScheduleState, **extra_args: Any) -> Any:
        return self.schedule_fn(state.count)


class InjectStatefulHyperparamsState(NamedTuple):
    """The step count, the hyperparameters of the last step (tensors), the states of
    the stateful schedules, and the inner state (optax's names)."""

    count: Tensor  # type: ignore[assignment]  # optax's name, which shadows tuple.count
    hyperparams: dict[str, Any]
    hyperparams_states: dict[str, Any]
    inner_state: State


def _as_tensor(value: Any, dtype: torch.dtype, device: torch.device) -> Any:
    """A float hyperparameter as a tensor of `dtype`; an int as an int tensor (as
    optax's ``_convert_floats``); a tensor that is not float as it is."""
    if isinstance(value, Tensor):
        return value.to(dtype=dtype, device=device) if value.is_floating_point() else value
    if isinstance(value, float):
        return torch.tensor(value, dtype=dtype, device=device)
    return torch.tensor(value, device=device)


def _takes_extra(tx: GradientTransformation) -> bool:
    try:
        parameters = inspect.signature(tx.update).parameters.values()
    except (TypeError, ValueError):
        return True
    return any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)


def _stateful_init(
    factory: Callable[..., GradientTransformation], other: dict[str, Any], numeric: dict[str, Any],
    scheduled: dict[str, Any], hyperparam_dtype: torch.dtype | None, params: Params,
) -> InjectStatefulHyperparamsState:  # fmt: skip
    dtype = hyperparam_dtype or _highest_dtype(params)
    device = device_of(params)
    hparams = {k: _as_tensor(v, dtype, device) for k, v in numeric.items()}
    states = {k: f.init() for k, f in scheduled.items()}
    hparams.update({k: _as_tensor(f(states[k]), dtype, device) for k, f in scheduled.items()})
    inner = factory(**other, **hparams).init(params)
    return InjectStatefulHyperparamsState(_count(params), hparams, states, inner)


def _stateful_update(
    factory: Callable[..., GradientTransformation], other: dict[str, Any], numeric: dict[str, Any],
    scheduled: dict[str, Any], hyperparam_dtype: torch.dtype | None,
    updates: Updates, state: State, params: Params | None = None, **extra_args: Any,
) -> tuple[Updates, State]:  # fmt: skip
    _check_wrapper_state(state, InjectStatefulHyperparamsState, "inject_stateful_hyperparams update")
    dtype = hyperparam_dtype or _highest_dtype(updates if params is None else params)
    device = state.count.device
    hparams = {k: _as_tensor(v, dtype, device) for k, v in state.hyperparams.items()}
    hs = state.hyperparams_states
    hparams.update({k: _as_tensor(f(hs[k], **extra_args), dtype, device) for k, f in scheduled.items()})
    new_hs = {k: f.update(hs[k], **extra_args) for k, f in scheduled.items()}
    inner = factory(**other, **hparams)
    if extra_args and _takes_extra(inner):
        updates, inner_state = inner.update(updates, state.inner_state, params, **extra_args)
    else:
        updates, inner_state = inner.update(updates, state.inner_state, params)
    return updates, InjectStatefulHyperparamsState(_increment(state.count), hparams, new_hs, inner_state)


def inject_stateful_hyperparams(
    inner_factory: Callable[..., GradientTransformation],
    static_args: str | Iterable[str] = (),
    hyperparam_dtype: torch.dtype | None = None,
) -> Callable[..., GradientTransformation]:
    """`inject_hyperparams` where a hyperparameter may also be a `StatefulSchedule`,
    whose state lives in ``state.hyperparams_states`` and which sees the update's extra
    arguments (a loss ``value``: a learning rate that follows the loss). A plain
    schedule is evaluated at its own count. optax's ``inject_stateful_hyperparams``.

    Example:
        >>> import torch, funcopt as fo
        >>> tx = fo.inject_stateful_hyperparams(fo.scale)(step_size=lambda count: -0.1 * (count + 1))
        >>> g = [torch.ones(1)]
        >>> s = tx.init(g)
        >>> for _ in range(2):
        ...     u, s = tx.update(g, s)
        >>> u, s.hyperparams["step_size"]
        ([tensor([-0.2000])], tensor(-0.2000))
    """
    static = {static_args} if isinstance(static_args, str) else set(static_args)
    signature = inspect.signature(inner_factory)
    if not static <= set(signature.parameters):
        raise ValueError(
            f"inject_stateful_hyperparams: static_args {sorted(static - set(signature.parameters))} are not "
            f"arguments of the factory, whose arguments are {list(signature.parameters)}"
        )

    @functools.wraps(inner_factory)
    def wrapped(*args: Any, **kwargs: Any) -> GradientTransformation:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        scheduled, numeric, other = {}, {}, {}
        for name, value in bound.arguments.items():
            if name in static or isinstance(value, bool):
                other[name] = value
            elif isinstance(value, StatefulSchedule):
                scheduled[name] = value
            elif callable(value):
                scheduled[name] = _WrappedSchedule(value)
            elif isinstance(value, (int, float, Tensor)):
                numeric[name] = value
            else:
                other[name] = value
        parts = (inner_factory, other, numeric, scheduled, hyperparam_dtype)
        return GradientTransformation(
            functools.partial(_stateful_init, *parts), functools.partial(_stateful_update, *parts)
        )

    return wrapped
