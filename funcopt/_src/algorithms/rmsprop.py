"""RMSprop (Hinton's lecture notes), centered as in Graves (2013), as ``torch.optim.RMSprop``.

.. math::
   v_t = \\alpha v_{t-1} + (1 - \\alpha) g_t^2, \\quad
   \\bar g_t = \\alpha \\bar g_{t-1} + (1 - \\alpha) g_t \\text{ (centered)}, \\quad
   d_t = \\sqrt{v_t - \\bar g_t^2} + \\epsilon

   b_t = \\mu b_{t-1} + g_t / d_t \\text{ (momentum)}, \\quad
   \\theta_t = \\theta_{t-1} - \\gamma\\, b_t \\text{ (or } \\gamma\\, g_t / d_t \\text{ without momentum)}

torch's state keys: ``momentum_buffer`` exists only with a momentum, ``grad_avg`` only
when centered.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from torch import Tensor

from ..core.base import GradientTransformation, Params
from ..engine.algorithm import Algorithm
from ..engine.bounds import Bound
from ..engine.ops import Coef, Ops, nonzero


class RMSpropState(NamedTuple):
    """Per-param state with torch's keys (each field mirrors the params pytree; an absent
    buffer is an empty node)."""

    step: Params
    square_avg: Params
    momentum_buffer: Params
    grad_avg: Params


def _initial(*, momentum: Coef = 0.0, centered: bool = False, **_: Any) -> RMSpropState:
    # torch creates the optional buffers with the rest (zeros), for these options only
    return RMSpropState(
        step=0.0,
        square_avg=0.0,
        momentum_buffer=0.0 if nonzero(momentum) else None,
        grad_avg=0.0 if centered else None,
    )


def _schedule(step: Coef, *, lr: Coef, **_: Any) -> tuple[tuple[Coef], tuple[Coef]]:
    return (step + 1,), (lr,)  # the step count is kept, and read by nothing


def _elementwise(
    o: Ops,
    out: Tensor | None,
    p: Tensor,
    g: Tensor,
    square_avg: Tensor,
    momentum_buffer: Tensor | None,
    grad_avg: Tensor | None,
    coefficients: tuple[Coef],
    *,
    alpha: Coef,
    eps: Coef,
    weight_decay: Coef,
    momentum: Coef,
    centered: bool,
    maximize: bool,
    **_: Any,
) -> tuple[Tensor, tuple[Tensor, Tensor | None, Tensor | None]]:
    (lr,) = coefficients
    if maximize:
        g = o.neg(g)
    if nonzero(weight_decay):
        g = o.add(g, p, alpha=weight_decay)
    square_avg = o.addcmul_(o.mul_(square_avg, alpha), g, g, value=1 - alpha)
    if centered:
        grad_avg = o.lerp_(grad_avg, g, 1 - alpha)
        avg = o.sqrt_(o.addcmul(square_avg, grad_avg, grad_avg, value=-1))
    else:
        avg = o.sqrt(square_avg)
    avg = o.add_(avg, eps)
    if nonzero(momentum):
        momentum_buffer = o.addcdiv_(o.mul_(momentum_buffer, momentum), g, avg)
        out = o.add_(out, momentum_buffer, alpha=-lr)
    else:
        out = o.addcdiv_(out, g, avg, value=-lr)
    return out, (square_avg, momentum_buffer, grad_avg)


RMSPROP = Algorithm(
    name="RMSprop",
    state=RMSpropState,
    counters=("step",),
    initial=_initial,
    schedule=_schedule,
    elementwise=_elementwise,
    bounds=(
        Bound("lr", "Invalid learning rate: {}"),
        Bound("eps", "Invalid epsilon value: {}"),
        Bound("momentum", "Invalid momentum value: {}"),
        Bound("weight_decay", "Invalid weight_decay value: {}"),
        Bound("alpha", "Invalid alpha value: {}"),
    ),
)


def rmsprop(
    lr: float | Tensor = 1e-2,
    alpha: float | Tensor = 0.99,
    eps: float | Tensor = 1e-8,
    weight_decay: float | Tensor = 0.0,
    momentum: float | Tensor = 0.0,
    centered: bool = False,
    maximize: bool = False,
) -> GradientTransformation:
    """RMSprop as a pure transformation, with ``torch.optim.RMSprop``'s arguments and defaults.

    Args:
        lr: learning rate.
        alpha: smoothing constant of the averages.
        eps: added to the denominator (after the square root).
        weight_decay: L2 penalty, added to the gradient as ``weight_decay * param``.
        momentum: momentum factor (0: no ``momentum_buffer``).
        centered: divide by an estimate of the gradient's variance (keeps ``grad_avg``,
            the average gradient) rather than of its second moment.
        maximize: maximize the objective instead of minimizing it.

    Hyperparameters may be 0-d tensors, to differentiate or ``vmap`` over them; a
    momentum given as a tensor keeps a ``momentum_buffer``, whatever its value. Where
    torch has no ``momentum_buffer`` or ``grad_avg``, the state holds an empty node.

    Example:
        >>> import torch, funcopt as fo
        >>> params = {"w": torch.tensor([1.0, -2.0])}
        >>> tx = fo.rmsprop(lr=0.01, momentum=0.9)
        >>> state = tx.init(params)
        >>> updates, state = tx.update({"w": torch.tensor([0.5, -0.5])}, state, params)
        >>> fo.apply_updates(params, updates)["w"], state.square_avg["w"]
        (tensor([ 0.9000, -1.9000]), tensor([0.0025, 0.0025]))
    """
    return RMSPROP.transform(
        lr=lr,
        alpha=alpha,
        eps=eps,
        weight_decay=weight_decay,
        momentum=momentum,
        centered=centered,
        maximize=maximize,
    )
