"""A chain of building blocks, stepped in place by the adapter (`fo.Optimizer`).

``fo.Optimizer(params, lambda lr, weight_decay: fo.chain(fo.scale_by_adam(),
fo.add_decayed_weights(weight_decay), fo.scale_by_learning_rate(lr)), ...)`` would run
the chain's pure update (a dozen fresh full-size tensors per param), then write the
results back. Here a chain of known blocks (`plan`) is run as the engine runs an
`Algorithm` (``inplace.py``): blocks of large tensors, chunks of tiny ones, foreach
lists off the CPU, with the state's own tensors updated in place.

How: each block's per-step scalars (bias corrections from its count, schedule values)
are computed once per group, with the pure update's own functions on the count tensors,
then read as Python numbers in each leaf's dtype (``coef``'s cast). Its per-element
math is the pure update's own (``_ema_math`` and the others in transforms/moments.py,
Adam's that of ``algorithms/adam.py`` through ``transforms/from_algorithm.py``, written
against the engine's ``o`` ops: `Pure` there, `InPlace` or `ForEach` here). It runs on a
work tensor ``u`` (at first the gradient, only read), block after block, and the step
ends ``p += u``, as the pure path's ``p.add_(update)``.

The state is the pure path's, slot for slot (the names `state._slots` gives, a
group's shared counts written as `_step_functional` writes them), and the values are
the pure path's bit for bit (float32, float64, bfloat16, float16): the same torch ops in
the same order, each elementwise, so neither the blocks of a large tensor nor the
concatenated chunks of tiny ones change an element. Hence what it does not fuse: the
learning rate is a product, then the param's add (the pure update returns the scaled
update). And the fused ops are those the pure update can take for its hyperparameters:
weight decay is an ``add`` with ``alpha`` for a number in float32 or float64, else an
``addcmul`` with a 0-d tensor (`transforms.fuses`: ``alpha`` takes no tensor, and torch's
bfloat16 and float16 add with ``alpha`` rounds differently in a vectorized run's tail,
which a block boundary moves); a second moment is ``mul_`` then ``addcmul_`` for a
number decay, one ``lerp`` for a tensor (``addcmul``'s ``value`` takes no tensor); a
first moment is a ``lerp``. Adam's step is ``mu / (sqrt(nu * c1**2 / c2) + eps * c1)``
(``moments._adam_scalars``), its division an ``addcdiv`` with value 1 into fresh memory. The step is about 1.15x fo.AdamW's
(benchmarks/chain_step.py). Checked on the CPU (tests/
test_chain_inplace.py); off the CPU the step takes ``torch._foreach_*`` kernels, where
the pure update takes per-tensor ones: bit for bit there as far as torch's kernels of
the two kinds round alike (not checked here).

Anything else (another transformation, a mask, a ``mu_dtype``, complex or sparse
gradients, a tensor subclass, autograd recording, a tracer, capturable) keeps the pure
path: `step` returns False.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch
from torch import Tensor
from torch.autograd import forward_ad

from ..core import base, hyperparams
from ..core.base import EmptyState, GradientTransformation
from ..core.hyperparams import ScheduledState, _at
from ..engine import inplace
from ..engine.leaves import group_by
from ..engine.ops import TensorList
from ..transforms import blocks as transforms
from ..transforms import moments
from ..transforms.blocks import ScaleByScheduleState, WeightDecaySchedule, _increment
from ..transforms.clipping import _clip_by_global_norm_update, _clip_update, coef, global_norm
from ..transforms.moments import (
    EmaState,
    ScaleByAdamState,
    ScaleByRmsState,
    ScaleByRmsWithCountState,
    TraceState,
)
from .state import _assign, _distinct, _slots

_FLOATS = frozenset({torch.float32, torch.float64, torch.bfloat16, torch.float16})
_PLAIN_TYPES = frozenset(base._PLAIN)

Math = Callable[..., tuple[Any, bool, Sequence[Any]]]
"""A block's per-element math: ``math(o, u, owned, p, buffers, coefficients) -> (u,
owned, new buffers)``, as transforms/blocks.py and moments.py write it for both faces.
`u` is the update so far; the math may write it in place only where `owned` (else it is
the gradient or a state buffer). With `InPlace` and `ForEach` it updates its `buffers`
in place."""


def _num(value: Any, dtype: torch.dtype) -> Any:
    """A hyperparameter or per-step scalar as the pure update's ``coef`` makes it for a
    leaf of `dtype`, as a Python number: a tensor cast to `dtype`, a number as it is."""
    if isinstance(value, _Fuses):
        return transforms.fuses(value.c, dtype)
    return value.to(dtype).item() if isinstance(value, Tensor) else value


# ---------------------------------------------------------------- the blocks' math


def _scale_math(o: Any, u: Any, owned: bool, p: Any, buffers: Sequence[Any], c: Sequence[Any]) -> Any:
    return (o.mul_(u, c[0]) if owned else o.mul(u, c[0])), True, ()


def _sign_math(o: Any, u: Any, owned: bool, p: Any, buffers: Sequence[Any], c: Sequence[Any]) -> Any:
    return o.sign(u), True, ()


def _zero_math(o: Any, u: Any, owned: bool, p: Any, buffers: Sequence[Any], c: Sequence[Any]) -> Any:
    if isinstance(u, list):
        return TensorList(torch.zeros_like(t) for t in u), True, ()
    return torch.zeros_like(u), True, ()


def _clip_math(o: Any, u: Any, owned: bool, p: Any, buffers: Sequence[Any], c: Sequence[Any]) -> Any:
    if not owned:
        u = o.mul(u, 1)  # a copy, to clamp in place
    return o.clamp_(u, -c[0], c[0]), True, ()


# ---------------------------------------------------------------- the plan


class _Block:
    """One block of a planned chain: its math, the slots of its per-param buffers, and
    the raw scalars its math takes (numbers or 0-d tensors, or `_Fuses`)."""

    def __init__(self, math: Math, slots: Sequence[str], scalars: Sequence[Any]) -> None:
        self.math, self.slots, self.scalars = math, tuple(slots), tuple(scalars)


class _Fuses(NamedTuple):
    """The coefficient ``transforms.fuses(c, dtype)`` of a raw scalar `c`, for leaves of
    each dtype: whether the pure update takes ``x + c * y`` as an add with ``alpha``."""

    c: Any


class Plan:
    """A chain of known blocks, as the engine runs an `Algorithm`: ``elementwise`` is the
    whole chain's math on one set of tensors (or `ForEach` lists), ``p += u`` at the end."""

    def __init__(
        self, blocks: list[_Block], counts: list[tuple[str, Tensor]], later: list[Callable[[], None]]
    ) -> None:
        self.blocks = blocks
        self.later = later
        """What to compute once the step's tensors passed the checks (reads of all the gradients)."""
        self.counts = counts
        """The group's shared slots (counts) and their new values."""
        self.slots = tuple(name for block in blocks for name in block.slots)
        """The per-param buffers' slots, in the order the math takes them."""
        self._coefficients: dict[torch.dtype, Any] = {}

    def finish(self) -> None:
        """Compute what waited for the checks (`clip_by_global_norm`'s factor)."""
        for compute in self.later:
            compute()

    def coefficients(self, dtype: torch.dtype) -> Any:
        """Each block's scalars for leaves of `dtype`."""
        found = self._coefficients.get(dtype)
        if found is None:
            found = self._coefficients[dtype] = tuple(
                tuple(_num(x, dtype) for x in block.scalars) for block in self.blocks
            )
        return found

    def elementwise(self, o: Any, out: Any, p: Any, g: Any, *rest: Any, **_: Any) -> tuple[Any, list[Any]]:
        """`inplace.run`'s call: the chain's math, in place in `out` (the param) and the
        buffers, then ``p += u`` as ``apply_updates`` (the adapter's ``p.add_(u)``)."""
        *buffers, coefficients = rest
        u, owned, i = g, False, 0
        for block, c in zip(self.blocks, coefficients):
            k = len(block.slots)
            block_buffers = buffers[i : i + k]
            u, owned, new = block.math(o, u, owned, p, block_buffers, c)
            for old, value in zip(block_buffers, new):
                if value is not old:  # a guard: the in-place ops return their first argument
                    o.copy_(old, value)
            i += k
        return o.add_(out, u), buffers


