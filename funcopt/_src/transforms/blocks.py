"""Building blocks for `chain` (optax's names, arguments and math).

Each is a `GradientTransformation` whose ``update(updates, state, params=None,
**extra_args)`` ignores the extra keyword arguments it does not use. ``None`` leaves of
the updates pass through as None, and a state buffer of such a leaf keeps its value.
Hyperparameters may be Python numbers or 0-d tensors; a tensor is cast to each leaf's
dtype, so a float32 leaf stays float32, and the step stays differentiable and batchable
with respect to it. Step counts are 0-d int32 tensors (optax's ``count``), which stop at
the largest int32 instead of wrapping around.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import optree
import torch
from torch import Tensor

from ..core.base import (
    EmptyState,
    GradientTransformation,
    Params,
    State,
    Updates,
    a_kind,
    check_transformation,
    empty_init,
    flatten_together,
)
from ..core.hyperparams import accepts_schedules
from ..engine.ops import Pure, TensorList, nonzero
from .clipping import Scalar, abs_sq, adaptive_grad_clip, clip, clip_by_block_rms, coef, map_updates
from .masking import masked

__all__ = [
    "EmaState",
    "ScaleByAdamState",
    "ScaleByRmsState",
    "ScaleByRmsWithCountState",
    "ScaleByScheduleState",
    "TraceState",
    "WeightDecaySchedule",
    "ZeroNansState",
    "adaptive_grad_clip",
    "add_decayed_weights",
    "centralize",
    "clip",
    "clip_by_block_rms",
    "ema",
    "identity",
    "named_chain",
    "scale",
    "scale_by_adam",
    "scale_by_learning_rate",
    "scale_by_rms",
    "scale_by_schedule",
    "scale_by_sign",
    "set_to_zero",
    "trace",
    "zero_nans",
]

Schedule = Callable[[Tensor], Any]
"""A function of the step count (a 0-d int32 tensor) that returns a number or a 0-d tensor."""


# ---------------------------------------------------------------- helpers


def _count(params: Params) -> Tensor:
    """A step count of 0: a 0-d int32 tensor on the device of the first param."""
    leaves = [p for p in optree.tree_leaves(params) if isinstance(p, Tensor)]
    return torch.zeros((), dtype=torch.int32, device=leaves[0].device if leaves else None)


def _increment(count: Tensor) -> Tensor:
    """``count + 1``, or `count` where that would overflow (optax's ``safe_increment``)."""
    info = torch.iinfo(count.dtype) if not count.is_floating_point() else torch.finfo(count.dtype)
    return torch.where(count < info.max, count + 1, count)


def _bias_correction(decay: Scalar, count: Tensor) -> Tensor:
    """``1 - decay**count`` as a 0-d tensor, computed in float64 (where the device has it):
    in float32 it loses digits where ``decay**count`` is near 1 (see the API contract)."""
    wide = torch.float32 if count.device.type == "mps" else torch.float64
    c = count.to(wide)
    return 1 - (decay.to(wide) if isinstance(decay, Tensor) else decay) ** c


def _check_state(state: State, kind: type | tuple[type, ...], who: str) -> None:
    if not isinstance(state, kind):
        names = " or ".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
        raise TypeError(
            f"{who} got a state of type {type(state).__name__}; pass the {names} that init returned"
        )


def _columns(who: str, updates: Updates, state: State, fields: Sequence[str]) -> tuple[list[list[Any]], Any]:
    """The leaves of `updates` and of each per-param field of `state`, lined up."""
    return flatten_together(
        updates,
        *(getattr(state, f) for f in fields),
        names=(f"{who}: updates", *(f"state.{f}" for f in fields)),
        hint="Pass updates with the structure of the params given to init, and the state it returned.",
    )


def _buffer(who: str, i: int, buffer: Any) -> Tensor:
    """The state buffer of leaf `i`, which has an update: a tensor, else a clear error."""
    if not isinstance(buffer, Tensor):
        raise ValueError(
            f"{who}: leaf {i} has an update but the state holds {a_kind(buffer)} for it (its param was "
            "None at init); init with a tensor in that place"
        )
    return buffer


def _zeros(params: Params, dtype: torch.dtype | None) -> Params:
    """Zeros like each param (None stays None), of `dtype` if given."""
    return optree.tree_map(lambda p: torch.zeros_like(p, dtype=dtype), params)


def _check_dtype(name: str, dtype: Any) -> None:
    if dtype is not None and not isinstance(dtype, torch.dtype):
        raise TypeError(f"{name} must be a torch.dtype (such as torch.bfloat16) or None, got {a_kind(dtype)}")


def _check_schedule(name: str, fn: Any) -> None:
    if not callable(fn):
        raise TypeError(f"{name} must be a function of the step count, got {a_kind(fn)}")


# The per-element math of the blocks with state or weight decay is written once, against
# an ops namespace `o` (ops.py): `Pure` in the updates here, `InPlace` or `ForEach` where
# fo.Optimizer steps a chain of blocks in place (chain_inplace.py). The same torch ops in
# the same order: both faces agree bit for bit. A math takes the update so far `u`,
# whether it may write `u` in place (`owned`: never the gradient or a state buffer), the
# param `p`, the block's per-param state `buffers` and its coefficients `c` (numbers, or
# tensors in the leaf's dtype with `Pure`), and returns ``(update, owned, new buffers)``.


def _alike(*ts: Tensor) -> list[Tensor]:
    """The tensors in one dtype, their promoted one, as optax computes a ``mu_dtype`` or
    ``accumulator_dtype`` moment with the gradient (torch.lerp takes no mixed dtypes,
    and `Pure` ops cast a tensor argument to their first one's dtype)."""
    dtype = functools.reduce(torch.promote_types, [t.dtype for t in ts])
    return [t if t.dtype == dtype else t.to(dtype) for t in ts]


def _square(o: Any, u: Any) -> Any:
    """``|u|^2`` elementwise, in `u`'s dtype (a complex one with zero imaginary parts,
    to average with a complex state)."""
    if isinstance(u, Tensor) and u.is_complex():
        return abs_sq(u).to(u.dtype)
    return o.mul(u, u)


def _average_of_squares(o: Any, fused: bool, v0: Any, u: Any, decay: Any, one_minus_decay: Any) -> Any:
    """``decay * v0 + (1 - decay) * |u|^2``, in place in `v0` with `InPlace`. `fused`
    where the decay is a number (not a tensor: traced, batched), as torch's Adam: ``mul_``,
    then ``addcmul_`` (`Pure` takes a tensor value of ``addcmul`` apart); else one lerp."""
    if not fused or (isinstance(u, Tensor) and u.is_complex()):
        return o.lerp_(v0, _square(o, u), one_minus_decay)
    return o.addcmul_(o.mul_(v0, decay), u, u, value=one_minus_decay)


FUSED_ADD = (torch.float32, torch.float64)
"""The dtypes in which ``x + c * y`` may be ``torch.add(x, y, alpha=c)``. In bfloat16 and
float16 torch's CPU kernel rounds it differently in a vectorized run's body and in its
scalar tail, so where a tensor is cut into blocks or concatenated with others (the
in-place step) would change its elements."""


def fuses(c: Any, dtype: torch.dtype) -> bool:
    """Whether ``x + c * y`` is an add with ``alpha=c`` for a coefficient `c` on leaves of
    `dtype`: a number (``alpha`` takes no tensor) in one of `FUSED_ADD`. Else it is
    ``torch.addcmul(x, y, c)``, `c` a 0-d tensor, which rounds alike wherever an element
    falls, in every dtype."""
    return not isinstance(c, Tensor) and dtype in FUSED_ADD


def _scalar_tensor(c: Any, like: Any) -> Any:
    """`c` as a 0-d tensor of `like`'s dtype and device (a `TensorList` of them for a
    list): a number made into one, a tensor (`coef`'s) cast."""
    if isinstance(like, list):
        return TensorList(_scalar_tensor(c, t) for t in like)
    if isinstance(c, Tensor):
        return c if c.dtype == like.dtype else c.to(like.dtype)
    return torch.full((), c, dtype=like.dtype, device=like.device)


# ---------------------------------------------------------------- stateless


def _identity_update(updates: Updates, state: State, params: Params | None = None, **extra_args: Any) -> Any:
    return updates, state


def identity() -> GradientTransformation:
    """Leave the updates as they are (optax's ``identity``).

    Example:
        >>> import torch, funcopt as fo
        >>> fo.identity().update([torch.tensor([1.0, -2.0])], fo.EmptyState())[0]
        [tensor([ 1., -2.])]
    """
    return GradientTransformation(empty_init, _identity_update)


def _set_to_zero_update(
    updates: Updates, state: State, params: Params | None = None, **extra_args: Any
) -> Any:
    return map_updates(torch.zeros_like, updates), state


def set_to_zero() -> GradientTransformation:
    """Zero updates, which leave the params unchanged (optax's ``set_to_zero``): with
    `fo.masked` or `fo.partition`, it freezes part of the params.

    Example:
        >>> import torch, funcopt as fo
        >>> fo.set_to_zero().update([torch.tensor([1.0, -2.0])], fo.EmptyState())[0]
        [tensor([0., 0.])]
    """
    return GradientTransformation(empty_init, _set_to_zero_update)


def _scale_update(
    step_size: Scalar, updates: Updates, state: State, params: Params | None = None, **extra_args: Any
) -> tuple[Updates, State]:
    return map_updates(lambda u: coef(step_size, u) * u, updates), state


@accepts_schedules
def scale(step_size: Scalar) -> GradientTransformation:
    """Multiply the updates by `step_size` (optax's ``scale``).

    Example:
        >>> import torch, funcopt as fo
        >>> fo.scale(-0.1).update([torch.tensor([1.0, -2.0])], fo.EmptyState())[0]
        [tensor([-0.1000,  0.2000])]
    """
    # module-level functions, not closures, so that the transformation pickles
    return GradientTransformation(empty_init, functools.partial(_scale_update, step_size))


def _sign_update(updates: Updates, state: State, params: Params | None = None, **extra_args: Any) -> Any:
    return map_updates(torch.sgn, updates), state


def scale_by_sign() -> GradientTransformation:
    """The sign of each update, -1, 0 or 1 (optax's ``scale_by_sign``).

    Example:
        >>> import torch, funcopt as fo
        >>> fo.scale_by_sign().update([torch.tensor([0.3, 0.0, -2.0])], fo.EmptyState())[0]
        [tensor([ 1.,  0., -1.])]
    """
    return GradientTransformation(empty_init, _sign_update)


def _subtract_mean(u: Tensor) -> Tensor:
    return u - u.mean(dim=tuple(range(1, u.ndim)), keepdim=True) if u.ndim > 1 else u


def _centralize_update(
    updates: Updates, state: State, params: Params | None = None, **extra_args: Any
) -> Any:
    return map_updates(_subtract_mean, updates), state


def centralize() -> GradientTransformation:
    """Subtract from each update of two or more dimensions its mean over all dimensions
    but the first (optax's ``centralize``, gradient centralization, Yong et al. 2020);
    vectors and scalars pass unchanged.

    Example:
        >>> import torch, funcopt as fo
        >>> fo.centralize().update([torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])], fo.EmptyState())[0]
        [tensor([[-1.,  0.,  1.],
                [-1.,  0.,  1.]])]
    """
    return GradientTransformation(empty_init, _centralize_update)


# ---------------------------------------------------------------- schedules, weight decay


class ScaleByScheduleState(NamedTuple):
    """The step count of a schedule (optax's ``ScaleByScheduleState``)."""

    count: Tensor  # type: ignore[assignment]  # optax's name, which shadows tuple.count


def _schedule_init(params: Params) -> ScaleByScheduleState:
    return ScaleByScheduleState(count=_count(params))


def _schedule_update(
    step_size_fn: Schedule, updates: Updates, state: State, params: Params | None = None, **extra_args: Any
) -> tuple[Updates, State]:
    _check_state(state, ScaleByScheduleState, "scale_by_schedule update")
    step_size = step_size_fn(state.count)
    return map_updates(lambda u: coef(step_size, u) * u, updates), ScaleByScheduleState(
        _increment(state.count)
    )


def scale_by_schedule(step_size_fn: Schedule) -> GradientTransformation:
    """Multiply the updates by ``step_size_fn(count)``, where count is the number of
    steps taken before (optax's ``scale_by_schedule``).

    Example:
        >>> import torch, funcopt as fo
        >>> tx = fo.scale_by_schedule(lambda count: 0.5**count)
        >>> grads = [torch.ones(2)]
        >>> state = tx.init(grads)
        >>> _, state = tx.update(grads, state)
        >>> tx.update(grads, state)[0]  # the second step: count 1
        [tensor([0.5000, 0.5000])]
    """
    _check_schedule("scale_by_schedule: step_size_fn", step_size_fn)
    return GradientTransformation(_schedule_init, functools.partial(_schedule_update, step_size_fn))


def _times(factor: float, fn: Schedule, count: Tensor) -> Any:
    return factor * fn(count)


def scale_by_learning_rate(
    learning_rate: Scalar | Schedule | None = None, *, flip_sign: bool = True
) -> GradientTransformation:
    """Multiply the updates by ``-learning_rate`` (by ``learning_rate`` if not
    `flip_sign`), as optax's ``scale_by_learning_rate``. A schedule (a function of the
    step count) gives a `ScaleByScheduleState` holding the count; None leaves the
    updates as they are.

    Example:
        >>> import torch, funcopt as fo
        >>> fo.scale_by_learning_rate(0.1).update([torch.tensor([1.0, -2.0])], fo.EmptyState())[0]
        [tensor([-0.1000,  0.2000])]
    """
    if learning_rate is None:
        return identity()
    m = -1 if flip_sign else 1
    if callable(learning_rate):
        return scale_by_schedule(functools.partial(_times, m, learning_rate))
    return scale(m * learning_rate)


class WeightDecaySchedule(NamedTuple):
    """The step count of a weight decay schedule (optax's ``WeightDecaySchedule``)."""

    count: Tensor  # type: ignore[assignment]  # optax's name, which shadows tuple.count


def _decay_init(weight_decay: Scalar | Schedule, params: Params) -> State:
    return WeightDecaySchedule(count=_count(params)) if callable(weight_decay) else EmptyState()


def _decay_update(
    weight_decay: Scalar | Schedule,
    updates: Updates,
    state: State,
    params: Params | None = None,
    **extra_args: Any,
) -> tuple[Updates, State]:
    who = "add_decayed_weights update"
    if params is None:
        raise ValueError("add_decayed_weights needs the params: call update(grads, state, params)")
    if callable(weight_decay):
        _check_state(state, WeightDecaySchedule, who)
        s = weight_decay(state.count)
        state = WeightDecaySchedule(_increment(state.count))
    else:
        _check_state(state, EmptyState, who)
        s = weight_decay
        if not isinstance(s, Tensor) and s == 0:  # a constant 0: nothing to add, as optax
            return updates, state
    (gs, ps), unflatten = flatten_together(
        updates,
        params,
        names=(f"{who}: updates", "params"),
        hint="Pass params with the structure of the updates.",
    )
    out = [
        None
        if g is None
        else _decay_math(Pure, g, False, _buffer(who, i, p), (), (coef(s, g), fuses(s, g.dtype)))[0]
        for i, (g, p) in enumerate(zip(gs, ps))
    ]
    return unflatten(out), state


def _decay_math(o: Any, u: Any, owned: bool, p: Any, buffers: Any, c: Any) -> Any:
    """``updates + weight_decay * params``, one op (see `fuses`); `c` is
    ``(weight_decay, fuses(weight_decay, dtype))``."""
    weight_decay, fused = c
    if fused:
        return (o.add_(u, p, alpha=weight_decay) if owned else o.add(u, p, alpha=weight_decay)), True, ()
    w = _scalar_tensor(weight_decay, u)
    return (o.addcmul_(u, p, w) if owned else o.addcmul(u, p, w)), True, ()


def _without_extra_args(
    inner: GradientTransformation,
    updates: Updates,
    state: State,
    params: Params | None = None,
    **extra_args: Any,
) -> tuple[Updates, State]:
    """`inner`'s update, with the extra arguments it does not take left out."""
    return inner.update(updates, state, params)


def add_decayed_weights(weight_decay: Scalar | Schedule = 0.0, mask: Any = None) -> GradientTransformation:
    """Add ``weight_decay * params`` to the updates (optax's ``add_decayed_weights``):
    decoupled weight decay, as AdamW's, when it comes before the learning rate in a chain.

    `weight_decay` may be a schedule (the state then holds the count). `mask` (a pytree
    of bools like the params, or a function that makes one from them) limits the decay
    to the leaves where it is True, through `fo.masked`. `update` needs the params.

    Example:
        >>> import torch, funcopt as fo
        >>> tx = fo.add_decayed_weights(0.1)
        >>> tx.update([torch.zeros(2)], tx.init(None), [torch.tensor([1.0, 2.0])])[0]
        [tensor([0.1000, 0.2000])]
    """
    if not callable(weight_decay) and not isinstance(weight_decay, Tensor) and not weight_decay >= 0:
        raise ValueError(f"add_decayed_weights: weight_decay must be non-negative, got {weight_decay}")
    tx = GradientTransformation(
        functools.partial(_decay_init, weight_decay), functools.partial(_decay_update, weight_decay)
    )
    if mask is None:
        return tx
    inner = masked(tx, mask)
    return GradientTransformation(inner.init, functools.partial(_without_extra_args, inner))


# ---------------------------------------------------------------- accumulators


class TraceState(NamedTuple):
    """The trace of past updates, like the params (optax's ``TraceState``)."""

    trace: Params


def _trace_init(accumulator_dtype: torch.dtype | None, params: Params) -> TraceState:
    return TraceState(trace=_zeros(params, accumulator_dtype))


def _trace_update(
    decay: Scalar,
    nesterov: bool,
    accumulator_dtype: torch.dtype | None,
    updates: Updates,
    state: State,
    params: Params | None = None,
    **extra_args: Any,
) -> tuple[Updates, State]:
    who = "trace update"
    _check_state(state, TraceState, who)
    (gs, ts), unflatten = _columns(who, updates, state, ("trace",))
    out, new = list(gs), list(ts)
    for i, (g, t) in enumerate(zip(gs, ts)):
        if g is None:
            continue
        g, t = _alike(g, _buffer(who, i, t))
        out[i], _, (new_t,) = _trace_math(nesterov, Pure, g, False, None, (t,), (coef(decay, g),))
        new[i] = new_t if accumulator_dtype is None else new_t.to(accumulator_dtype)
    return unflatten(out), TraceState(unflatten(new))


def _trace_math(nesterov: bool, o: Any, u: Any, owned: bool, p: Any, buffers: Any, c: Any) -> Any:
    """``trace = updates + decay * trace``; the update is the trace, or ``updates + decay
    * trace`` with `nesterov`."""
    ((t0,), (decay,)) = buffers, c
    t = o.add_(o.mul_(t0, decay), u)
    if nesterov:
        return o.add_(o.mul(t, decay), u), True, (t,)
    return t, False, (t,)


@accepts_schedules
def trace(
    decay: Scalar, nesterov: bool = False, accumulator_dtype: torch.dtype | None = None
) -> GradientTransformation:
    """Momentum: ``trace = updates + decay * trace``, the new updates being the trace
    (``updates + decay * trace`` with `nesterov`), as optax's ``trace``; torch's SGD
    momentum without dampening. `accumulator_dtype` is the dtype of the stored trace
    (default: the params').

    Example:
        >>> import torch, funcopt as fo
        >>> tx = fo.trace(decay=0.9)
        >>> grads = [torch.ones(2)]
        >>> updates, state = tx.update(grads, tx.init(grads))
        >>> tx.update(grads, state)[0]
        [tensor([1.9000, 1.9000])]
    """
    _check_dtype("trace: accumulator_dtype", accumulator_dtype)
    return GradientTransformation(
        functools.partial(_trace_init, accumulator_dtype),
        functools.partial(_trace_update, decay, nesterov, accumulator_dtype),
    )


class EmaState(NamedTuple):
    """The step count and the moving average, like the params (optax's ``EmaState``)."""

    count: Tensor  # type: ignore[assignment]  # optax's name, which shadows tuple.count
    ema: Params


def _ema_init(accumulator_dtype: torch.dtype | None, params: Params) -> EmaState:
    return EmaState(count=_count(params), ema=_zeros(params, accumulator_dtype))


def _ema_update(
    decay: Scalar,
    debias: bool,
    accumulator_dtype: torch.dtype | None,
    updates: Updates,
    state: State,
    params: Params | None = None,
    **extra_args: Any,
) -> tuple[Updates, State]:
    who = "ema update"
    _check_state(state, EmaState, who)
    (gs, es), unflatten = _columns(who, updates, state, ("ema",))
    count = _increment(state.count)
    scalars = _ema_scalars(decay, debias, count)
    out, new = list(gs), list(es)
    for i, (g, e) in enumerate(zip(gs, es)):
        if g is None:
            continue
        g, e = _alike(g, _buffer(who, i, e))
        out[i], _, (new_e,) = _ema_math(debias, Pure, g, False, None, (e,), [coef(x, g) for x in scalars])
        new[i] = new_e if accumulator_dtype is None else new_e.to(accumulator_dtype)
    return unflatten(out), EmaState(count, unflatten(new))


def _ema_scalars(decay: Scalar, debias: bool, count: Tensor) -> tuple[Any, ...]:
    """`_ema_math`'s coefficients at the step whose count (incremented) is `count`."""
    return 1 - decay, _bias_correction(decay, count) if debias else 1


def _ema_math(debias: bool, o: Any, u: Any, owned: bool, p: Any, buffers: Any, c: Any) -> Any:
    """``ema = (1 - decay) * updates + decay * ema`` (as one lerp), debiased or not."""
    ((e0,), (weight, correction)) = buffers, c
    e = o.lerp_(e0, u, weight)
    if debias:
        return o.div(e, correction), True, (e,)
    return e, False, (e,)


@accepts_schedules
def ema(
    decay: Scalar, debias: bool = True, accumulator_dtype: torch.dtype | None = None
) -> GradientTransformation:
    """An exponential moving average of the updates, ``ema = (1 - decay) * updates +
    decay * ema``, divided by ``1 - decay**count`` with `debias` (optax's ``ema``).
    `accumulator_dtype` is the dtype of the stored average (default: the params').

    Example:
        >>> import torch, funcopt as fo
        >>> tx = fo.ema(decay=0.9)
        >>> grads = [torch.full((2,), 2.0)]
        >>> tx.update(grads, tx.init(grads))[0]  # debiased: the first update itself
        [tensor([2., 2.])]
    """
    _check_dtype("ema: accumulator_dtype", accumulator_dtype)
    return GradientTransformation(
        functools.partial(_ema_init, accumulator_dtype),
        functools.partial(_ema_update, decay, debias, accumulator_dtype),
    )


class ScaleByAdamState(NamedTuple):
    """The step count and Adam's moments, like the params (optax's ``ScaleByAdamState``)."""

    count: Tensor  # type: ignore[assignment]  # optax's name, which shadows tuple.count
    mu: Params
    nu: Params


def _adam_init(mu_dtype: torch.dtype | None, params: Params) -> ScaleByAdamState:
    return ScaleByAdamState(count=_count(params), mu=_zeros(params, mu_dtype), nu=_zeros(params, None))


def _adam_update(
    b1: Scalar,
    b2: Scalar,
    eps: Scalar,
    eps_root: Scalar,
    mu_dtype: torch.dtype | None,
    nesterov: bool,
    updates: Updates,
    state: State,
    params: Params | None = None,
    **extra_args: Any,
) -> tuple[Updates, State]:
    who = "scale_by_adam update"
    _check_state(state, ScaleByAdamState, who)
    (gs, ms, vs), unflatten = _columns(who, updates, state, ("mu", "nu"))
    count = _increment(state.count)
    scalars = _adam_scalars(b1, b2, eps, eps_root, nesterov, count)
    math = functools.partial(_adam_math, nesterov, nonzero(eps_root), not isinstance(b2, Tensor))
    out, new_m, new_v = list(gs), list(ms), list(vs)
    for i, (g, m0, v0) in enumerate(zip(gs, ms, vs)):
        if g is None:
            continue
        v0 = _buffer(who, i, v0)
        g, *buffers = _alike(g, _buffer(who, i, m0), v0)
        out[i], _, (m, v) = math(Pure, g, False, None, buffers, [coef(x, g) for x in scalars])
        new_m[i] = m if mu_dtype is None else m.to(mu_dtype)
        new_v[i] = v.to(v0.dtype)
    return unflatten(out), ScaleByAdamState(count, unflatten(new_m), unflatten(new_v))


def _adam_scalars(
    b1: Scalar, b2: Scalar, eps: Scalar, eps_root: Scalar, nesterov: bool, count: Tensor
) -> Any:
    """`_adam_math`'s coefficients at the step whose count (incremented) is `count`."""
    correction1, correction2 = _bias_correction(b1, count), _bias_correction(b2, count)
    if nesterov:
        correction1_next = _bias_correction(b1, _increment(count))
        return 1 - b1, b2, 1 - b2, correction2, eps_root, eps, b1, correction1, correction1_next
    # mu_hat / (sqrt(nu_hat + eps_root) + eps), with c1, c2 the corrections, is
    # mu / (sqrt(nu * c1**2 / c2 + eps_root * c1**2) + eps * c1): an op fewer per element
    square = correction1 * correction1
    return 1 - b1, b2, 1 - b2, correction2 / square, eps_root * square, eps * correction1


def _adam_math(
    nesterov: bool,
    with_eps_root: bool,
    fused: bool,
    o: Any,
    u: Any,
    owned: bool,
    p: Any,
    buffers: Any,
    c: Any,
) -> Any:
    """``mu_hat / (sqrt(nu_hat + eps_root) + eps)``, the first moment one lerp; its
    coefficients as `_adam_scalars` gives them, `fused` where `b2` is not a tensor."""
    m0, v0 = buffers
    one_minus_b1, b2, one_minus_b2, nu_scale, eps_root, eps = c[:6]
    mu = o.lerp_(m0, u, one_minus_b1)
    nu = _average_of_squares(o, fused, v0, u, b2, one_minus_b2)
    denom = o.div(nu, nu_scale)  # nu / c2 with nesterov, else nu * c1**2 / c2 (`_adam_scalars`)
    if with_eps_root:
        denom = o.add_(denom, eps_root)
    denom = o.add_(o.sqrt_(denom), eps)
    if not nesterov:
        return o.div(mu, denom), True, (mu, nu)
    # Dozat 2016, as optax: b1 * mu / correction1_next + (1 - b1) * updates / correction1
    b1, correction1, correction1_next = c[6:]
    m_hat = o.add_(o.mul_(o.div(mu, correction1_next), b1), o.mul_(o.div(u, correction1), one_minus_b1))
    return o.div_(m_hat, denom), True, (mu, nu)


@accepts_schedules
def scale_by_adam(
    b1: Scalar = 0.9,
    b2: Scalar = 0.999,
    eps: Scalar = 1e-8,
    eps_root: Scalar = 0.0,
    mu_dtype: torch.dtype | None = None,
    *,
    nesterov: bool = False,
) -> GradientTransformation:
    """Adam's scaling, without the learning rate (optax's ``scale_by_adam``):
    ``mu_hat / (sqrt(nu_hat + eps_root) + eps)`` with the bias-corrected moving averages
    of the updates (`b1`) and of their squares (`b2`); `nesterov` takes Dozat's Nesterov
    momentum. `mu_dtype` is the dtype of the stored first moment (default: the params').
    Chain it with `scale_by_learning_rate` for Adam. Its ``sqrt`` has derivative 0 at 0,
    so a meta-gradient through it is finite where an update entry is exactly 0, also
    with ``eps_root=0`` (optax's is NaN there).

    Example:
        >>> import torch, funcopt as fo
        >>> tx = fo.scale_by_adam()
        >>> grads = [torch.tensor([0.5, -2.0])]
        >>> tx.update(grads, tx.init(grads))[0]  # the first step: the sign, to round-off
        [tensor([ 1., -1.])]
    """
    _check_dtype("scale_by_adam: mu_dtype", mu_dtype)
    return GradientTransformation(
        functools.partial(_adam_init, mu_dtype),
        functools.partial(_adam_update, b1, b2, eps, eps_root, mu_dtype, nesterov),
    )


class ScaleByRmsState(NamedTuple):
    """The moving average of squared updates, like the params (optax's ``ScaleByRmsState``)."""

    nu: Params


class ScaleByRmsWithCountState(NamedTuple):
    """The step count and the moving average of squared updates (optax's
    ``ScaleByRmsWithCountState``), for `scale_by_rms` with `bias_correction`."""

    count: Tensor  # type: ignore[assignment]  # optax's name, which shadows tuple.count
    nu: Params


def _full(params: Params, value: Scalar) -> Params:
    """`value` in the shape and dtype of each param (None stays None)."""
    if isinstance(value, Tensor):
        return optree.tree_map(lambda p: torch.zeros_like(p) + coef(value, p), params)
    return optree.tree_map(lambda p: torch.full_like(p, value), params)


def _rms_init(initial_scale: Scalar, bias_correction: bool, params: Params) -> State:
    nu = _full(params, initial_scale)
    return (
        ScaleByRmsWithCountState(count=_count(params), nu=nu) if bias_correction else ScaleByRmsState(nu=nu)
    )


def _rms_update(
    decay: Scalar,
    eps: Scalar,
    eps_in_sqrt: bool,
    bias_correction: bool,
    updates: Updates,
    state: State,
    params: Params | None = None,
    **extra_args: Any,
) -> tuple[Updates, State]:
    who = "scale_by_rms update"
    _check_state(state, ScaleByRmsWithCountState if bias_correction else ScaleByRmsState, who)
    (gs, vs), unflatten = _columns(who, updates, state, ("nu",))
    count = _increment(state.count) if bias_correction else None
    scalars = _rms_scalars(decay, eps, count)
    math = functools.partial(_rms_math, eps_in_sqrt, bias_correction, not isinstance(decay, Tensor))
    out, new = list(gs), list(vs)
    for i, (g, v0) in enumerate(zip(gs, vs)):
        if g is None:
            continue
        g, v0 = _alike(g, _buffer(who, i, v0))
        out[i], _, (new[i],) = math(Pure, g, False, None, (v0,), [coef(x, g) for x in scalars])
    if count is None:
        return unflatten(out), ScaleByRmsState(unflatten(new))
    return unflatten(out), ScaleByRmsWithCountState(count, unflatten(new))


def _rms_scalars(decay: Scalar, eps: Scalar, count: Tensor | None) -> tuple[Any, ...]:
    """`_rms_math`'s coefficients at the step whose count (incremented) is `count` (None
    without bias correction)."""
    return decay, 1 - decay, 1 if count is None else _bias_correction(decay, count), eps


def _rms_math(
    eps_in_sqrt: bool,
    bias_correction: bool,
    fused: bool,
    o: Any,
    u: Any,
    owned: bool,
    p: Any,
    buffers: Any,
    c: Any,
) -> Any:
    """``updates / sqrt(nu_hat + eps)``, or ``updates / (sqrt(nu_hat) + eps)``; `fused`
    where `decay` is not a tensor."""
    ((v0,), (decay, one_minus_decay, correction, eps)) = buffers, c
    nu = _average_of_squares(o, fused, v0, u, decay, one_minus_decay)
    if eps_in_sqrt:  # nu_hat + eps: a new tensor (nu is the state)
        denom = o.add_(o.div(nu, correction), eps) if bias_correction else o.add(nu, eps)
        denom = o.sqrt_(denom)
    else:
        denom = o.add_(o.sqrt_(o.div(nu, correction)) if bias_correction else o.sqrt(nu), eps)
    return o.div(u, denom), True, (nu,)


@accepts_schedules
def scale_by_rms(
    decay: Scalar = 0.9,
    eps: Scalar = 1e-8,
    initial_scale: Scalar = 0.0,
    eps_in_sqrt: bool = True,
    bias_correction: bool = False,
) -> GradientTransformation:
    """Divide the updates by the root of the moving average of their squares (optax's
    ``scale_by_rms``, RMSprop's scaling): ``updates / sqrt(nu + eps)``, or ``updates /
    (sqrt(nu) + eps)`` without `eps_in_sqrt`. `initial_scale` is the average's initial
    value; `bias_correction` divides it by ``1 - decay**count`` (the state then holds
    the count).

    Example:
        >>> import torch, funcopt as fo
        >>> tx = fo.scale_by_rms(decay=0.75, eps=0.0)
        >>> grads = [torch.tensor([2.0, -4.0])]
        >>> tx.update(grads, tx.init(grads))[0]  # nu = 0.25 * grads**2
        [tensor([ 2., -2.])]
    """
    return GradientTransformation(
        functools.partial(_rms_init, initial_scale, bias_correction),
        functools.partial(_rms_update, decay, eps, eps_in_sqrt, bias_correction),
    )


# ---------------------------------------------------------------- NaNs


class ZeroNansState(NamedTuple):
    """For each param, a 0-d bool tensor: whether its update held a NaN at the last step
    (optax's ``ZeroNansState``)."""

    found_nan: Params


def _zero_nans_init(params: Params) -> ZeroNansState:
    return ZeroNansState(
        found_nan=optree.tree_map(lambda p: torch.zeros((), dtype=torch.bool, device=p.device), params)
    )


def _zero_nans_update(updates: Updates, state: State, params: Params | None = None, **extra_args: Any) -> Any:
    who = "zero_nans update"
    _check_state(state, ZeroNansState, who)
    (gs, fs), unflatten = _columns(who, updates, state, ("found_nan",))
    out, found = list(gs), list(fs)
    for i, g in enumerate(gs):
        if g is not None:
            nan = torch.isnan(g)
            out[i] = torch.where(nan, torch.zeros_like(g), g)
            found[i] = nan.any()
    return unflatten(out), ZeroNansState(unflatten(found))


def zero_nans() -> GradientTransformation:
    """Replace NaNs in the updates by zeros (optax's ``zero_nans``); the state says, for
    each param, whether its update held a NaN at the last step.

    Example:
        >>> import torch, funcopt as fo
        >>> tx = fo.zero_nans()
        >>> grads = {"w": torch.tensor([1.0, float("nan")])}
        >>> updates, state = tx.update(grads, tx.init(grads))
        >>> updates["w"], state.found_nan["w"]
        (tensor([1., 0.]), tensor(True))
    """
    return GradientTransformation(_zero_nans_init, _zero_nans_update)


# ---------------------------------------------------------------- named_chain


def _named_chain_init(
    transforms: tuple[tuple[str, GradientTransformation], ...], params: Params
) -> dict[str, State]:
    return {name: t.init(params) for name, t in transforms}


def _named_chain_update(
    transforms: tuple[tuple[str, GradientTransformation], ...],
    updates: Updates,
    state: State,
    params: Params | None = None,
    **extra_args: Any,
) -> tuple[Updates, dict[str, State]]:
    names = [name for name, _ in transforms]
    if not isinstance(state, dict) or sorted(state) != sorted(names):
        got = sorted(state) if isinstance(state, dict) else a_kind(state)
        raise ValueError(
            f"named_chain of {names} got a state with keys {got}: pass the state that this chain's init returned"
        )
    new_state = {}
    for name, t in transforms:
        # the algorithms' updates take no extra keyword arguments: pass them only if given
        if extra_args:
            updates, new_state[name] = t.update(updates, state[name], params, **extra_args)
        else:
            updates, new_state[name] = t.update(updates, state[name], params)
    return updates, new_state


def named_chain(*transforms: tuple[str, GradientTransformation]) -> GradientTransformation:
    """`chain` with a name for each transformation (optax's ``named_chain``): the state
    is a dict of their states by name, in order.

    Example:
        >>> import torch, funcopt as fo
        >>> tx = fo.named_chain(("clip", fo.clip(1.0)), ("adam", fo.scale_by_adam()), ("lr", fo.scale(-0.1)))
        >>> params = [torch.zeros(2)]
        >>> state = tx.init(params)
        >>> list(state), state["adam"].count
        (['clip', 'adam', 'lr'], tensor(0, dtype=torch.int32))
    """
    for i, pair in enumerate(transforms):
        if not (isinstance(pair, tuple) and len(pair) == 2 and isinstance(pair[0], str)):
            raise TypeError(
                f"named_chain (argument {i}): expected a pair (name, transformation), got {a_kind(pair)}"
            )
        check_transformation(pair[1], f"named_chain (argument {i}, {pair[0]!r})")
    names = [name for name, _ in transforms]
    if len(set(names)) != len(names):
        raise ValueError(f"named_chain: each transformation needs a name of its own, got {names}")
    return GradientTransformation(
        functools.partial(_named_chain_init, transforms), functools.partial(_named_chain_update, transforms)
    )


torch.serialization.add_safe_globals(  # load with torch.load(weights_only=True), as the algorithms' states do
    [EmaState, ScaleByAdamState, ScaleByRmsState, ScaleByRmsWithCountState, ScaleByScheduleState, TraceState,
     ZeroNansState]
)  # fmt: skip
