"""Adamax: Adam with an infinity norm (Kingma & Ba, 2014), as ``torch.optim.Adamax``.

.. math::
   m_t = \\beta_1 m_{t-1} + (1 - \\beta_1) g_t, \\quad
   u_t = \\max(\\beta_2 u_{t-1}, |g_t| + \\epsilon), \\quad
   \\theta_t = \\theta_{t-1} - \\frac{\\gamma}{1 - \\beta_1^t} \\frac{m_t}{u_t}
"""

from __future__ import annotations

from typing import Any, NamedTuple

from torch import Tensor

from ..core.base import GradientTransformation, Params
from ..engine.algorithm import Algorithm
from ..engine.bounds import Bound
from ..engine.ops import Coef, Ops, nonzero, power


class AdamaxState(NamedTuple):
    """Per-param state (each field mirrors the params pytree), with torch's keys."""

    step: Params
    exp_avg: Params
    exp_inf: Params


def _initial(**_: Any) -> AdamaxState:
    return AdamaxState(step=0.0, exp_avg=0.0, exp_inf=0.0)


def _schedule(step: Coef, *, lr: Coef, betas: tuple[Coef, Coef], **_: Any) -> tuple[tuple[Coef], tuple[Coef]]:
    step = step + 1
    return (step,), (lr / (1 - power(betas[0], step)),)


def _elementwise(
    o: Ops,
    out: Tensor | None,
    p: Tensor,
    g: Tensor,
    exp_avg: Tensor,
    exp_inf: Tensor,
    coefficients: tuple[Coef],
    *,
    betas: tuple[Coef, Coef],
    eps: Coef,
    weight_decay: Coef,
    maximize: bool,
    **_: Any,
) -> tuple[Tensor, tuple[Tensor, Tensor]]:
    """Adamax's step, also ``scale_by_adamax``'s (catalogue/blocks.py)."""
    (clr,) = coefficients
    beta1, beta2 = betas
    if maximize:
        g = o.neg(g)
    if nonzero(weight_decay):
        g = o.add(g, p, alpha=weight_decay)
    exp_avg = o.lerp_(exp_avg, g, 1 - beta1)
    exp_inf = o.maximum_(o.mul_(exp_inf, beta2), o.add_(o.abs(g), eps))
    out = o.addcdiv_(out, exp_avg, exp_inf, value=-clr)
    return out, (exp_avg, exp_inf)


ADAMAX = Algorithm(
    name="Adamax",
    state=AdamaxState,
    counters=("step",),
    initial=_initial,
    schedule=_schedule,
    elementwise=_elementwise,
    bounds=(
        Bound("lr", "Invalid learning rate: {}"),
        Bound("eps", "Invalid epsilon value: {}"),
        Bound("betas", "Invalid beta parameter at index 0: {}", 0, high=1.0, inclusive=False),
        Bound("betas", "Invalid beta parameter at index 1: {}", 1, high=1.0, inclusive=False),
        Bound("weight_decay", "Invalid weight_decay value: {}"),
    ),
)


def adamax(
    lr: float | Tensor = 2e-3,
    betas: tuple[float | Tensor, float | Tensor] | Tensor = (0.9, 0.999),
    eps: float | Tensor = 1e-8,
    weight_decay: float | Tensor = 0.0,
    maximize: bool = False,
) -> GradientTransformation:
    """Adamax as a pure transformation, with ``torch.optim.Adamax``'s arguments.

    Args:
        lr: learning rate.
        betas: decay rates of the first moment and of the infinity norm, or one tensor of the two.
        eps: added to ``|g|`` inside the max, for numerical stability.
        weight_decay: L2 penalty, added to the gradient as ``weight_decay * param``.
        maximize: maximize the objective instead of minimizing it.

    Hyperparameters may be 0-d tensors, to differentiate or ``vmap`` over them.

    Example:
        >>> import torch, funcopt as fo
        >>> params = {"w": torch.tensor([1.0, -2.0])}
        >>> tx = fo.adamax(lr=0.1)
        >>> state = tx.init(params)
        >>> updates, state = tx.update({"w": torch.tensor([0.5, -0.5])}, state, params)
        >>> fo.apply_updates(params, updates)["w"]
        tensor([ 0.9000, -1.9000])
    """
    return ADAMAX.transform(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, maximize=maximize)
