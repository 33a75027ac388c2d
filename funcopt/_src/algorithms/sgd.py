"""SGD with momentum, dampening and Nesterov momentum (``torch.optim.SGD``).

.. math::
   g_t \\leftarrow g_t + \\lambda \\theta_{t-1}, \\quad
   b_t = \\begin{cases} g_t & t = 1 \\\\ \\mu b_{t-1} + (1 - \\tau) g_t & t > 1 \\end{cases}, \\quad
   \\theta_t = \\theta_{t-1} - \\gamma \\,(g_t + \\mu b_t \\text{ if Nesterov, else } b_t)

The momentum buffer is torch's ``momentum_buffer``: absent without momentum, and a copy
of the first gradient at the first step (so dampening starts at the second). A functional
state holds it from init, as zeros: the first step from zeros, ``momentum * 0 + g``, is
that copy exactly when that step's dampening is 0, which `_FromSecondStep` makes it.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from torch import Tensor

from ..core.base import GradientTransformation, Params
from ..core.hyperparams import with_schedules
from ..engine.algorithm import Algorithm
from ..engine.bounds import Bound, Check, Hyperparams
from ..engine.leaves import AtFirstStep
from ..engine.ops import Coef, Ops, nonzero


class SGDState(NamedTuple):
    """Per-param state with torch's key: the momentum buffer (an empty node without
    momentum)."""

    momentum_buffer: Params


def _initial(*, momentum: Coef = 0.0, **_: Any) -> SGDState:
    """torch makes the momentum buffer at the first step, a copy of the gradient. A
    functional state holds it from init, as zeros, so that its structure never changes
    (`DampedFromSecondStep` makes the first step's dampening 0, so that the step from zeros is that copy)."""
    return SGDState(momentum_buffer=AtFirstStep(0.0) if nonzero(momentum) else None)


@dataclass(frozen=True)
class _FromSecondStep:
    """A dampening (a number, tensor or schedule) as a schedule that is 0 at the first
    step, which torch's first step skips: from a zero buffer, ``momentum * 0 + g`` is
    then torch's copy of the gradient, bit for bit."""

    dampening: Any

    def __call__(self, count: int | Tensor) -> Any:
        value = self.dampening(count) if callable(self.dampening) else self.dampening
        if isinstance(count, int):  # an eager count: Python numbers, as torch's
            return value if count > 0 else 0.0
        value = torch.as_tensor(value, dtype=value.dtype if isinstance(value, Tensor) else torch.float64)
        return torch.where(count > 0, value, torch.zeros((), dtype=value.dtype, device=value.device))


class DampedFromSecondStep(Algorithm):
    """An algorithm with torch's SGD momentum buffer (SGD's, Lars's): made at the first
    step as a copy of the gradient, dampened from the second. Its functional
    transformation counts its steps where it has momentum and a dampening that may be
    nonzero (see `_FromSecondStep`)."""

    def __call__(self, **hyperparams: Any) -> GradientTransformation:
        momentum, dampening = hyperparams.get("momentum", 0.0), hyperparams.get("dampening", 0.0)
        if not nonzero(momentum) or (
            not callable(dampening) and not isinstance(dampening, Tensor) and dampening == 0
        ):
            return super().__call__(**hyperparams)
        hyperparams["dampening"] = _FromSecondStep(dampening)
        return with_schedules(functools.partial(Algorithm.__call__, self), hyperparams)


def _creates(*, momentum: Coef = 0.0, **_: Any) -> tuple[str, ...]:
    """What pickles made before the algorithms pickled by name refer to (kept for those)."""
    return ("momentum_buffer",) if nonzero(momentum) else ()


def _schedule(*, lr: Coef, **_: Any) -> tuple[tuple[()], tuple[Coef]]:
    return (), (lr,)


def momentum_step(
    o: Ops,
    g: Tensor,
    momentum_buffer: Tensor | None,
    momentum: Coef,
    dampening: Coef,
    nesterov: bool,
    *,
    fused_nesterov: bool = True,
) -> tuple[Tensor, Tensor]:
    """torch's SGD momentum (SGD's, Lars's), also optax's ``trace`` (transforms/moments.py,
    with no dampening): the direction to step along and the new buffer, which the first
    step makes a copy of the gradient (absent: the torch class's first step). The
    Nesterov direction ``g + momentum * buffer`` is torch's add with ``alpha``, or without
    `fused_nesterov` a product then a sum, optax's, which rounds alike wherever an element
    falls (torch's CPU add with ``alpha`` does not in bfloat16 and float16: see
    ``transforms.blocks.FUSED_ADD``)."""
    if momentum_buffer is None:
        momentum_buffer = o.clone(g)
    else:
        momentum_buffer = o.add_(o.mul_(momentum_buffer, momentum), g, alpha=1 - dampening)
    if not nesterov:
        return momentum_buffer, momentum_buffer
    if fused_nesterov:
        return o.add(g, momentum_buffer, alpha=momentum), momentum_buffer
    return o.add_(o.mul(momentum_buffer, momentum), g), momentum_buffer


def _elementwise(
    o: Ops,
    out: Tensor | None,
    p: Tensor,
    g: Tensor,
    momentum_buffer: Tensor | None,
    coefficients: tuple[Coef],
    *,
    momentum: Coef,
    dampening: Coef,
    weight_decay: Coef,
    nesterov: bool,
    maximize: bool,
    **_: Any,
) -> tuple[Tensor, tuple[Tensor | None]]:
    (lr,) = coefficients
    if maximize:
        g = o.neg(g)
    if nonzero(weight_decay):
        g = o.add(g, p, alpha=weight_decay)
    if nonzero(momentum):
        g, momentum_buffer = momentum_step(o, g, momentum_buffer, momentum, dampening, nesterov)
    out = o.add_(out, g, alpha=-lr)
    return out, (momentum_buffer,)


def _validate(hp: Hyperparams) -> None:
    momentum, dampening = hp.get("momentum", 0), hp.get("dampening", 0)
    if hp.get("nesterov") and not isinstance(momentum, Tensor) and not isinstance(dampening, Tensor):
        if momentum <= 0 or dampening != 0:
            raise ValueError("Nesterov momentum requires a momentum and zero dampening")


SGD_ = DampedFromSecondStep(
    name="SGD",
    state=SGDState,
    counters=(),
    initial=_initial,
    schedule=_schedule,
    elementwise=_elementwise,
    bounds=(
        Bound("lr", "Invalid learning rate: {}", nan_passes=True),
        Bound("momentum", "Invalid momentum value: {}", nan_passes=True),
        Bound("weight_decay", "Invalid weight_decay value: {}", nan_passes=True),
        Check(_validate),  # the Nesterov rule
    ),
    sparse=True,
)


def sgd(
    lr: float | Tensor = 1e-3,
    momentum: float | Tensor = 0.0,
    dampening: float | Tensor = 0.0,
    weight_decay: float | Tensor = 0.0,
    nesterov: bool = False,
    *,
    maximize: bool = False,
) -> GradientTransformation:
    """SGD as a pure transformation, with ``torch.optim.SGD``'s arguments and defaults.

    Args:
        lr: learning rate.
        momentum: momentum factor (0: no momentum buffer).
        dampening: dampening of the momentum (from the second step on, as in torch).
        weight_decay: L2 penalty, added to the gradient.
        nesterov: Nesterov momentum (needs a momentum and zero dampening).
        maximize: maximize the objective instead of minimizing it.

    With momentum, the state holds ``momentum_buffer`` from init on, as zeros, so that its
    structure never changes (one compiled graph for every step); the first update makes
    it a copy of the gradient, as torch's first step does. With a dampening, which that
    first step skips, the state also counts the steps (a ``ScheduledState`` around the
    ``SGDState``).

    Example:
        >>> import torch, funcopt as fo
        >>> params = {"w": torch.tensor([1.0, -2.0])}
        >>> tx = fo.sgd(lr=0.1, momentum=0.9)
        >>> state = tx.init(params)
        >>> updates, state = tx.update({"w": torch.tensor([0.5, -0.5])}, state, params)
        >>> fo.apply_updates(params, updates)["w"], state.momentum_buffer["w"]
        (tensor([ 0.9500, -1.9500]), tensor([ 0.5000, -0.5000]))
    """
    return SGD_.transform(
        lr=lr,
        momentum=momentum,
        dampening=dampening,
        weight_decay=weight_decay,
        nesterov=nesterov,
        maximize=maximize,
    )
