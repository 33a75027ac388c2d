"""RAdam: Adam with a rectified adaptive learning rate (Liu et al., 2019), as
``torch.optim.RAdam``.

.. math::
   m_t = \\beta_1 m_{t-1} + (1 - \\beta_1) g_t, \\quad
   v_t = \\beta_2 v_{t-1} + (1 - \\beta_2) g_t^2, \\quad
   \\rho_\\infty = \\frac{2}{1 - \\beta_2} - 1, \\quad
   \\rho_t = \\rho_\\infty - \\frac{2 t \\beta_2^t}{1 - \\beta_2^t}

   \\theta_t = \\theta_{t-1} - \\gamma\\, \\frac{m_t}{1 - \\beta_1^t} \\cdot
   \\begin{cases} r_t\\, \\dfrac{\\sqrt{1 - \\beta_2^t}}{\\sqrt{v_t} + \\epsilon} & \\rho_t > 5 \\\\
   1 & \\text{otherwise} \\end{cases}, \\quad
   r_t = \\sqrt{\\frac{(\\rho_t - 4)(\\rho_t - 2)\\rho_\\infty}{(\\rho_\\infty - 4)(\\rho_\\infty - 2)\\rho_t}}

The rectification term and the choice of branch are per-step scalars, computed in the
schedule: in Python doubles where the step count is read (as torch's default step), or
with ``torch.where`` where it is a tensor (compiled, batched or differentiated), with
no branch on its value.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import Tensor

from ..core.base import GradientTransformation, Params
from ..engine.algorithm import Algorithm
from ..engine.bounds import Bound
from ..engine.ops import Coef, Ops, nonzero, power
from .adam import _second_moment as second_moment
from .adam import torch_step


class RAdamState(NamedTuple):
    """Per-param state (each field mirrors the params pytree), with torch's keys."""

    step: Params
    exp_avg: Params
    exp_avg_sq: Params


def _initial(**_: Any) -> RAdamState:
    return RAdamState(step=0.0, exp_avg=0.0, exp_avg_sq=0.0)


def _rect(rho_t: Coef, rho_inf: Coef) -> Coef:
    """The variance rectification term, in torch's operations."""
    return ((rho_t - 4) * (rho_t - 2) * rho_inf / ((rho_inf - 4) * (rho_inf - 2) * rho_t)) ** 0.5


def _schedule(
    step: Coef,
    *,
    lr: Coef,
    betas: tuple[Coef, Coef],
    weight_decay: Coef,
    counter_dtypes: tuple[Any],
    step_in_tensor: torch.dtype | None = None,
    threshold: Coef | None = None,
    nesterov: bool = False,
    **_: Any,
) -> tuple[tuple[Coef], tuple[Coef, ...]]:
    """RAdam's per-step scalars; funcopt only, as optax's ``scale_by_radam``: `threshold`
    (rectify where ``rho_t >= threshold``; None: torch's ``rho_t > 5``) and `nesterov`
    (Dozat's momentum: the two weights of the numerator, as Adam's schedule gives them)."""
    beta1, beta2 = betas
    step = step + 1
    # torch's capturable step computes from the step tensor, in its dtype (see `RAdam`)
    t = step if step_in_tensor is None else torch_step(step, counter_dtypes[0] or step_in_tensor)
    bias_correction1 = 1 - power(beta1, t)
    bias_correction2 = 1 - power(beta2, t)
    rho_inf = 2 / (1 - beta2) - 1  # the maximum length of the approximated SMA
    rho_t = rho_inf - 2 * t * power(beta2, t) / bias_correction2
    rectified = rho_t > 5.0 if threshold is None else rho_t >= threshold
    if isinstance(rectified, Tensor):
        # No branch on a tensor's value. Where rho_t <= 5 the term is unused, and may be
        # undefined (the root of a negative number; rho_inf is then at most 5, and 2 or
        # 4 divide by zero): it is computed from values where it is defined, so that its
        # gradient, which torch.where multiplies by zero there, is not NaN.
        def defined(x: Coef, fill: float) -> Coef:
            return torch.where(rectified, x, fill) if isinstance(x, Tensor) else x

        rect = _rect(defined(rho_t, 6.0), defined(rho_inf, 7.0))
    else:
        rect = _rect(rho_t, rho_inf) if rectified else 0.0
    decay = 1 - lr * weight_decay  # for decoupled weight decay
    coefficients = (bias_correction1, bias_correction2**0.5, rectified, rect, decay)
    if nesterov:  # b1 * m / (1 - b1**(t+1)) + (1 - b1) * g / (1 - b1**t)
        return (step,), (*coefficients, beta1 / (1 - power(beta1, t + 1)), (1 - beta1) / bias_correction1)
    return (step,), coefficients


