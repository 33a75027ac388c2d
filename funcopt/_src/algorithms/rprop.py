"""Rprop: resilient backpropagation (Riedmiller & Braun, 1993), as ``torch.optim.Rprop``.

Each element has its own step size :math:`\\eta`, starting at the learning rate:

.. math::
   \\eta_t = \\operatorname{clip}\\big(\\eta_{t-1} \\cdot
   \\begin{cases} \\eta_+ & g_{t-1} g_t > 0 \\\\ \\eta_- & g_{t-1} g_t < 0 \\\\ 1 & \\text{else}
   \\end{cases},\\ \\Gamma_{min}, \\Gamma_{max}\\big), \\quad
   \\theta_t = \\theta_{t-1} - \\eta_t \\operatorname{sign}(g_t)

where the sign of the gradient changed, the gradient counts as 0: that element does
not move, and ``prev`` (:math:`g_{t-1}` at the next step) is 0 there.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from torch import Tensor

from ..core.base import GradientTransformation, Params
from ..engine.algorithm import Algorithm
from ..engine.bounds import Bound, Check, Hyperparams, check_pair
from ..engine.ops import Coef, Ops


class RpropState(NamedTuple):
    """Per-param state (each field mirrors the params pytree), with torch's keys."""

    step: Params
    prev: Params
    step_size: Params


def _initial(*, lr: Coef, **_: Any) -> RpropState:
    return RpropState(step=0.0, prev=0.0, step_size=lr)  # each step size starts at lr


def _schedule(step: Coef, **_: Any) -> tuple[tuple[Coef], tuple[()]]:
    return (step + 1,), ()  # the step count is kept, and read by nothing


def _elementwise(
    o: Ops,
    out: Tensor | None,
    p: Tensor,
    g: Tensor,
    prev: Tensor,
    step_size: Tensor,
    coefficients: tuple[()],
    *,
    etas: tuple[Coef, Coef],
    step_sizes: tuple[Coef, Coef],
    maximize: bool,
    **_: Any,
) -> tuple[Tensor, tuple[Tensor, Tensor]]:
    etaminus, etaplus = etas
    step_size_min, step_size_max = step_sizes
    if maximize:
        g = o.neg(g)
    # each element's factor, replacing the sign of g * prev in torch's order (NaN stays)
    factor = o.sign_(o.mul(g, prev))
    factor = o.masked_fill_(factor, o.gt(factor, 0), etaplus)
    factor = o.masked_fill_(factor, o.lt(factor, 0), etaminus)
    factor = o.masked_fill_(factor, o.eq(factor, 0), 1)
    step_size = o.clamp_(o.mul_(step_size, factor), step_size_min, step_size_max)
    g = o.masked_fill(g, o.eq(factor, etaminus), 0)  # where the sign changed
    out = o.add_(out, o.mul(o.sign(g), step_size), alpha=-1)
    prev = o.copy_(prev, g)
    return out, (prev, step_size)


def _validate(hp: Hyperparams) -> None:
    etas = hp.get("etas", (0.5, 1.2))
    check_pair("etas", etas)
    check_pair("step_sizes", hp.get("step_sizes", (1e-6, 50)))
    etaminus, etaplus = etas
    if not isinstance(etaminus, Tensor) and not isinstance(etaplus, Tensor):
        if not 0.0 < etaminus < 1.0 < etaplus:
            raise ValueError(f"Invalid eta values: {etaminus}, {etaplus}")


RPROP = Algorithm(
    name="Rprop",
    state=RpropState,
    counters=("step",),
    initial=_initial,
    schedule=_schedule,
    elementwise=_elementwise,
    bounds=(Bound("lr", "Invalid learning rate: {}"), Check(_validate, pairs=("etas", "step_sizes"))),
)


def rprop(
    lr: float | Tensor = 1e-2,
    etas: tuple[float | Tensor, float | Tensor] | Tensor = (0.5, 1.2),
    step_sizes: tuple[float | Tensor, float | Tensor] | Tensor = (1e-6, 50),
    *,
    maximize: bool = False,
) -> GradientTransformation:
    """Rprop as a pure transformation, with ``torch.optim.Rprop``'s arguments and defaults.

    Args:
        lr: the initial step size of every element (``init`` reads it; later updates
            do not, as in torch).
        etas: ``(etaminus, etaplus)``, the factors of an element's step size where its
            gradient changed sign, and where it kept it (``0 < etaminus < 1 < etaplus``),
            or one tensor of the two.
        step_sizes: the least and the greatest step size, or one tensor of the two.
        maximize: maximize the objective instead of minimizing it.

    Hyperparameters may be 0-d tensors, to differentiate or ``vmap`` over them.

    Example:
        >>> import torch, funcopt as fo
        >>> params = {"w": torch.tensor([1.0, -2.0])}
        >>> tx = fo.rprop(lr=0.1)
        >>> state = tx.init(params)
        >>> for g in ([0.5, -0.5], [0.5, 0.5]):
        ...     updates, state = tx.update({"w": torch.tensor(g)}, state, params)
        ...     params = fo.apply_updates(params, updates)
        >>> params["w"], state.step_size["w"]
        (tensor([ 0.7800, -1.9000]), tensor([0.1200, 0.0500]))
    """
    return RPROP.transform(lr=lr, etas=etas, step_sizes=step_sizes, maximize=maximize)
