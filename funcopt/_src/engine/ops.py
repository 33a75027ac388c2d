"""The ways to run an algorithm's per-tensor math, from one copy of it.

Each algorithm writes its elementwise math once, against a namespace ``o`` that is
`InPlace`, `ForEach` (`InPlace` on lists of tensors), `Pure` or `PureForEach` (`Pure`
on lists of tensors)::

    exp_avg = o.lerp_(exp_avg, g, 1 - beta1)
    out = o.addcdiv_(out, exp_avg, exp_inf, value=-clr)

Rules the math follows:

- A name ending in ``_`` may overwrite its first argument, which must be a state
  buffer, a temporary made by the math itself, or ``out``; never the gradient or the
  param. `InPlace` does overwrite it (the fast path of the torch.optim adapters);
  `Pure` returns a new tensor and mutates nothing (the functional path, safe under
  ``torch.func`` and ``torch.compile``). A name without ``_`` always returns a new tensor.
- ``out`` is where the step accumulates, passed in by the caller: the param itself
  (the adapters), a zero update in fresh memory (the functional path in plain eager
  mode: `Fresh` memory for blocks of large CPU tensors, zeros in the lists of `ForEach`
  groups, on a GPU and for small CPU tensors), or ``None``, a zero update
  not yet allocated (`Pure`, `PureForEach`, and a building block that runs an
  algorithm's math: see ``transforms/from_algorithm.py``); the first op that writes it
  then returns a new tensor. Only ``add_``, ``addcdiv_`` and ``decay_``
  write to ``out``, the math uses the ``out`` they return, and it reads ``p`` before it
  writes to ``out``.
- `ForEach` is `InPlace` with every tensor argument a `TensorList`: each op is one
  ``torch._foreach_*`` call for a whole group of params (one kernel launch on a GPU,
  where per-tensor ops are bound by launch overhead; one call instead of a Python call
  per tensor for the functional path's small CPU tensors). Sparse gradients never take it.
  `PureForEach` is the same for `Pure`, where autograd records outside torch.func: one
  autograd node per op for a whole group.
- Coefficients (``value=``, ``alpha=``, weights) are Python numbers with `InPlace`,
  `ForEach` and `PureForEach`.
  With `Pure` they may also be 0-d tensors (tensor hyperparameters, step-dependent
  scalars); those are cast to the dtype of the tensor they scale, so a float64
  scalar never promotes a float32 param or state.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple, Protocol

import torch
from torch import Tensor
from torch.autograd import forward_ad

from ..core.base import readable

Coef = Any
"""A coefficient: a Python number, or a 0-d tensor (with `Pure`)."""


class Ops(Protocol):
    """What an algorithm's math may call on ``o``: every namespace (`InPlace`, `ForEach`,
    `Pure`, `PureForEach`, and fused.py's `OnParam`) has each of these, so that math that
    runs on one face runs on all (tests/test_ops.py checks it). On `ForEach` and
    `PureForEach` each tensor argument is a `TensorList`, and ``item`` gives a list.
    A name ending in ``_`` may overwrite its first argument (see the rules above)."""

    def neg(self, x: Any) -> Any: ...
    def abs(self, x: Any) -> Any: ...
    def sign(self, x: Any) -> Any: ...
    def sign_(self, x: Any) -> Any: ...
    def tanh(self, x: Any) -> Any: ...
    def sqrt(self, x: Any) -> Any: ...
    def sqrt_(self, x: Any) -> Any: ...
    def reciprocal_(self, x: Any) -> Any: ...
    def clone(self, x: Any) -> Any: ...
    def item(self, x: Any) -> Any: ...
    def add(self, x: Any, y: Any, alpha: Coef = 1) -> Any: ...
    def add_(self, x: Any, y: Any, alpha: Coef = 1) -> Any: ...
    def sub(self, x: Any, y: Any) -> Any: ...
    def mul(self, x: Any, y: Any) -> Any: ...
    def mul_(self, x: Any, y: Any) -> Any: ...
    def div(self, x: Any, y: Any) -> Any: ...
    def div_(self, x: Any, y: Any) -> Any: ...
    def lerp(self, x: Any, y: Any, weight: Coef) -> Any: ...
    def lerp_(self, x: Any, y: Any, weight: Coef) -> Any: ...
    def addcmul(self, x: Any, a: Any, b: Any, value: Coef = 1) -> Any: ...
    def addcmul_(self, x: Any, a: Any, b: Any, value: Coef = 1) -> Any: ...
    def addcdiv_(self, x: Any, a: Any, b: Any, value: Coef = 1) -> Any: ...
    def maximum_(self, x: Any, y: Any) -> Any: ...
    def clamp_(self, x: Any, low: Coef, high: Coef) -> Any: ...
    def gt(self, x: Any, c: Coef) -> Any: ...
    def lt(self, x: Any, c: Coef) -> Any: ...
    def eq(self, x: Any, c: Coef) -> Any: ...
    def where(self, condition: Any, x: Any, y: Any) -> Any: ...
    def masked_fill(self, x: Any, mask: Any, value: Coef) -> Any: ...
    def masked_fill_(self, x: Any, mask: Any, value: Coef) -> Any: ...
    def copy_(self, x: Any, y: Any) -> Any: ...
    def decay_(self, out: Any, p: Any, factor: Coef) -> Any: ...
    def new_param(self, out: Any, p: Any) -> Any: ...


def nonzero(x: Coef) -> bool:
    """Whether an optional term (say weight decay) is on. A tensor always counts as on:
    its value is never read in Python, so it stays traceable and batchable."""
    return isinstance(x, Tensor) or x != 0


def power(base: Coef, exponent: Coef) -> Coef:
    """``base ** exponent``, for the per-step schedules.

    Under torch.compile it is written ``exp(exponent * log(base))``, the same value:
    on CPU, inductor computes a reused scalar that contains ``exp`` once, in its own
    kernel, where it would inline a double-precision ``pow`` into the loop over every
    element of every param (a 2x slower step).
    """
    if torch.compiler.is_compiling() and isinstance(exponent, Tensor):
        log = torch.log(base) if isinstance(base, Tensor) else math.log(base)
        return torch.exp(exponent * log)
    return base**exponent


def counter_product(counter: Coef, factor: Coef, dtype: torch.dtype | None) -> Coef:
    """``counter * factor`` for a schedule's new counter, computed as torch.optim computes
    it, in place in the counter tensor (NAdam's ``mu_product *= mu``): in the counter's
    `dtype`, float32 by default, so that the product, and the coefficients torch then
    reads back from it, round as torch's do. `dtype` is None where the counters are
    float64 tensors (traced), and a tensor factor that autograd, forward-mode AD or a
    torch.func transform records keeps its graph: the product is then plain. A factor
    from a plain tensor hyperparameter is multiplied in as torch does, in place."""
    if dtype is None or isinstance(counter, Tensor):
        return counter * factor
    if isinstance(factor, Tensor) and (not readable(factor) or forward_ad._current_level >= 0):
        return counter * factor
    device = factor.device if isinstance(factor, Tensor) else "cpu"
    return torch.tensor(counter, dtype=dtype, device=device).mul_(factor).item()


def at_least(x: Coef, floor: Coef) -> Coef:
    """``max(floor, x)`` for the per-step schedules (ASGD's ``max(1, step - t0)``):
    Python's ``max`` for numbers, as torch computes it, and branch-free for a tensor
    (traced, batched or differentiated), with no Python comparison of its value."""
    if isinstance(x, Tensor):
        return torch.clamp(x, min=floor)
    if isinstance(floor, Tensor):
        return torch.clamp(floor, min=x)
    return max(floor, x)


def safe_sqrt(x: Tensor) -> Tensor:
    """``torch.sqrt(x)``, bit for bit, with a derivative of 0 where `x` is 0, the
    convention of a subgradient. torch's derivative there is infinite, and a gradient
    entry that is exactly zero (a dead ReLU unit's) then makes ``0 * inf = NaN`` in a
    meta-gradient through Adam's ``sqrt(v)``. The root is taken of 1 in place of each 0
    and the zeros are put back (`x` itself, detached: ``sqrt(-0.0)`` is ``-0.0``), so no
    infinite derivative is formed, even in the branch that ``torch.where`` drops. For the
    `Pure` ops, which autograd, forward-mode AD, torch.func and torch.compile run through."""
    zero = x == 0
    return torch.where(zero, x.detach(), torch.sqrt(torch.where(zero, 1.0, x)))


_DIFFERENTIATING = (torch._C._functorch.TransformType.Grad, torch._C._functorch.TransformType.Jvp)


def differentiable(x: Tensor) -> bool:
    """Whether a derivative through `x` may be taken: autograd records it, a forward-mode
    AD level is open, a torch.func ``grad`` or ``jvp`` transform runs (under ``vmap``
    too), or torch.compile traces (its graph may be differentiated, and inductor fuses
    `safe_sqrt`'s guard into the same loop). A ``vmap`` alone differentiates nothing."""
    if x.requires_grad or forward_ad._current_level >= 0 or torch.compiler.is_compiling():
        return True
    stack = torch._C._functorch.get_interpreter_stack()
    return stack is not None and any(i.key() in _DIFFERENTIATING for i in stack)


def sqrt_derivative(grad: Tensor, root: Tensor) -> Tensor:
    """``grad / (2 * root)``, torch's derivative of ``sqrt`` times `grad`, and 0 where
    `root` is 0 (see `safe_sqrt`); itself differentiable with no NaN (a second derivative)."""
    zero = root == 0
    return torch.where(zero, 0.0, grad / (2 * torch.where(zero, 1.0, root)))


class Fresh(NamedTuple):
    """``out`` as memory that holds no value yet, standing for a zero update: the first
    op that writes it assigns its result there, with no pass to zero it first, and
    returns the plain tensor, which later ops accumulate into."""

    memory: Tensor


class InPlace:
    """Overwrites buffers and ``out`` in place; coefficients are Python numbers."""

    # Rprop, ASGD, RMSprop: new tensors, masks, and writes into temporaries (Rprop's factors)
    sign = staticmethod(torch.sign)
    sign_ = staticmethod(Tensor.sign_)
    tanh = staticmethod(torch.tanh)
    mul = staticmethod(torch.mul)
    sub = staticmethod(torch.sub)
    addcmul = staticmethod(torch.addcmul)
    gt = staticmethod(torch.gt)
    lt = staticmethod(torch.lt)
    eq = staticmethod(torch.eq)
    masked_fill = staticmethod(torch.masked_fill)
    masked_fill_ = staticmethod(Tensor.masked_fill_)
    clamp_ = staticmethod(Tensor.clamp_)

    @staticmethod
    def new_param(out: Tensor, p: Tensor) -> Tensor:
        """The param after the update `out` (ASGD's average reads it): `out` itself where
        it is the param (the adapters step in place), else a new ``p + out``."""
        return out if out is p else torch.add(p, out)

    neg = staticmethod(torch.neg)
    abs = staticmethod(torch.abs)
    sqrt = staticmethod(torch.sqrt)
    add = staticmethod(torch.add)
    div = staticmethod(torch.div)
    mul_ = staticmethod(Tensor.mul_)
    div_ = staticmethod(Tensor.div_)
    sqrt_ = staticmethod(Tensor.sqrt_)
    reciprocal_ = staticmethod(Tensor.reciprocal_)
    lerp_ = staticmethod(Tensor.lerp_)
    addcmul_ = staticmethod(Tensor.addcmul_)
    where = staticmethod(torch.where)

    copy_ = staticmethod(Tensor.copy_)
    clone = staticmethod(torch.clone)
    lerp = staticmethod(torch.lerp)  # a new tensor (Muon's Nesterov step reads the gradient)

    @staticmethod
    def item(x: Tensor) -> float:
        """A 0-d result (a per-tensor norm) as a Python number, as torch's step reads it
        (Adafactor); for algorithms that are not `Algorithm.per_element`. A DTensor's
        whole value: its ``item()`` reads a partial one's local part (a sharded norm's)."""
        return (x.full_tensor() if hasattr(x, "full_tensor") else x).item()

    @staticmethod
    def add_(x: Tensor | Fresh | None, y: Tensor | Coef, alpha: Coef = 1) -> Tensor:
        if x is None:
            return torch.mul(y, alpha)
        if isinstance(x, Fresh):
            return torch.mul(y, alpha, out=x.memory)
        return x.add_(y, alpha=alpha)

    @staticmethod
    def addcdiv_(x: Tensor | Fresh | None, a: Tensor, b: Tensor, value: Coef = 1) -> Tensor:
        if x is None:  # (rounded as `Pure.addcdiv_`)
            return torch.div(a, b) if value == 1 else torch.mul(a, value).div_(b)
        if isinstance(x, Fresh):
            return torch.addcdiv(a.new_zeros(()), a, b, value=value, out=x.memory)
        return x.addcdiv_(a, b, value=value)

    @staticmethod
    def maximum_(x: Tensor, y: Tensor) -> Tensor:
        return torch.maximum(x, y, out=x)

    @staticmethod
    def decay_(out: Tensor | Fresh | None, p: Tensor, factor: Coef) -> Tensor:
        """Multiply the param by `factor` (decoupled weight decay): `out` is the param,
        or an update to it, which becomes ``(p + out) * factor - p``."""
        if out is None:
            return torch.mul(p, factor - 1)
        if isinstance(out, Fresh):
            return torch.mul(p, factor - 1, out=out.memory)
        if out is p:
            return out.mul_(factor)
        return out.mul_(factor).add_(p, alpha=factor - 1)


class TensorList(list[Tensor]):
    """The tensors `ForEach` ops take and return: a list that answers ``is_sparse`` as a
    dense tensor does, for the math's sparse-gradient checks."""

    is_sparse = False


def _foreach(op: Any) -> Any:
    """A ``torch._foreach_*`` op that makes new tensors, returning a `TensorList`."""
    return lambda *args, **kwargs: TensorList(op(*args, **kwargs))


class Borrowed(TensorList):
    """Buffers that `ForEach` ops only read: the first in-place op on them makes new
    tensors instead (its out-of-place form, the same values), which later ops update in
    place. The functional update's fresh buffers, with no copy of the old ones first."""


def _foreach_(op: Any, out_of_place: Any = None) -> Any:
    """A ``torch._foreach_*_`` op, returning its (updated) first argument; on `Borrowed`
    tensors, `out_of_place` (``torch._foreach_*``, found by name by default)."""
    new = out_of_place or getattr(torch, op.__name__.rstrip("_"))

    def apply(x: TensorList, *args: Any, **kwargs: Any) -> TensorList:
        if type(x) is Borrowed:
            return TensorList(new(x, *args, **kwargs))
        op(x, *args, **kwargs)
        return x

    return apply


def _each(op: Any) -> Any:
    """A per-tensor op on lists, one call per tensor where torch has no foreach op
    (comparisons, masked_fill): list arguments are taken element by element, others
    passed to every call. Returns a `TensorList` of the results."""

    def apply(x: TensorList, *args: Any) -> TensorList:
        return TensorList(op(t, *(a[i] if isinstance(a, list) else a for a in args)) for i, t in enumerate(x))

    return apply


def _clamp(clamp_min: Any, clamp_max: Any) -> Any:
    """``clamp(x, low, high)`` on lists, as two foreach ops (the same values: clamp is
    ``min(max(x, low), high)``)."""
    return lambda x, low, high: clamp_max(clamp_min(x, low), high)


_add_ = _foreach_(torch._foreach_add_)
_addcdiv_ = _foreach_(torch._foreach_addcdiv_)


class ForEach:
    """`InPlace` on lists of tensors: one ``torch._foreach_*`` call per op."""

    sign = staticmethod(_foreach(torch._foreach_sign))
    sign_ = staticmethod(_foreach_(torch._foreach_sign_))
    tanh = staticmethod(_foreach(torch._foreach_tanh))
    mul = staticmethod(_foreach(torch._foreach_mul))
    sub = staticmethod(_foreach(torch._foreach_sub))
    addcmul = staticmethod(_foreach(torch._foreach_addcmul))
    gt = staticmethod(_each(torch.gt))
    lt = staticmethod(_each(torch.lt))
    eq = staticmethod(_each(torch.eq))
    masked_fill = staticmethod(_each(torch.masked_fill))
    clamp_ = staticmethod(_clamp(_foreach_(torch._foreach_clamp_min_), _foreach_(torch._foreach_clamp_max_)))

    @staticmethod
    def masked_fill_(x: TensorList, mask: TensorList, value: Coef) -> TensorList:
        if type(x) is Borrowed:
            return _each(torch.masked_fill)(x, mask, value)
        return _each(Tensor.masked_fill_)(x, mask, value)

    @staticmethod
    def new_param(out: TensorList, p: TensorList) -> TensorList:
        """`InPlace.new_param` on lists."""
        return out if out is p else TensorList(torch._foreach_add(p, out))

    neg = staticmethod(_foreach(torch._foreach_neg))
    abs = staticmethod(_foreach(torch._foreach_abs))
    sqrt = staticmethod(_foreach(torch._foreach_sqrt))
    add = staticmethod(_foreach(torch._foreach_add))
    div = staticmethod(_foreach(torch._foreach_div))
    mul_ = staticmethod(_foreach_(torch._foreach_mul_))
    div_ = staticmethod(_foreach_(torch._foreach_div_))
    sqrt_ = staticmethod(_foreach_(torch._foreach_sqrt_))
    reciprocal_ = staticmethod(_foreach_(torch._foreach_reciprocal_))
    lerp_ = staticmethod(_foreach_(torch._foreach_lerp_))
    addcmul_ = staticmethod(_foreach_(torch._foreach_addcmul_))
    maximum_ = staticmethod(_foreach_(torch._foreach_maximum_))
    copy_ = staticmethod(_foreach_(torch._foreach_copy_, lambda x, y: [t.clone() for t in y]))
    clone = staticmethod(_each(torch.clone))
    lerp = staticmethod(_foreach(torch._foreach_lerp))
    where = staticmethod(_each(torch.where))
    item = staticmethod(_each(InPlace.item))

    @staticmethod
    def add_(x: TensorList | None, y: TensorList | Coef, alpha: Coef = 1) -> TensorList:
        if x is None:
            return TensorList(torch._foreach_mul(y, alpha))
        return _add_(x, y) if alpha == 1 else _add_(x, y, alpha=alpha)  # (no alpha for a number)

    @staticmethod
    def addcdiv_(x: TensorList | None, a: TensorList, b: TensorList, value: Coef = 1) -> TensorList:
        if x is None:
            return TensorList(torch._foreach_div(a if value == 1 else torch._foreach_mul(a, value), b))
        return _addcdiv_(x, a, b, value=value)

    @staticmethod
    def decay_(out: TensorList | None, p: TensorList, factor: Coef) -> TensorList:
        """`InPlace.decay_` on lists."""
        if out is None:
            return TensorList(torch._foreach_mul(p, factor - 1))
        out = ForEach.mul_(out, factor)
        if out is not p:
            torch._foreach_add_(out, p, alpha=factor - 1)
        return out


class _SqrtLists(torch.autograd.Function):
    """`safe_sqrt` on lists, for `PureForEach` (plain autograd only): one foreach op forward,
    and `sqrt_derivative` backward."""

    @staticmethod
    def forward(ctx: Any, *xs: Tensor) -> tuple[Tensor, ...]:
        roots = tuple(torch._foreach_sqrt(xs))
        ctx.save_for_backward(*roots)
        return roots

    @staticmethod
    def backward(ctx: Any, *grads: Tensor) -> tuple[Tensor, ...]:
        return tuple(map(sqrt_derivative, grads, ctx.saved_tensors))


def _sqrt_lists(xs: TensorList) -> TensorList:
    return TensorList(_SqrtLists.apply(*xs))


class PureForEach:
    """`Pure` on lists of tensors: one out-of-place ``torch._foreach_*`` call per op,
    which autograd records as one node for the whole group. For the functional update
    where autograd records (a MAML inner loop) and no torch.func transform runs; never
    for the adapters' differentiable step, which writes its results into its inputs.
    Coefficients are Python numbers."""

    sign = sign_ = staticmethod(_foreach(torch._foreach_sign))
    tanh = staticmethod(_foreach(torch._foreach_tanh))
    mul = staticmethod(_foreach(torch._foreach_mul))
    sub = staticmethod(_foreach(torch._foreach_sub))
    addcmul = staticmethod(_foreach(torch._foreach_addcmul))
    gt = staticmethod(_each(torch.gt))
    lt = staticmethod(_each(torch.lt))
    eq = staticmethod(_each(torch.eq))
    masked_fill = masked_fill_ = staticmethod(_each(torch.masked_fill))
    clamp_ = staticmethod(_clamp(_foreach(torch._foreach_clamp_min), _foreach(torch._foreach_clamp_max)))

    @staticmethod
    def copy_(x: TensorList, y: TensorList) -> TensorList:
        """`y` in place of the buffer `x` (`y` is a result of the math, never an input)."""
        return y

    @staticmethod
    def new_param(out: TensorList | None, p: TensorList) -> TensorList:
        """`Pure.new_param` on lists."""
        return p if out is None else TensorList(torch._foreach_add(p, out))

    neg = staticmethod(_foreach(torch._foreach_neg))
    abs = staticmethod(_foreach(torch._foreach_abs))
    sqrt = sqrt_ = staticmethod(_sqrt_lists)  # a derivative of 0 at 0 (see `safe_sqrt`)
    div = div_ = staticmethod(_foreach(torch._foreach_div))
    reciprocal_ = staticmethod(_foreach(torch._foreach_reciprocal))
    mul_ = staticmethod(_foreach(torch._foreach_mul))
    lerp_ = staticmethod(_foreach(torch._foreach_lerp))
    addcmul_ = staticmethod(_foreach(torch._foreach_addcmul))
    maximum_ = staticmethod(_foreach(torch._foreach_maximum))
    clone = staticmethod(_each(torch.clone))
    lerp = lerp_
    where = staticmethod(_each(lambda condition, x, y: Pure.where(condition, x, y)))  # Pure comes below
    item = staticmethod(_each(lambda x: Pure.item(x)))

    @staticmethod
    def add(x: TensorList, y: TensorList | Coef, alpha: Coef = 1) -> TensorList:
        if isinstance(y, list):
            return TensorList(torch._foreach_add(x, y, alpha=alpha))
        return TensorList(torch._foreach_add(x, y * alpha))  # a number: no alpha overload

    @staticmethod
    def add_(x: TensorList | None, y: TensorList | Coef, alpha: Coef = 1) -> TensorList:
        if x is None:
            return y if alpha == 1 else PureForEach.mul_(y, alpha)
        return PureForEach.add(x, y, alpha=alpha)

    @staticmethod
    def addcdiv_(x: TensorList | None, a: TensorList, b: TensorList, value: Coef = 1) -> TensorList:
        """As `Pure.addcdiv_`, and for ``x + value * a / b`` in ``torch.addcdiv``'s order of
        rounding: torch's backward of ``_foreach_addcdiv`` fails (2.13: "select(): index
        1 out of range") when a tensor's first dimension is shorter than its index."""
        if x is None:
            return PureForEach.div(a if value == 1 else PureForEach.mul_(a, value), b)
        return PureForEach.add(x, PureForEach.div(a if value == 1 else PureForEach.mul_(a, value), b))

    @staticmethod
    def decay_(out: TensorList | None, p: TensorList, factor: Coef) -> TensorList:
        """`Pure.decay_` on lists."""
        step = PureForEach.mul_(p, factor - 1)
        return step if out is None else PureForEach.add(PureForEach.mul_(out, factor), step)


def _cast(c: Coef, like: Tensor) -> Coef:
    """A tensor coefficient in `like`'s dtype (no type promotion); numbers as they are."""
    if isinstance(c, Tensor) and c.dtype != like.dtype:
        return c.to(like.dtype)
    return c


def _scale(x: Tensor, c: Coef) -> Tensor:
    if isinstance(c, Tensor):
        return x * _cast(c, x)
    return x if c == 1 else x * c


class Pure:
    """Returns new tensors and mutates nothing; coefficients may be 0-d tensors."""

    sign = sign_ = staticmethod(torch.sign)
    tanh = staticmethod(torch.tanh)
    sub = staticmethod(torch.sub)

    @staticmethod
    def mul(x: Tensor, y: Tensor | Coef) -> Tensor:
        return x * _cast(y, x)

    @staticmethod
    def addcmul(x: Tensor, a: Tensor, b: Tensor, value: Coef = 1) -> Tensor:
        return Pure.addcmul_(x, a, b, value)

    @staticmethod
    def gt(x: Tensor, c: Coef) -> Tensor:
        return torch.gt(x, _cast(c, x))  # compared in x's dtype, as torch compares a number

    @staticmethod
    def lt(x: Tensor, c: Coef) -> Tensor:
        return torch.lt(x, _cast(c, x))

    @staticmethod
    def eq(x: Tensor, c: Coef) -> Tensor:
        return torch.eq(x, _cast(c, x))

    @staticmethod
    def masked_fill(x: Tensor, mask: Tensor, value: Coef) -> Tensor:
        """``x`` with `value` where `mask` holds; a tensor `value` through ``torch.where``
        (``masked_fill`` has no batching rule for it)."""
        if isinstance(value, Tensor):
            return torch.where(mask, _cast(value, x), x)
        return torch.masked_fill(x, mask, value)

    masked_fill_ = masked_fill

    @staticmethod
    def clamp_(x: Tensor, low: Coef, high: Coef) -> Tensor:
        """``torch.clamp``; with a tensor bound, both as tensors of x's dtype (a tensor
        and a number together have no batching rule)."""
        if not isinstance(low, Tensor) and not isinstance(high, Tensor):
            return torch.clamp(x, low, high)

        def bound(c: Coef) -> Tensor:
            return _cast(c, x) if isinstance(c, Tensor) else torch.full((), c, dtype=x.dtype, device=x.device)

        return torch.clamp(x, bound(low), bound(high))

    @staticmethod
    def copy_(x: Tensor, y: Tensor) -> Tensor:
        """`y` in place of the buffer `x` (`y` is a result of the math, never an input)."""
        return y

    @staticmethod
    def new_param(out: Tensor | None, p: Tensor) -> Tensor:
        """The param after the update `out` (None: a zero update): ``p + out``, as
        ``apply_updates`` and the adapters' pure step compute it."""
        return p if out is None else p + out

    neg = staticmethod(torch.neg)
    abs = staticmethod(torch.abs)

    @staticmethod
    def sqrt(x: Tensor) -> Tensor:
        """``torch.sqrt``, with a derivative of 0 at 0 (`safe_sqrt`) where one may be
        taken (its guard costs three elementwise ops more)."""
        return safe_sqrt(x) if differentiable(x) else torch.sqrt(x)

    sqrt_ = sqrt
    reciprocal_ = staticmethod(torch.reciprocal)
    maximum_ = staticmethod(torch.maximum)
    clone = staticmethod(torch.clone)

    @staticmethod
    def item(x: Tensor) -> Tensor:
        """`InPlace.item` without reading the value on the host (traceable, batchable): a
        float64 0-d tensor, the precision of the Python number torch reads."""
        return x.to(torch.float64)

    @staticmethod
    def where(condition: Tensor, x: Tensor, y: Tensor | Coef) -> Tensor:
        """``torch.where``: the math's choice between two results where the condition
        is a tensor (RAdam's rectification, from a traced or batched step count), with
        no Python branch on a tensor's value."""
        return torch.where(condition, x, _cast(y, x))

    @staticmethod
    def add(x: Tensor, y: Tensor | Coef, alpha: Coef = 1) -> Tensor:
        y = _cast(y, x)
        # Under torch.compile, no ``alpha``: inductor (torch 2.13) fuses
        # ``add(mm(a, b), y, alpha=c)`` into ``addmm(y, a, b)``, dropping `c` (its
        # ``addmm`` pattern in fx_passes/post_grad.py; pytorch/pytorch#167313 and
        # #196577 report its other addmm patterns losing alpha), so a compiled step
        # that took a Linear layer's gradient and added weight decay got ``g + p``.
        # Inductor computes an ``alpha`` as this product anyway: same numerics.
        if isinstance(alpha, Tensor) or (alpha != 1 and torch.compiler.is_compiling()):
            return x + _scale(y, alpha)
        return torch.add(x, y, alpha=alpha)

    @staticmethod
    def add_(x: Tensor | None, y: Tensor | Coef, alpha: Coef = 1) -> Tensor:
        if x is None:
            return _scale(y, alpha)
        return Pure.add(x, y, alpha)

    @staticmethod
    def mul_(x: Tensor, c: Coef) -> Tensor:
        return x * _cast(c, x)

    @staticmethod
    def decay_(out: Tensor | None, p: Tensor, factor: Coef) -> Tensor:
        """Multiply the param by `factor`: as an update, ``(p + out) * factor - p``."""
        step = _scale(p, factor - 1)
        return step if out is None else _scale(out, factor) + step

    @staticmethod
    def div(x: Tensor, c: Tensor | Coef) -> Tensor:
        return x / _cast(c, x)

    div_ = div

    @staticmethod
    def lerp_(x: Tensor, y: Tensor, weight: Coef) -> Tensor:
        return torch.lerp(x, y, _cast(weight, x))

    lerp = lerp_

    @staticmethod
    def addcmul_(x: Tensor, a: Tensor, b: Tensor, value: Coef = 1) -> Tensor:
        if isinstance(value, Tensor):
            return x + _scale(a * b, value)
        return torch.addcmul(x, a, b, value=value)

    @staticmethod
    def addcdiv_(x: Tensor | None, a: Tensor, b: Tensor, value: Coef = 1) -> Tensor:
        """``x + value * a / b``, rounded as ``torch.addcdiv`` rounds it: ``(value * a) / b``
        (torch's kernel multiplies first), so that an update added to its param equals
        torch's ``param.addcdiv_`` bit for bit. In the ops of `PureForEach.addcdiv_`, not
        ``torch.addcdiv`` (the same values), whose backward rounds otherwise
        (``grad * (value / b)``): a leaf's gradients are then the same stepped alone or in
        a group (AdamW's addcdiv after its decay)."""
        if x is None:
            return _scale(a, value) / b
        return x + _scale(a, value) / b
