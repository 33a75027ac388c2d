"""Prodigy's and D-Adaptation AdamW's step, written once over the lists of the params.

Both estimate one step size ``d`` from sums over all params (an inner product and an
L1 norm), so their math is no per-tensor `fo.Algorithm`: it runs on whole lists. Each
function below is the method's whole step, against a namespace ``o`` of list ops:

- `IN_PLACE` (the drop-in classes ``fo.Prodigy``, ``fo.DAdaptAdamW``): the engine's
  `ForEach` ops (one ``torch._foreach_*`` call per op and part), which overwrite the
  buffers and the params (``out`` is the params); the sums are read on the host once
  per part, and the scalars are Python numbers (double precision, as the authors' code);
- `PURE` (the functional ``fo.prodigy``, ``fo.dadapt_adamw``): the engine's `Pure` ops
  leaf by leaf, which mutate nothing (``out`` is None: the update is made); the sums and
  scalars stay 0-d tensors, so the step runs under ``torch.func`` and ``torch.compile``.

A step takes the params in parts, each of one param group (`Group`: what the group sets
for itself), and sums over all of them, as the authors' packages sum over all param
groups: the classes' parts are bounded in size, so that the temporaries of a large
model's step are reused, not mapped anew from the OS each step; the functional's is
one. It returns each part's ``(out, *buffers)`` and the new ``(estim_lr,
numerator_weighted)``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch
from torch import Tensor

from ..engine.ops import ForEach, Ops, Pure, PureForEach, TensorList, nonzero

__all__ = ["IN_PLACE", "PURE", "Group", "ScratchLists", "dadapt_step", "prodigy_step"]

Coef = Any  # a Python number (IN_PLACE) or a 0-d tensor (PURE)


def _stacked(values: Sequence[Tensor]) -> Tensor:
    """The sum of 0-d tensors, in float64 (0 for none)."""
    return (
        torch.stack(list(values)).sum(dtype=torch.float64) if values else torch.zeros((), dtype=torch.float64)
    )


def _values(values: list[Tensor]) -> list[float]:
    """0-d tensors as Python numbers, read at once (each exactly)."""
    return torch.stack(values).tolist() if len(values) > 1 else [v.item() for v in values]


class InPlaceLists(ForEach):
    """`ForEach` with the sums over a group that Prodigy and D-Adaptation need."""

    @staticmethod
    def dots(pairs: Sequence[tuple[Sequence[Tensor], Sequence[Tensor]]]) -> tuple[float, ...]:
        """``sum_i <xs[i], ys[i]>`` of each pair of lists (real tensors), read on the host
        at once."""
        sums = [
            _stacked([torch.dot(x.reshape(-1), y.reshape(-1)) for x, y in zip(xs, ys)]) for xs, ys in pairs
        ]
        return tuple(torch.stack(sums).tolist())

    @staticmethod
    def add_dot(total: float, coef: float, xs: Sequence[Tensor], ys: Sequence[Tensor]) -> float:
        """`total` plus `coef` times each ``<xs[i], ys[i]>`` (real tensors), one by one
        in double precision, as the authors' packages add them up (their ``.item()``);
        the inner products read on the host at once."""
        for value in _values([torch.dot(x.reshape(-1), y.reshape(-1)) for x, y in zip(xs, ys)]):
            total += coef * value
        return total

    def add_l1(self, total: float, coef: float, xs: Sequence[Tensor]) -> float:
        """`total` plus `coef` times each ``|xs[i]|_1``, one by one, as `add_dot`."""
        for value in _values(self._abs_sums(xs)):
            total += coef * value
        return total

    def _abs_sums(self, xs: Sequence[Tensor]) -> list[Tensor]:
        return [x.abs().sum() for x in xs]  # (foreach_norm's ord 1: 2x slower on CPU)

    maximum = staticmethod(max)

    @staticmethod
    def sliced(xs: list[Tensor], k: int) -> list[Tensor]:
        """Every `k`-th element of each tensor, flattened (views where contiguous), as
        ``prodigyopt``'s ``slice_p`` takes them; the list itself for 1."""
        return xs if k == 1 else [x.reshape(-1)[::k] for x in xs]

    @staticmethod
    def no_sum(l1: float) -> bool:
        """Whether the L1 sum is 0 (no gradient yet, or every group at lr 0): the
        authors' step then leaves the params (and the estimate) as they are."""
        return l1 == 0