class _Planner:
    """Walks a transformation alongside its state's layout (slot names in place of the
    tensors) and collects the blocks; False where something is not known."""

    def __init__(self, shared: dict[str, Any], per_param: dict[str, bool], grads: list[Tensor]) -> None:
        self.shared_values, self.per_param, self.grads = shared, per_param, grads
        self.blocks: list[_Block] = []
        self.counts: list[tuple[str, Tensor]] = []
        self.later: list[Callable[[], None]] = []
        """What to compute once the whole chain is known (reads of all the gradients)."""

    def walk(self, transform: Any, node: Any) -> bool:
        update = getattr(transform, "update", None)
        if isinstance(update, functools.partial):
            handler = _PARTIALS.get(update.func)
            return handler is not None and not update.keywords and handler(self, node, *update.args)
        if not isinstance(update, types.FunctionType) or update not in _STATELESS:
            return False
        math = _STATELESS[update]
        if math is not None:  # None: identity, no block
            self.blocks.append(_Block(math, (), ()))
        return isinstance(node, EmptyState)

    def count_of(self, node: Any, state: type[Any]) -> Tensor | None:
        """The group's count in `node`, a block's state of type `state` (None if `node` is
        another, or its count is not the group's readable count), recording its new value."""
        return self.count(node.count) if isinstance(node, state) else None

    def count(self, name: Any) -> Tensor | None:
        """The group's count at slot `name`, recording its new value."""
        if not isinstance(name, str) or self.per_param.get(name) is not False:
            return None
        count = self.shared_values.get(name)
        if not isinstance(count, Tensor) or count.dim() != 0 or not base.readable(count):
            return None
        self.counts.append((name, _increment(count)))
        return count

    def add(self, math: Math, slots: Sequence[Any], scalars: Sequence[Any]) -> bool:
        if not all(isinstance(name, str) and self.per_param.get(name) for name in slots):
            return False
        if not all(isinstance(x, _Fuses) or _scalar(x) for x in scalars):
            return False
        self.blocks.append(_Block(math, slots, scalars))
        return True