def _elementwise(
    o: Ops,
    out: Tensor | None,
    p: Tensor,
    g: Tensor,
    exp_avg: Tensor,
    exp_avg_sq: Tensor,
    coefficients: tuple[Coef, ...],
    *,
    lr: Coef,
    betas: tuple[Coef, Coef],
    eps: Coef,
    weight_decay: Coef,
    decoupled_weight_decay: bool,
    maximize: bool,
    eps_root: Coef = 0.0,
    nesterov: bool = False,
    **_: Any,
) -> tuple[Tensor, tuple[Tensor, Tensor]]:
    """RAdam's step, also ``scale_by_radam``'s (catalogue/blocks.py), whose `nesterov`
    (optax's) takes Dozat's momentum with the schedule's two weights."""
    bias_correction1, bias_correction2_sqrt, rectified, rect, decay = coefficients[:5]
    beta1, beta2 = betas
    if maximize:
        g = o.neg(g)
    if nonzero(weight_decay):
        if decoupled_weight_decay:
            out = o.decay_(out, p, decay)
        else:
            g = o.add(g, p, alpha=weight_decay)
    exp_avg = o.lerp_(exp_avg, g, 1 - beta1)
    exp_avg_sq = second_moment(o, exp_avg_sq, g, beta2, False)
    if nesterov:
        momentum_weight, grad_weight = coefficients[5:]
        corrected = o.add_(o.mul(exp_avg, momentum_weight), o.mul(g, grad_weight))
    else:
        corrected = o.div(exp_avg, bias_correction1)
    step = o.mul_(corrected, lr)  # the bias-corrected average, times lr
    if isinstance(rectified, Tensor) or rectified:
        root = o.sqrt(exp_avg_sq) if not nonzero(eps_root) else o.sqrt_(o.add(exp_avg_sq, eps_root))
        adaptive = o.mul_(o.reciprocal_(o.add_(root, eps)), bias_correction2_sqrt)  # as torch's c / t
        if isinstance(rectified, Tensor):  # torch's capturable step: branch-free
            step = o.mul_(step, o.where(rectified, o.mul_(adaptive, rect), 1.0))
        else:
            step = o.mul_(o.mul_(step, adaptive), rect)
    out = o.add_(out, step, alpha=-1.0)
    return out, (exp_avg, exp_avg_sq)


RADAM = Algorithm(
    name="RAdam",
    state=RAdamState,
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
        Bound("eps_root", "Invalid eps_root value: {}"),
    ),
)


def radam(
    lr: float | Tensor = 1e-3,
    betas: tuple[float | Tensor, float | Tensor] | Tensor = (0.9, 0.999),
    eps: float | Tensor = 1e-8,
    weight_decay: float | Tensor = 0.0,
    decoupled_weight_decay: bool = False,
    *,
    maximize: bool = False,
    eps_root: float | Tensor = 0.0,
) -> GradientTransformation:
    """RAdam as a pure transformation, with ``torch.optim.RAdam``'s arguments and defaults.

    Args:
        lr: learning rate.
        betas: decay rates of the first and second moment averages, or one tensor of the two.
        eps: added to the denominator of the adaptive learning rate, after the square root.
        weight_decay: L2 penalty added to the gradient (or decoupled decay, see below).
        decoupled_weight_decay: multiply the params by ``1 - lr * weight_decay`` instead
            of adding ``weight_decay * param`` to the gradient.
        maximize: maximize the objective instead of minimizing it.
        eps_root: added inside the square root, ``sqrt(v + eps_root)`` (funcopt only; 0
            is torch's rule). Not needed for finite meta-gradients: the functional step
            takes ``sqrt`` with derivative 0 at 0.

    For the first steps (while :math:`\\rho_t \\le 5`; the first five with the default
    betas) the step is SGD with momentum, ``lr * exp_avg / (1 - beta1**t)``, as in torch.
    Hyperparameters may be 0-d tensors, to differentiate or ``vmap`` over them.

    Example:
        >>> import torch, funcopt as fo
        >>> params = {"w": torch.tensor([1.0, -2.0])}
        >>> tx = fo.radam(lr=0.1)
        >>> state = tx.init(params)
        >>> updates, state = tx.update({"w": torch.tensor([0.5, -0.5])}, state, params)
        >>> fo.apply_updates(params, updates)["w"]
        tensor([ 0.9500, -1.9500])
    """
    return RADAM.transform(
        lr=lr,
        betas=betas,
        eps=eps,
        weight_decay=weight_decay,
        decoupled_weight_decay=decoupled_weight_decay,
        maximize=maximize,
        eps_root=eps_root,
    )
