"""Adadelta (Zeiler, 2012), as ``torch.optim.Adadelta``.

.. math::
   v_t = \\rho v_{t-1} + (1 - \\rho) g_t^2, \\quad
   \\Delta x_t = \\frac{\\sqrt{u_{t-1} + \\epsilon}}{\\sqrt{v_t + \\epsilon}}\\, g_t, \\quad
   u_t = \\rho u_{t-1} + (1 - \\rho) \\Delta x_t^2, \\quad
   \\theta_t = \\theta_{t-1} - \\gamma \\Delta x_t
"""

from __future__ import annotations

from typing import Any, NamedTuple

from torch import Tensor

from ..core.base import GradientTransformation, Params
from ..engine.algorithm import Algorithm
from ..engine.bounds import Bound
from ..engine.ops import Coef, Ops, nonzero


class AdadeltaState(NamedTuple):
    """Per-param state (each field mirrors the params pytree), with torch's keys."""

    step: Params
    square_avg: Params
    acc_delta: Params


def _initial(**_: Any) -> AdadeltaState:
    return AdadeltaState(step=0.0, square_avg=0.0, acc_delta=0.0)


def _schedule(step: Coef, **_: Any) -> tuple[tuple[Coef], tuple[()]]:
    return (step + 1,), ()


def _elementwise(
    o: Ops,
    out: Tensor | None,
    p: Tensor,
    g: Tensor,
    square_avg: Tensor,
    acc_delta: Tensor,
    coefficients: tuple[()],
    *,
    lr: Coef,
    rho: Coef,
    eps: Coef,
    weight_decay: Coef,
    maximize: bool,
    **_: Any,
) -> tuple[Tensor, tuple[Tensor, Tensor]]:
    if maximize:
        g = o.neg(g)
    if nonzero(weight_decay):
        g = o.add(g, p, alpha=weight_decay)
    square_avg = o.addcmul_(o.mul_(square_avg, rho), g, g, value=1 - rho)
    std = o.sqrt_(o.add(square_avg, eps))
    delta = o.mul_(o.div_(o.sqrt_(o.add(acc_delta, eps)), std), g)
    acc_delta = o.addcmul_(o.mul_(acc_delta, rho), delta, delta, value=1 - rho)
    out = o.add_(out, delta, alpha=-lr)
    return out, (square_avg, acc_delta)


ADADELTA = Algorithm(
    name="Adadelta",
    state=AdadeltaState,
    counters=("step",),
    initial=_initial,
    schedule=_schedule,
    elementwise=_elementwise,
    bounds=(
        Bound("lr", "Invalid learning rate: {}"),
        Bound("rho", "Invalid rho value: {}", high=1.0),
        Bound("eps", "Invalid epsilon value: {}"),
        Bound("weight_decay", "Invalid weight_decay value: {}"),
    ),
)


def adadelta(
    lr: float | Tensor = 1.0,
    rho: float | Tensor = 0.9,
    eps: float | Tensor = 1e-6,
    weight_decay: float | Tensor = 0.0,
    maximize: bool = False,
) -> GradientTransformation:
    """Adadelta as a pure transformation, with ``torch.optim.Adadelta``'s arguments.

    Args:
        lr: coefficient that scales the delta before it is applied.
        rho: decay rate of the running averages of squared gradients and deltas.
        eps: added inside both square roots for numerical stability.
        weight_decay: L2 penalty, added to the gradient as ``weight_decay * param``.
        maximize: maximize the objective instead of minimizing it.

    Hyperparameters may be 0-d tensors, to differentiate or ``vmap`` over them.

    Example:
        >>> import torch, funcopt as fo
        >>> params = {"w": torch.tensor([1.0, -2.0])}
        >>> tx = fo.adadelta(lr=1.0)
        >>> state = tx.init(params)
        >>> updates, state = tx.update({"w": torch.tensor([0.5, -0.5])}, state, params)
        >>> updates["w"]
        tensor([-0.0032,  0.0032])
    """
    return ADADELTA.transform(lr=lr, rho=rho, eps=eps, weight_decay=weight_decay, maximize=maximize)