def _scalar(x: Any) -> bool:
    """Whether the math can take `x` as a number: a real number or 0-d real tensor."""
    if isinstance(x, Tensor):
        return x.dim() == 0 and not x.is_complex() and base.readable(x)
    return isinstance(x, (int, float))


_STATELESS: dict[Any, Math | None] = {
    transforms._identity_update: None,
    transforms._sign_update: _sign_math,
    transforms._set_to_zero_update: _zero_math,
}


def _chain(planner: _Planner, node: Any, parts: Sequence[GradientTransformation]) -> bool:
    return (
        type(node) is tuple
        and len(node) == len(parts)
        and all(planner.walk(t, s) for t, s in zip(parts, node))
    )


def _named_chain(planner: _Planner, node: Any, parts: Sequence[tuple[str, GradientTransformation]]) -> bool:
    names = [name for name, _ in parts]
    return (
        isinstance(node, dict)
        and sorted(node) == sorted(names)
        and all(planner.walk(t, node[name]) for name, t in parts)
    )


def _scheduled(planner: _Planner, node: Any, factory: Any, fixed: Any, schedules: Any) -> bool:
    count = planner.count_of(node, ScheduledState)
    if count is None:
        return False
    # as `_scheduled_update`: the schedules at the count as a Python int
    values = {k: _at(v, count.item()) for k, v in schedules.items()}
    return planner.walk(factory(**fixed, **values), node.inner_state)


def _scale(planner: _Planner, node: Any, step_size: Any) -> bool:
    return isinstance(node, EmptyState) and planner.add(_scale_math, (), (step_size,))


