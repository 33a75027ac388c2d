"""``fused=True`` on the CPU: each param's step as one compiled kernel.

torch.optim has a fused step only for SGD, Adam, AdamW and Adagrad, in hand-written
C++. funcopt's classes take ``fused=True`` for every per-element algorithm and get one
from inductor instead: the algorithm's ``elementwise`` math, run with `OnParam` ops (the
`Pure` ops, starting from the param), on 1-D tensors on the memory of the param, its
gradient and its buffers, its results copied back into them. torch.compile turns that
into one loop of generated C++ that reads each tensor once and writes the param and the
buffers once, as a hand-written fused kernel does.

A kernel is compiled once per (algorithm, hyperparameters that shape the math, dtype,
which buffers are present, torch's number of threads): its length is dynamic, so one
compilation serves every param of that dtype, and every float hyperparameter and every
coefficient of the schedule reaches it in a float64 tensor of scalars (an input, not a
constant), so a scheduler's new lr or betas, or the growing step count, never
recompiles. The options that choose the math (amsgrad, maximize, nesterov, centered) are
fixed in it, and so is whether a hyperparameter such
as weight decay is zero (a term the math then leaves out): a scheduler that sets one to
zero, or from zero, compiles one more kernel. The per-step scalar math (``schedule``)
runs eagerly, in Python doubles, as the in-place step's does.

Params this step does not compile take the class's in-place step, with the same fused
semantics (float32 counters on the param's device, a GradScaler's scale and inf flag):
params of up to `inplace.TINY` (4096) elements, which it steps several at a time (a
compiled kernel's call costs 20-50 us, which would dominate their step), params whose
state the step creates (SGD's momentum_buffer at its
first step), params whose tensors are not dense alike, and algorithms whose math is not
per element (Adafactor's and Muon's per-tensor norms and matrix products).

Params off the CPU step in one compiled graph per group and device instead
(fused_lists.py), horizontally fused; on the CPU too where `fused_lists.LISTS_ON_CPU`.

The generated code is cached by inductor on disk (its FX graph cache): a second process
compiles its kernels from that cache, in about a second each.
"""

from __future__ import annotations

import types
from collections.abc import Callable, Sequence
from typing import Any, cast

import torch
from torch import Tensor

from ..engine import inplace
from ..engine.algorithm import Algorithm
from ..engine.bounds import Hyperparams
from ..engine.ops import Coef, Pure, _scale


class OnParam(Pure):
    """`Pure` ops for math whose ``out`` starts as the param itself (as the adapters'
    `InPlace` step has it), not as a zero update: ``out`` is the new param so far.
    Nothing differentiates this step: its ``sqrt`` is torch's (no guard at 0)."""

    @staticmethod
    def sqrt(x: Tensor) -> Tensor:
        return torch.sqrt(x)

    sqrt_ = sqrt

    @staticmethod
    def decay_(out: Tensor | None, p: Tensor, factor: Coef) -> Tensor:
        """The param so far times `factor` (decoupled weight decay)."""
        return _scale(p if out is None else out, factor)

    @staticmethod
    def new_param(out: Tensor | None, p: Tensor) -> Tensor:
        """The param after the update: `out` itself."""
        return p if out is None else out

    @staticmethod
    def addcmul_(x: Tensor, a: Tensor, b: Tensor, value: Coef = 1) -> Tensor:
        """``x + value * a * b``, rounded as torch's CPU kernel rounds it: ``(value * a) * b``."""
        return x + _scale(a, value) * b


def fused_flag(fused: bool | None) -> dict[str, bool]:
    """The ``fused`` entry of the defaults of a class whose torch twin has no fused step:
    none unless set, so that its ``state_dict`` is torch's (which has no such key)."""
    return {"fused": True} if fused else {}


def refuse(name: str, why: str, fused: bool | None) -> None:
    """Raise where `fused` is set for a class that has no fused step, saying why."""
    if fused:
        raise RuntimeError(f"{name} has no fused step: {why}. Leave fused unset.")


_KERNELS: dict[Any, Callable[..., None]] = {}
"""Compiled kernels by their structure (see `_kernel`)."""


def step_dense(algorithm: Algorithm, coefficients: Any, hyperparams: Hyperparams, ps: Sequence[Tensor],
               gs: Sequence[Tensor], buffers: Sequence[Sequence[Any]]) -> None:  # fmt: skip
    """`inplace.step_dense` for a fused group (`inplace.FUSED`): each CPU param of more
    than `inplace.TINY` elements whose tensors are dense alike by its compiled kernel,
    the others as in place. Raises (before anything changes) where a buffer's dtype is
    not its param's: the model was converted after the state was made."""
    for i, p in enumerate(ps):
        if any(column[i] is not None and column[i].dtype != p.dtype for column in buffers):
            raise RuntimeError("a state's dtype differs from its param's")  # the adapter names the cause

    def kernels(ps: Sequence[Tensor], gs: Sequence[Tensor], buffers: Sequence[Sequence[Any]]) -> None:
        rows: list[list[Tensor]] = []
        rest: list[int] = []  # not dense alike: as in place
        for i, (p, g) in enumerate(zip(ps, gs)):
            present = [column[i] for column in buffers if column[i] is not None]
            views = [flat(t, p) for t in (p, g, *present)] if g.dtype == p.dtype else [None]
            if any(v is None for v in views):
                rest.append(i)
            else:
                rows.append(cast(list[Tensor], views))
        if rest:
            rest_ps, rest_gs, *rest_buffers = inplace.pick((ps, gs, *buffers), rest)
            inplace.step_dense(algorithm, coefficients, hyperparams, rest_ps, rest_gs, rest_buffers)
        if rows:
            _run_kernels(
                algorithm, coefficients, hyperparams, rows, tuple(column[0] is None for column in buffers)
            )

    inplace.step_dense(algorithm, coefficients, hyperparams, ps, gs, buffers, kernel=kernels)