class ScratchLists(InPlaceLists):
    """`InPlaceLists` whose temporaries (``sub``, ``sqrt`` and the ``abs`` of ``l1``) over
    a list of one tensor (a param larger than a part of the classes' groups, which steps
    alone) are written into a buffer per dtype and device, kept from step to step: each
    drop-in class owns one. Its step then maps no new memory: on CPU, a temporary as
    large as a param, allocated anew, can come fresh from the OS (page faults: 1.5x
    ``prodigyopt``'s step on 24M float32 elements), depending on what else the process
    allocated. The parts of small params keep the foreach ops (a buffer's view per param
    costs more than their small temporaries). The values are those of the allocating
    ops, bit for bit. A result lives until the next call of one of these ops (the steps
    below use each before the next)."""

    def __init__(self) -> None:
        self.buffers: dict[tuple[torch.device, torch.dtype], Tensor] = {}
        self.views: dict[tuple[torch.device, torch.dtype, torch.Size], Tensor] = {}  # (slicing costs ~8 us)

    def _out(self, xs: Sequence[Tensor]) -> Tensor | None:
        """A view of the buffer of the shape of the one tensor in `xs`; None where `xs`
        holds several, or a non-contiguous one."""
        if len(xs) != 1 or not xs[0].is_contiguous():
            return None
        x = xs[0]
        key = (x.device, x.dtype, x.shape)
        view = self.views.get(key)
        if view is None:
            buffer = self.buffers.get(key[:2])
            if buffer is None or buffer.numel() < x.numel():
                buffer = self.buffers[key[:2]] = torch.empty(x.numel(), dtype=x.dtype, device=x.device)
                self.views = {
                    k: v for k, v in self.views.items() if k[:2] != key[:2]
                }  # (views of the old one)
            view = self.views[key] = buffer[: x.numel()].view(x.shape)
        return view

    def sub(self, xs: Sequence[Tensor], ys: Sequence[Tensor]) -> TensorList:
        """``xs - ys``."""
        out = self._out(xs)
        return ForEach.sub(xs, ys) if out is None else TensorList([torch.sub(xs[0], ys[0], out=out)])

    def sqrt(self, xs: Sequence[Tensor]) -> TensorList:
        """``sqrt(xs)``."""
        out = self._out(xs)
        return ForEach.sqrt(xs) if out is None else TensorList([torch.sqrt(xs[0], out=out)])

    def _abs_sums(self, xs: Sequence[Tensor]) -> list[Tensor]:
        out = self._out(xs)
        return super()._abs_sums(xs) if out is None else [torch.abs(xs[0], out=out).sum()]


def _mapped(op: Callable[..., Any]) -> Any:
    """`op` (a `Pure` op) applied leaf by leaf: list arguments are taken element by
    element, the others (coefficients, None for ``out``) passed to every call."""

    def apply(*args: Any, **kwargs: Any) -> list[Any]:
        n = next((len(a) for a in args if isinstance(a, list)), 0)
        return [op(*(a[i] if isinstance(a, list) else a for a in args), **kwargs) for i in range(n)]

    return staticmethod(apply)


def _tensor_sum(values: list[Tensor]) -> Tensor:
    total = values[0] if values else torch.zeros(())
    for v in values[1:]:
        total = total + v
    return total


class PureLists(PureForEach):
    """`Pure` on lists, leaf by leaf (coefficients may be 0-d tensors), with the sums as
    0-d tensors. The face of `PureForEach` (lists), but each op of the `Ops` protocol is
    `Pure`'s taken leaf by leaf (set below the class), not `PureForEach`'s foreach op,
    whose coefficients are numbers and whose ``sqrt`` no torch.func transform runs."""

    @staticmethod
    def _dot(xs: Sequence[Tensor], ys: Sequence[Tensor]) -> Tensor:
        return _tensor_sum([(x * y).sum() for x, y in zip(xs, ys)])

    @staticmethod
    def dots(pairs: Sequence[tuple[Sequence[Tensor], Sequence[Tensor]]]) -> tuple[Tensor, ...]:
        return tuple(PureLists._dot(xs, ys) for xs, ys in pairs)

    @staticmethod
    def add_dot(total: Coef, coef: Coef, xs: Sequence[Tensor], ys: Sequence[Tensor]) -> Tensor:
        return total + coef * PureLists._dot(xs, ys)

    @staticmethod
    def add_l1(total: Coef, coef: Coef, xs: Sequence[Tensor]) -> Tensor:
        return total + coef * _tensor_sum([x.abs().sum() for x in xs])

    @staticmethod
    def maximum(a: Tensor, b: Tensor) -> Tensor:
        return torch.maximum(a, b.to(a.dtype))

    @staticmethod
    def sliced(xs: list[Tensor], k: int) -> list[Tensor]:
        return xs if k == 1 else [x.reshape(-1)[::k] for x in xs]

    @staticmethod
    def no_sum(l1: Tensor) -> bool:
        """Never read (the step stays one graph): a 0 sum gives optax's nan or inf."""
        return False


