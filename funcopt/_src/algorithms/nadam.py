"""NAdam: Adam with Nesterov momentum and a momentum-decay schedule (``torch.optim.NAdam``).

.. math::
   \\mu_t = \\beta_1 (1 - \\tfrac12\\, 0.96^{t \\psi}), \\quad
   m_t = \\beta_1 m_{t-1} + (1 - \\beta_1) g_t, \\quad
   v_t = \\beta_2 v_{t-1} + (1 - \\beta_2) g_t^2

   \\theta_t = \\theta_{t-1} - \\gamma \\Big(
   \\frac{1 - \\mu_t}{1 - \\prod_{i \\le t} \\mu_i}\\, g_t
   + \\frac{\\mu_{t+1}}{1 - \\prod_{i \\le t+1} \\mu_i}\\, m_t \\Big)
   \\Big/ \\Big(\\sqrt{v_t / (1 - \\beta_2^t)} + \\epsilon\\Big)
"""

from __future__ import annotations

from typing import Any, NamedTuple

from torch import Tensor

from ..core.base import GradientTransformation, Params
from ..engine.algorithm import Algorithm
from ..engine.bounds import Bound
from ..engine.ops import Coef, Ops, counter_product, nonzero, power


class NAdamState(NamedTuple):
    """Per-param state (each field mirrors the params pytree), with torch's keys."""

    step: Params
    mu_product: Params
    exp_avg: Params
    exp_avg_sq: Params


def _initial(**_: Any) -> NAdamState:
    return NAdamState(step=0.0, mu_product=1.0, exp_avg=0.0, exp_avg_sq=0.0)


def _mu(beta1: Any, momentum_decay: Any, step: Any) -> Any:
    return beta1 * (1.0 - 0.5 * power(0.96, step * momentum_decay))


def _schedule(
    step: Coef,
    mu_product: Coef,
    *,
    lr: Coef,
    betas: tuple[Coef, Coef],
    momentum_decay: Coef,
    weight_decay: Coef,
    counter_dtypes: tuple[Any, Any],
    **_: Any,
) -> tuple[tuple[Coef, Coef], tuple[Coef, Coef, Coef, Coef]]:
    beta1, beta2 = betas
    step = step + 1
    mu = _mu(beta1, momentum_decay, step)
    mu_next = _mu(beta1, momentum_decay, step + 1)
    mu_product = counter_product(mu_product, mu, counter_dtypes[1])
    bias_correction2 = 1 - power(beta2, step)
    grad_coef = -lr * (1.0 - mu) / (1.0 - mu_product)
    avg_coef = -lr * mu_next / (1.0 - mu_product * mu_next)
    decay = 1 - lr * weight_decay  # for decoupled weight decay
    return (step, mu_product), (bias_correction2, grad_coef, avg_coef, decay)


def _elementwise(
    o: Ops,
    out: Tensor | None,
    p: Tensor,
    g: Tensor,
    exp_avg: Tensor,
    exp_avg_sq: Tensor,
    coefficients: tuple[Coef, Coef, Coef, Coef],
    *,
    betas: tuple[Coef, Coef],
    eps: Coef,
    weight_decay: Coef,
    decoupled_weight_decay: bool,
    maximize: bool,
    eps_root: Coef = 0.0,
    **_: Any,
) -> tuple[Tensor, tuple[Tensor, Tensor]]:
    bias_correction2, grad_coef, avg_coef, decay = coefficients
    beta1, beta2 = betas
    if maximize:
        g = o.neg(g)
    if nonzero(weight_decay):
        if decoupled_weight_decay:
            out = o.decay_(out, p, decay)
        else:
            g = o.add(g, p, alpha=weight_decay)
    exp_avg = o.lerp_(exp_avg, g, 1 - beta1)
    exp_avg_sq = o.addcmul_(o.mul_(exp_avg_sq, beta2), g, g, value=1 - beta2)
    v_hat = o.div(exp_avg_sq, bias_correction2)
    if nonzero(eps_root):
        v_hat = o.add_(v_hat, eps_root)
    denom = o.add_(o.sqrt_(v_hat), eps)
    out = o.addcdiv_(out, g, denom, value=grad_coef)
    out = o.addcdiv_(out, exp_avg, denom, value=avg_coef)
    return out, (exp_avg, exp_avg_sq)


NADAM = Algorithm(
    name="NAdam",
    state=NAdamState,
    counters=("step", "mu_product"),
    initial=_initial,
    schedule=_schedule,
    elementwise=_elementwise,
    bounds=(
        Bound("lr", "Invalid learning rate: {}"),
        Bound("eps", "Invalid epsilon value: {}"),
        Bound("betas", "Invalid beta parameter at index 0: {}", 0, high=1.0, inclusive=False),
        Bound("betas", "Invalid beta parameter at index 1: {}", 1, high=1.0, inclusive=False),
        Bound("weight_decay", "Invalid weight_decay value: {}"),
        Bound("momentum_decay", "Invalid momentum_decay value: {}"),
        Bound("eps_root", "Invalid eps_root value: {}"),
    ),
)


def nadam(
    lr: float | Tensor = 2e-3,
    betas: tuple[float | Tensor, float | Tensor] | Tensor = (0.9, 0.999),
    eps: float | Tensor = 1e-8,
    weight_decay: float | Tensor = 0.0,
    momentum_decay: float | Tensor = 4e-3,
    decoupled_weight_decay: bool = False,
    maximize: bool = False,
    *,
    eps_root: float | Tensor = 0.0,
) -> GradientTransformation:
    """NAdam as a pure transformation, with ``torch.optim.NAdam``'s arguments and defaults.

    Args:
        lr: learning rate.
        betas: decay rates of the first and second moment averages, or one tensor of the two.
        eps: added to the denominator for numerical stability.
        weight_decay: L2 penalty (or decoupled decay, see below).
        momentum_decay: the momentum schedule's decay :math:`\\psi`.
        decoupled_weight_decay: decay the params directly (as AdamW) instead of adding
            ``weight_decay * param`` to the gradient.
        maximize: maximize the objective instead of minimizing it.
        eps_root: added inside the square root, ``sqrt(v / (1 - beta2**t) + eps_root)``
            (funcopt only, as optax's; 0 is torch's rule). Not needed for finite
            meta-gradients: the functional step takes ``sqrt`` with derivative 0 at 0.

    Hyperparameters may be 0-d tensors, to differentiate or ``vmap`` over them.

    Example:
        >>> import torch, funcopt as fo
        >>> params = {"w": torch.tensor([1.0, -2.0])}
        >>> tx = fo.nadam(lr=0.1)
        >>> state = tx.init(params)
        >>> updates, state = tx.update({"w": torch.tensor([0.5, -0.5])}, state, params)
        >>> fo.apply_updates(params, updates)["w"]
        tensor([ 0.8944, -1.8944])
    """
    return NADAM.transform(
        lr=lr,
        betas=betas,
        eps=eps,
        weight_decay=weight_decay,
        momentum_decay=momentum_decay,
        decoupled_weight_decay=decoupled_weight_decay,
        maximize=maximize,
        eps_root=eps_root,
    )