def _schedule(planner: _Planner, node: Any, step_size_fn: Any) -> bool:
    count = planner.count_of(node, ScaleByScheduleState)
    return count is not None and planner.add(_scale_math, (), (step_size_fn(count),))


def _decay(planner: _Planner, node: Any, weight_decay: Any) -> bool:
    if callable(weight_decay):
        count = planner.count_of(node, WeightDecaySchedule)
        if count is None:
            return False
        weight_decay = weight_decay(count)
    elif not isinstance(node, EmptyState):
        return False
    elif not isinstance(weight_decay, Tensor) and weight_decay == 0:  # as the pure update: nothing
        return True
    return planner.add(transforms._decay_math, (), (weight_decay, _Fuses(weight_decay)))


def _clip(planner: _Planner, node: Any, max_delta: Any) -> bool:
    return isinstance(node, EmptyState) and planner.add(_clip_math, (), (max_delta,))


def _global_clip(planner: _Planner, node: Any, max_norm: Any) -> bool:
    """`clip_by_global_norm` where the updates are still the gradients (first in the
    chain): their norm, and the factor, as `_clip_by_global_norm_update` computes them."""
    if not isinstance(node, EmptyState) or planner.blocks:
        return False
    if not _scalar(max_norm):
        return False
    block = _Block(_scale_math, (), (None,))
    planner.blocks.append(block)

    def factor() -> None:  # once the chain and the tensors pass (`Plan.finish`): else no norm is read
        norm = global_norm(planner.grads)
        m = coef(max_norm, norm)
        block.scalars = (m / torch.clamp(norm, min=m),)

    planner.later.append(factor)
    return True


def _trace(planner: _Planner, node: Any, decay: Any, nesterov: bool, accumulator_dtype: Any) -> bool:
    if accumulator_dtype is not None or not isinstance(node, TraceState):
        return False
    return planner.add(functools.partial(moments._trace_math, bool(nesterov)), (node.trace,), (decay,))


def _ema(planner: _Planner, node: Any, decay: Any, debias: bool, accumulator_dtype: Any) -> bool:
    if accumulator_dtype is not None or (count := planner.count_of(node, EmaState)) is None:
        return False
    scalars = moments._ema_scalars(decay, debias, _increment(count))
    return planner.add(functools.partial(moments._ema_math, bool(debias)), (node.ema,), scalars)


def _adam(
    planner: _Planner, node: Any, b1: Any, b2: Any, eps: Any, eps_root: Any, mu_dtype: Any, nesterov: bool
) -> bool:
    if mu_dtype is not None or not _adam_rounds_alike(planner, b1, b2):
        return False
    if (count := planner.count_of(node, ScaleByAdamState)) is None:
        return False
    scalars = moments._adam_scalars(b1, b2, eps, eps_root, nesterov, count)
    return planner.add(moments._adam_math(b2, nesterov), (node.mu, node.nu), scalars)


def _adam_rounds_alike(planner: _Planner, b1: Any, b2: Any) -> bool:
    """Whether the in-place step of Adam's math (``adam._elementwise``) rounds as the pure
    update's with these betas, which it reads as numbers. Adam computes ``1 - b`` of a
    beta: from a tensor cast to a half dtype, the pure update rounds it there (inexact
    for a beta under 0.5), where a lerp's number weight is not rounded."""
    return not (
        (isinstance(b1, Tensor) or isinstance(b2, Tensor))
        and any(g.dtype not in transforms.FUSED_ADD for g in planner.grads)
    )


def _rms(
    planner: _Planner, node: Any, decay: Any, eps: Any, eps_in_sqrt: bool, bias_correction: bool
) -> bool:
    count = None
    if bias_correction:
        count = planner.count_of(node, ScaleByRmsWithCountState)
        if count is None:
            return False
        count = _increment(count)
    elif not isinstance(node, ScaleByRmsState):
        return False
    fused = not isinstance(decay, Tensor)
    math = functools.partial(moments._rms_math, bool(eps_in_sqrt), bool(bias_correction), fused)
    return planner.add(math, (node.nu,), moments._rms_scalars(decay, eps, count))