for _name in (name for name in vars(Ops) if not name.startswith("_")):
    setattr(PureLists, _name, _mapped(getattr(Pure, _name)))

IN_PLACE = InPlaceLists()
PURE = PureLists()


def _bias_correction(betas: tuple[Coef, Coef], step: Coef, on: bool) -> Coef:
    """Adam's bias correction of the step size, ``sqrt(1 - b2^t) / (1 - b1^t)`` (or 1)."""
    return ((1 - betas[1] ** step) ** 0.5) / (1 - betas[0] ** step) if on else 1.0


class Group(NamedTuple):
    """What a param group sets for itself; the estimate ``d`` and the rest are shared
    by all groups (the authors' packages read them from the first group)."""

    eps: Coef
    weight_decay: Coef
    d0: Coef = 1.0  # Prodigy: the ratio d / d0 of this group's sums
    safeguard_warmup: bool = False  # Prodigy
    slice_p: int = 1  # Prodigy: its sums over every slice_p-th element of each param (flattened)
    layer_scale: Coef = 1.0  # D-Adaptation's per-group weight of the sums and the step
    active: bool = True  # lr > 0: a group at lr 0 adds nothing to the sums or its moments


Part = tuple[Any, ...]
"""A part of a group's params, stepped together: ``(group, out, params, grads, *buffers)``,
the group a `Group`, the others lists."""


def prodigy_step(
    o: Any, parts: list[Part], estim_lr: Coef, numerator_weighted: Coef, step: Coef, *, lr: Coef,
    betas: tuple[Coef, Coef], beta3: Coef | None, d_coef: Coef, bias_correction: bool,
    grad_step_at_beta1_0: bool = False, growth: tuple[float, float, float] | None = None,
) -> tuple[list[Part], tuple[Coef, Coef, Coef] | None]:  # fmt: skip
    """Prodigy's step (``prodigyopt``'s with ``decouple=True``; optax's ``prodigy`` with
    `bias_correction`) at `step` (from 1): ``d`` is `estim_lr`, each group's ``d0`` its
    first value in that group's ratio ``d / d0``. `parts` hold the buffers ``exp_avg,
    exp_avg_sq, grad_sum, params0`` (the last two of every ``slice_p``-th element of each
    param, flattened, where a group's ``slice_p`` is above 1); the moments of every part are taken before the new
    ``d`` steps any. Returns, per part, ``(out, *new buffers)``, and the new ``d``,
    ``numerator_weighted`` and ``d_max``; None for these where the sums are 0 read on
    the host (no gradient yet): the params are then not stepped, as in ``prodigyopt``.
    With `grad_step_at_beta1_0` and ``betas[0] = 0``, the params step along the gradient
    times the new ``d``, as ``prodigyopt``'s (optax's along its momentum, the old ``d``
    times the gradient). `growth` (Python numbers: `IN_PLACE` only) is ``(d_max,
    growth_rate, d0)``: ``d`` then grows by at most `growth_rate` a step towards the
    largest estimate yet, ``d_max``, except from its first value `d0`, as
    ``prodigyopt``'s ``growth_rate``; without it, ``d`` is the largest estimate yet (an
    infinite `growth_rate`)."""
    beta1, beta2 = betas
    b3 = beta2**0.5 if beta3 is None else beta3
    d = estim_lr
    dlr = d * lr * _bias_correction(betas, step, bias_correction)
    delta, l1, moved = 0.0, 0.0, []
    for group, out, ps, gs, exp_avg, exp_avg_sq, grad_sum, params0 in parts:
        if group.active:
            ratio = d / group.d0
            sliced_gs = o.sliced(gs, group.slice_p)  # (gs itself for slice_p 1)
            travelled = o.sub(params0, o.sliced(ps, group.slice_p))  # (the params not moved yet)
            delta = o.add_dot(delta, ratio * dlr, sliced_gs, travelled)
            del travelled
            exp_avg = o.add_(o.mul_(exp_avg, beta1), gs, alpha=d * (1 - beta1))
            exp_avg_sq = o.addcmul_(o.mul_(exp_avg_sq, beta2), gs, gs, value=d * d * (1 - beta2))
            alpha = ratio * (d if group.safeguard_warmup else dlr)
            grad_sum = o.add_(o.mul_(grad_sum, b3), sliced_gs, alpha=alpha)
            l1 = o.add_l1(l1, 1.0, grad_sum)
        moved.append((group, out, ps, gs, exp_avg, exp_avg_sq, grad_sum, params0))
    if o.no_sum(l1):
        return [(out, *buffers) for _, out, _, _, *buffers in moved], None
    numerator = b3 * numerator_weighted + delta
    d_hat = d_coef * numerator / l1
    if growth is None:
        new_d = d_max = o.maximum(d, d_hat)
    else:  # (prodigyopt's lines, as they are)
        d_max, growth_rate, d0 = growth
        new_d = max(d, d_hat) if d == d0 else d
        d_max = max(d_max, d_hat)
        new_d = min(d_max, new_d * growth_rate)
    stepped = []
    for group, out, ps, gs, exp_avg, exp_avg_sq, grad_sum, params0 in moved:
        denom = o.add_(o.sqrt(exp_avg_sq), new_d * group.eps)  # the new estimate scales eps
        if nonzero(group.weight_decay):
            out = o.add_(out, ps, alpha=-group.weight_decay * dlr)  # (the packages' p + (-wd * dlr) * p)
        if grad_step_at_beta1_0 and beta1 == 0:
            out = o.addcdiv_(out, gs, denom, value=-dlr * new_d)
        else:
            out = o.addcdiv_(out, exp_avg, denom, value=-dlr)
        del denom
        stepped.append((out, exp_avg, exp_avg_sq, grad_sum, params0))
    return stepped, (new_d, numerator, d_max)