def _run_kernels(algorithm: Algorithm, coefficients: Any, hyperparams: Hyperparams, rows: list[list[Tensor]],
                 absent: tuple[bool, ...]) -> None:  # fmt: skip
    """Each row of flat tensors ``(p, g, *present buffers)`` by the compiled kernel of its
    structure (`_kernel`, made at its first use)."""
    static, names, values = _split(hyperparams)
    scalars = torch.tensor([float(c) for c in coefficients] + values, dtype=torch.float64)
    choices = tuple(isinstance(c, bool) for c in coefficients)
    for flats in rows:
        structure = (algorithm, static, names, choices, absent, flats[0].dtype, torch.get_num_threads())
        kernel = _KERNELS.get(structure)
        if kernel is None:
            kernel = _KERNELS[structure] = _kernel(algorithm, static, names, choices, absent)
        kernel(*flats, scalars)


def _kernel(algorithm: Algorithm, static: tuple[tuple[str, Any], ...], names: tuple[Any, ...],
            choices: tuple[bool, ...], absent: tuple[bool, ...]) -> Callable[..., None]:  # fmt: skip
    """A compiled step: the math of `algorithm` on flat tensors ``(p, g, *buffers,
    scalars)``, its results copied into them. The hyperparameters `static` are fixed in
    it; the scalars are the schedule's coefficients (a `choices` one as a bool), then the
    hyperparameters named by `names` (a key, or (key, index) for a member of a pair)."""

    def step(p: Tensor, g: Tensor, *tensors: Tensor) -> None:
        *present, scalars = tensors
        it = iter(present)
        buffers = [None if a else next(it) for a in absent]
        coefficients, hyperparams = _arguments(static, names, choices, scalars)
        out, new = algorithm.elementwise(OnParam, p, p, g, *buffers, coefficients, **hyperparams)
        p.copy_(out)
        for old, value in zip(buffers, new):
            if old is not None:
                old.copy_(value)

    # a code object of its own: dynamo keeps compilations, and counts them against its
    # recompile limit, per code object
    code = step.__code__.replace(co_name=f"fused_{algorithm.name}_{len(_KERNELS)}")
    fn = types.FunctionType(code, step.__globals__, code.co_name, step.__defaults__, step.__closure__)
    return torch.compile(fn, dynamic=True, fullgraph=True)


def _arguments(static: tuple[tuple[str, Any], ...], names: tuple[Any, ...], choices: tuple[bool, ...],
               scalars: Tensor) -> tuple[tuple[Any, ...], dict[str, Any]]:  # fmt: skip
    """The coefficients and hyperparameters of a compiled step, from its tensor of
    `scalars` (see `_kernel`): 0-d tensors, a `choices` coefficient as a bool tensor."""
    n = len(choices)
    coefficients = tuple(scalars[i] != 0 if choice else scalars[i] for i, choice in enumerate(choices))
    hyperparams = dict(static)
    for i, name in enumerate(names):
        if isinstance(name, tuple):
            pair = list(hyperparams[name[0]])
            pair[name[1]] = scalars[n + i]
            hyperparams[name[0]] = tuple(pair)
        else:
            hyperparams[name] = scalars[n + i]
    return coefficients, hyperparams


def _split(hyperparams: Hyperparams) -> tuple[tuple[tuple[str, Any], ...], tuple[Any, ...], list[float]]:
    """The hyperparameters fixed in a kernel (options, and numbers that are zero), and
    the names and values of the others (numbers, members of pairs), which it takes as
    scalars."""
    static: dict[str, Any] = {}
    names: list[Any] = []
    values: list[float] = []
    for key, value in hyperparams.items():
        members = value if isinstance(value, tuple) else (value,)
        fixed = tuple(_fixed(v) for v in members)
        static[key] = fixed if isinstance(value, tuple) else fixed[0]
        for i, v in enumerate(members):
            if fixed[i] is None:
                names.append((key, i) if isinstance(value, tuple) else key)
                values.append(float(v))
    return tuple(static.items()), tuple(names), values


def _fixed(value: Any) -> Any:
    """`value` as a kernel fixes it, or None for one it takes as a scalar: a nonzero number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value == 0:
        return value
    return None


def flat(t: Tensor, like: Tensor) -> Tensor | None:
    """`t`'s elements in memory order, as a 1-D tensor on its memory, or None where they
    are not in the order of `like`'s (not dense alike). Not a view: dynamo guards on a
    view's base, and would compile again for each number of dimensions."""
    if not (t.is_contiguous() and like.is_contiguous()) and not (t.stride() == like.stride() and _dense(t)):
        return None
    return torch.empty((), dtype=t.dtype).set_(t.untyped_storage(), t.storage_offset(), (t.numel(),), (1,))


def _dense(t: Tensor) -> bool:
    """Whether `t`'s elements fill a block of memory, each once (a permuted contiguous
    tensor: channels_last, a transpose)."""
    expected = 1
    for size, stride in sorted(zip(t.shape, t.stride()), key=lambda d: d[1]):
        if size != 1 and stride != expected:
            return False
        expected *= size
    return True