_PARTIALS: dict[Any, Callable[..., bool]] = {
    base._chain_update: _chain,
    transforms._named_chain_update: _named_chain,
    hyperparams._scheduled_update: _scheduled,
    transforms._scale_update: _scale,
    transforms._schedule_update: _schedule,
    transforms._decay_update: _decay,
    moments._trace_update: _trace,
    moments._ema_update: _ema,
    moments._adam_update: _adam,
    moments._rms_update: _rms,
    _clip_update: _clip,
    _clip_by_global_norm_update: _global_clip,
}


def plan(
    transform: GradientTransformation, grads: list[Tensor], p: Tensor, state: dict[str, Any]
) -> Plan | None:
    """The in-place plan of `transform`'s step for a group with gradients `grads`, whose
    first param is `p`, with state `state` (a dict of the adapter's slots: the group's
    shared counts are read there), or None where the chain holds anything not known here."""

    slots, treedef = _slots(transform.init({"0": torch.empty_like(p, device="meta")}))
    names = [name for name, _, _ in slots]
    per_param = {name: is_per_param for name, is_per_param, _ in slots}
    planner = _Planner(state, per_param, grads)
    if not planner.walk(transform, treedef.unflatten(names)):
        return None
    return Plan(planner.blocks, planner.counts, planner.later)


# ---------------------------------------------------------------- the step


def _plain(params: list[Tensor], grads: list[Tensor], columns: list[list[Any]]) -> bool:
    """Whether each param, its gradient and its buffers (`columns`, one list per slot)
    are plain dense real tensors of one dtype, shape and device (else the pure path
    steps, and says what is wrong). Compared as lists: per-param checks cost more, with
    hundreds of tiny params."""
    dtypes, shapes, devices = [p.dtype for p in params], [p.shape for p in params], [p.device for p in params]
    if not (
        {type(t) for t in params} | {type(g) for g in grads} <= _PLAIN_TYPES
        and set(dtypes) <= _FLOATS
        and [g.dtype for g in grads] == dtypes
        and all([g.layout is torch.strided for g in grads])
        and [g.shape for g in grads] == shapes
        and [g.device for g in grads] == devices
    ):
        return False
    return all(
        {type(b) for b in column} == {Tensor}
        and [b.dtype for b in column] == dtypes
        and [b.shape for b in column] == shapes
        and [b.device for b in column] == devices
        for column in columns
    )


def step(
    transform: GradientTransformation,
    params: list[Tensor],
    grads: list[Tensor],
    states: list[dict[str, Any]],
    skipped: list[dict[str, Any]],
    capturable: bool = False,
) -> bool:
    """`Optimizer._step_functional`'s step of a group, in place, where `transform` is a
    chain of known blocks and nothing needs the pure update (see the module's text).
    Returns whether it stepped; False changes nothing."""
    if (
        torch.compiler.is_compiling()  # first: a compiled step reads no further
        or capturable
        or base.tracing()
        or forward_ad._current_level >= 0
        or (torch.is_grad_enabled() and base.records(params, grads))
        or len({id(p) for p in params}) != len(params)
    ):
        return False
    found = plan(transform, grads, params[0], states[0])
    if found is None:
        return False
    try:  # every check comes before anything changes
        columns = [[state[name] for state in states] for name in found.slots]
    except KeyError:  # the pure path says what is missing
        return False
    if not _plain(params, grads, columns):
        return False
    found.finish()
    for (dtype,), indices in group_by([[p.dtype for p in params]]).items():
        inplace.step_dense(
            found,
            found.coefficients(dtype),
            {},
            [params[i] for i in indices],
            [grads[i] for i in indices],
            [[column[i] for i in indices] for column in columns],
        )
    _write_counts(found.counts, states + skipped)
    return True


def _write_counts(counts: list[tuple[str, Tensor]], states: list[dict[str, Any]]) -> None:
    """The group's new counts, written as `_step_functional` writes a shared slot: once
    into each distinct tensor that holds it."""

    for name, value in counts:
        for state in _distinct(states, name):
            _assign(state, name, value)