def dadapt_step(
    o: Any, parts: list[Part], estim_lr: Coef, numerator_weighted: Coef, step: Coef, *, lr: Coef,
    betas: tuple[Coef, Coef], bias_correction: bool,
) -> tuple[list[Part], tuple[Coef, Coef] | None]:  # fmt: skip
    """D-Adaptation AdamW's step (``dadaptation.DAdaptAdam(decouple=True)``; optax's
    ``dadapt_adamw`` with `bias_correction`) at `step` (from 1), as `prodigy_step` (the
    buffers ``exp_avg, exp_avg_sq, grad_sum``; a group's ``layer_scale`` weighs its
    sums and its moment)."""
    beta1, beta2 = betas
    sb2 = beta2**0.5
    dlr = estim_lr * lr * _bias_correction(betas, step, bias_correction)
    acum, l1, moved = 0.0, 0.0, []
    for group, out, ps, gs, exp_avg, exp_avg_sq, grad_sum in parts:
        if group.active:
            r = group.layer_scale
            denom = o.add_(o.sqrt(exp_avg_sq), group.eps)  # the old moments
            acum = o.add_dot(acum, r * dlr, gs, o.div(grad_sum, denom))
            exp_avg = o.add_(o.mul_(exp_avg, beta1), gs, alpha=r * dlr * (1 - beta1))
            exp_avg_sq = o.addcmul_(o.mul_(exp_avg_sq, beta2), gs, gs, value=1 - beta2)
            grad_sum = o.add_(o.mul_(grad_sum, sb2), gs, alpha=dlr * (1 - sb2))
            l1 = o.add_l1(l1, r, grad_sum)
        moved.append((group, out, ps, exp_avg, exp_avg_sq, grad_sum))
    if o.no_sum(l1):
        return [(out, *buffers) for _, out, _, *buffers in moved], None
    numerator = sb2 * numerator_weighted + (1 - sb2) * acum
    new_d = o.maximum(estim_lr, numerator / ((1 - sb2) * l1))
    stepped = []
    for group, out, ps, exp_avg, exp_avg_sq, grad_sum in moved:
        if nonzero(group.weight_decay):
            out = o.add_(out, ps, alpha=-group.weight_decay * dlr)  # (the packages' p + (-wd * dlr) * p)
        out = o.addcdiv_(out, exp_avg, o.add_(o.sqrt(exp_avg_sq), group.eps), value=-1)
        stepped.append((out, exp_avg, exp_avg_sq, grad_sum))
    return stepped, (new_d, numerator)
