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
from ..core.hyperparams import _check_state, _increment, accepts_schedules
from ..engine.ops import Pure, TensorList
from .clipping import Scalar, abs_sq, adaptive_grad_clip, clip, clip_by_block_rms, coef, map_updates
from .masking import masked

__all__ = [
    "ScaleByScheduleState",
    "WeightDecaySchedule",
    "ZeroNansState",
    "adaptive_grad_clip",
    "add_decayed_weights",
    "centralize",
    "clip",
    "clip_by_block_rms",
    "identity",
    "named_chain",
    "scale",
    "scale_by_learning_rate",
    "scale_by_schedule",
    "scale_by_sign",
    "set_to_zero",
    "zero_nans",
]

Schedule = Callable[[Tensor], Any]
"""A function of the step count (a 0-d int32 tensor) that returns a number or a 0-d tensor."""


# ---------------------------------------------------------------- helpers


def _count(params: Params) -> Tensor:
    """A step count of 0: a 0-d int32 tensor on the device of the first param."""
    leaves = [p for p in optree.tree_leaves(params) if isinstance(p, Tensor)]
    return torch.zeros((), dtype=torch.int32, device=leaves[0].device if leaves else None)


def wide_dtype(count: Tensor) -> torch.dtype:
    """The dtype in which a block computes its per-step scalars from its `count`: float64,
    or float32 on MPS, which has no float64."""
    return torch.float32 if count.device.type == "mps" else torch.float64


def wide_count(count: Tensor) -> Tensor:
    """`count` in `wide_dtype`: what an algorithm's schedule takes, run for a block."""
    return count.to(wide_dtype(count))


def _bias_correction(decay: Scalar, count: Tensor) -> Tensor:
    """``1 - decay**count`` as a 0-d tensor, computed in float64 (where the device has it):
    in float32 it loses digits where ``decay**count`` is near 1 (see the API contract)."""
    wide = wide_dtype(count)
    c = count.to(wide)
    return 1 - (decay.to(wide) if isinstance(decay, Tensor) else decay) ** c


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
    [ScaleByScheduleState, ZeroNansState]
)  # fmt: skip
