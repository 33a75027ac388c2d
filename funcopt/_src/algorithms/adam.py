"""Adam (Kingma and Ba, 2014) and AdamW (Loshchilov and Hutter, 2017), as
``torch.optim.Adam`` and ``torch.optim.AdamW``.

.. math::
   m_t = \\beta_1 m_{t-1} + (1 - \\beta_1) g_t, \\quad
   v_t = \\beta_2 v_{t-1} + (1 - \\beta_2) g_t^2, \\quad
   \\theta_t = \\theta_{t-1} - \\frac{\\gamma}{1 - \\beta_1^t}\\,
   \\frac{m_t}{\\sqrt{v_t} / \\sqrt{1 - \\beta_2^t} + \\epsilon}

AdamW is the same math with decoupled weight decay (the params are multiplied by
``1 - lr * weight_decay`` before the step), as torch 2.13's ``AdamW`` is ``Adam`` with
``decoupled_weight_decay=True``. With ``amsgrad`` the denominator uses the running
maximum of :math:`v_t`, torch's ``max_exp_avg_sq`` (absent without amsgrad).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import Tensor

from ..core.base import GradientTransformation, Params
from ..engine.algorithm import Algorithm
from ..engine.bounds import Bound
from ..engine.ops import Coef, Ops, nonzero, power


class AdamState(NamedTuple):
    """Per-param state (each field mirrors the params pytree), with torch's keys;
    ``max_exp_avg_sq`` is an empty node without ``amsgrad``, where torch has no such key."""

    step: Params
    exp_avg: Params
    exp_avg_sq: Params
    max_exp_avg_sq: Params


class AdamWState(NamedTuple):
    """AdamW's per-param state: `AdamState`'s fields (torch's keys)."""

    step: Params
    exp_avg: Params
    exp_avg_sq: Params
    max_exp_avg_sq: Params


def _initial(*, amsgrad: bool = False, **_: Any) -> tuple[Any, ...]:
    return (0.0, 0.0, 0.0, 0.0 if amsgrad else None)  # step, exp_avg, exp_avg_sq, max_exp_avg_sq


def torch_step(step: Coef, dtype: torch.dtype) -> Tensor:
    """The step count as torch's capturable (and Adam's differentiable) step reads it: a
    tensor of the counter's `dtype`, in which the per-step scalars then round."""
    return step.to(dtype) if isinstance(step, Tensor) else torch.tensor(step, dtype=dtype)


def _schedule(
    step: Coef,
    *,
    lr: Coef,
    betas: tuple[Coef, Coef],
    weight_decay: Coef,
    counter_dtypes: tuple[Any],
    step_in_tensor: torch.dtype | None = None,
    nesterov: bool = False,
    **_: Any,
) -> tuple[tuple[Coef], tuple[Coef, ...]]:
    beta1, beta2 = betas
    step = step + 1
    if step_in_tensor is not None:
        # torch's differentiable and capturable steps compute from the step tensor, in
        # its dtype (float32 by default, also for float64 params): see `Adam`
        t = torch_step(step, counter_dtypes[0] or step_in_tensor)
        bias_correction1 = 1 - beta1**t
        bias_correction2 = 1 - beta2**t
        bias_correction2_sqrt = bias_correction2.sqrt()
    else:  # torch's default step, in its operations (Python doubles for a float step)
        bias_correction1 = 1 - power(beta1, step)
        bias_correction2 = 1 - power(beta2, step)
        bias_correction2_sqrt = bias_correction2**0.5
    decay = 1 - lr * weight_decay  # for decoupled weight decay
    if nesterov:  # Dozat 2016, as optax: b1 * m / (1 - b1**(t+1)) + (1 - b1) * g / (1 - b1**t)
        momentum_weight = beta1 / (1 - power(beta1, step + 1))
        grad_weight = (1 - beta1) / bias_correction1
        return (step,), (-lr, bias_correction2_sqrt, bias_correction2, decay, momentum_weight, grad_weight)
    step_size = lr / bias_correction1
    return (step,), (-step_size, bias_correction2_sqrt, bias_correction2, decay)


def _complement(beta: Coef, like: Any) -> Coef:
    """``1 - beta`` with `beta` rounded to the dtype of `like` (a tensor, or a list of
    them) first, as torch's Adam computes the weight of its lerp from a tensor beta1."""
    dtype = (like[0] if isinstance(like, list) else like).dtype
    if isinstance(beta, Tensor):
        return 1 - beta.to(dtype)
    return 1 - torch.tensor(beta, dtype=dtype).item()


def _first_moment(
    o: Ops, exp_avg: Tensor, g: Tensor, beta1: Coef, beta1_in_param_dtype: bool = False
) -> Tensor:
    """``beta1 * m + (1 - beta1) * g`` as torch's ``lerp_``, its weight ``1 - beta1``
    computed from beta1 rounded to `g`'s dtype with `beta1_in_param_dtype` (see `_complement`)."""
    return o.lerp_(exp_avg, g, _complement(beta1, g) if beta1_in_param_dtype else 1 - beta1)


def _second_moment(o: Ops, exp_avg_sq: Tensor, g: Tensor, beta2: Coef, lerp: bool) -> Tensor:
    """``beta2 * v + (1 - beta2) * |g|^2``: torch's ``mul_`` then ``addcmul_``, or one
    ``lerp`` (optax's form) with `lerp` or for a complex `g` (whose square is ``|g|^2``,
    as optax's). The engine steps complex params as pairs of reals; the ``scale_by_adam``
    block passes complex updates, and `lerp` where ``beta2`` is a tensor (``addcmul_``
    takes no tensor value in place, so the in-place chain would round otherwise)."""
    if isinstance(g, Tensor) and g.is_complex():
        return o.lerp_(exp_avg_sq, (g.real.square() + g.imag.square()).to(g.dtype), 1 - beta2)
    if lerp:
        return o.lerp_(exp_avg_sq, o.mul(g, g), 1 - beta2)
    return o.addcmul_(o.mul_(exp_avg_sq, beta2), g, g, value=1 - beta2)


def _denominator(o: Ops, second: Tensor, bias_correction2_sqrt: Coef, eps: Coef) -> Tensor:
    """torch's ``sqrt(v) / sqrt(1 - beta2**t) + eps``, a new tensor (`second` is kept)."""
    return o.add_(o.div_(o.sqrt(second), bias_correction2_sqrt), eps)


def _elementwise(
    o: Ops,
    out: Tensor | None,
    p: Tensor,
    g: Tensor,
    exp_avg: Tensor,
    exp_avg_sq: Tensor,
    max_exp_avg_sq: Tensor | None,
    coefficients: tuple[Coef, ...],
    *,
    betas: tuple[Coef, Coef],
    eps: Coef,
    weight_decay: Coef,
    amsgrad: bool,
    maximize: bool,
    decoupled_weight_decay: bool,
    eps_root: Coef = 0.0,
    beta1_in_param_dtype: bool = False,
    nesterov: bool = False,
    lerp_second_moment: bool = False,
    root_of_quotient: bool = False,
    max_of_quotient: bool = False,
    **_: Any,
) -> tuple[Tensor, tuple[Tensor, Tensor, Tensor | None]]:
    """Adam's step, also ``scale_by_adam``'s (transforms/moments.py) and
    ``scale_by_amsgrad``'s (catalogue/blocks.py). funcopt only, as optax's: `eps_root`,
    `nesterov` (Dozat's momentum, whose schedule then gives the two weights of its
    numerator), `lerp_second_moment` (see `_second_moment`), `root_of_quotient` (the
    denominator's root taken of ``v / bc2``, as optax's, also where ``bc2 < 0``: a ``b2``
    above 1, which a batch of hyperparameters may hold) and `max_of_quotient` (with
    amsgrad, the running maximum of ``v / bc2``, optax's ``nu_max``, of which the root is
    taken; torch's is of ``v``, divided by the step's ``bc2``)."""
    neg_step_size, bias_correction2_sqrt, bias_correction2, decay = coefficients[:4]
    beta1, beta2 = betas
    if maximize:
        g = o.neg(g)
    if nonzero(weight_decay):
        if decoupled_weight_decay:
            out = o.decay_(out, p, decay)
        else:
            g = o.add(g, p, alpha=weight_decay)
    exp_avg = _first_moment(o, exp_avg, g, beta1, beta1_in_param_dtype)
    exp_avg_sq = _second_moment(o, exp_avg_sq, g, beta2, lerp_second_moment)
    second = exp_avg_sq
    quotient_max = amsgrad and max_of_quotient
    if amsgrad:
        if max_exp_avg_sq is None:
            raise KeyError(
                "amsgrad=True reads the state's max_exp_avg_sq, which a state made "
                "without amsgrad lacks: make the state with amsgrad=True"
            )
        second = o.div(exp_avg_sq, bias_correction2) if quotient_max else exp_avg_sq
        second = max_exp_avg_sq = o.maximum_(max_exp_avg_sq, second)
    if root_of_quotient or quotient_max or nonzero(eps_root):  # optax's sqrt(v / bc2 + eps_root)
        if quotient_max:  # `second` is the buffer max_exp_avg_sq, a quotient already: not in place
            root = o.sqrt(o.add(second, eps_root) if nonzero(eps_root) else second)
        else:
            denom = o.div(second, bias_correction2)  # (each temporary freed as soon as it is used)
            if nonzero(eps_root):
                denom = o.add_(denom, eps_root)
            root = o.sqrt_(denom)
        denom = o.add_(root, eps)
    else:  # torch's sqrt(v) / sqrt(bc2)
        denom = _denominator(o, second, bias_correction2_sqrt, eps)
    if nesterov:  # no tensor alpha: the `Pure` and in-place ops then round alike
        momentum_weight, grad_weight = coefficients[4:]
        numerator = o.add_(o.mul(exp_avg, momentum_weight), o.mul(g, grad_weight))
        return o.addcdiv_(out, numerator, denom, value=neg_step_size), (exp_avg, exp_avg_sq, max_exp_avg_sq)
    out = o.addcdiv_(out, exp_avg, denom, value=neg_step_size)
    return out, (exp_avg, exp_avg_sq, max_exp_avg_sq)


_BOUNDS = (
    Bound("lr", "Invalid learning rate: {}"),
    Bound("eps", "Invalid epsilon value: {}"),
    Bound("betas", "Invalid beta parameter at index 0: {}", 0, high=1.0, inclusive=False),
    Bound("betas", "Invalid beta parameter at index 1: {}", 1, high=1.0, inclusive=False),
    Bound("weight_decay", "Invalid weight_decay value: {}"),
    Bound("eps_root", "Invalid eps_root value: {}"),
)
ADAM = Algorithm(
    name="Adam",
    state=AdamState,
    counters=("step",),
    initial=_initial,
    schedule=_schedule,
    elementwise=_elementwise,
    bounds=_BOUNDS,
)
# the same math, named AdamW in its state and its messages
ADAMW = Algorithm(
    name="AdamW",
    state=AdamWState,
    counters=("step",),
    initial=_initial,
    schedule=_schedule,
    elementwise=_elementwise,
    bounds=_BOUNDS,
)


def adam(
    lr: float | Tensor = 1e-3,
    betas: tuple[float | Tensor, float | Tensor] | Tensor = (0.9, 0.999),
    eps: float | Tensor = 1e-8,
    weight_decay: float | Tensor = 0.0,
    amsgrad: bool = False,
    *,
    maximize: bool = False,
    decoupled_weight_decay: bool = False,
    eps_root: float | Tensor = 0.0,
) -> GradientTransformation:
    """Adam as a pure transformation, with ``torch.optim.Adam``'s arguments and defaults.

    Args:
        lr: learning rate.
        betas: decay rates of the first and second moment averages, or one tensor of the two.
        eps: added to the denominator, after the square root.
        weight_decay: L2 penalty added to the gradient (or decoupled decay, see below).
        amsgrad: use the running maximum of the second moment (AMSGrad), kept in the
            state's ``max_exp_avg_sq`` (an empty node without it).
        maximize: maximize the objective instead of minimizing it.
        decoupled_weight_decay: multiply the params by ``1 - lr * weight_decay`` instead
            of adding ``weight_decay * param`` to the gradient (AdamW, see `adamw`).
        eps_root: added inside the square root, ``sqrt(v / (1 - beta2**t) + eps_root)``
            (funcopt only, as optax's; 0 is torch's rule). Not needed for finite
            meta-gradients: the functional step takes ``sqrt`` with derivative 0 at 0.

    Hyperparameters may be 0-d tensors, to differentiate or ``vmap`` over them.

    Example:
        >>> import torch, funcopt as fo
        >>> params = {"w": torch.tensor([1.0, -2.0])}
        >>> tx = fo.adam(lr=0.1)
        >>> state = tx.init(params)
        >>> updates, state = tx.update({"w": torch.tensor([0.5, -0.5])}, state, params)
        >>> fo.apply_updates(params, updates)["w"], state.exp_avg["w"]
        (tensor([ 0.9000, -1.9000]), tensor([ 0.0500, -0.0500]))
    """
    return ADAM.transform(
        lr=lr,
        betas=betas,
        eps=eps,
        weight_decay=weight_decay,
        amsgrad=amsgrad,
        maximize=maximize,
        decoupled_weight_decay=decoupled_weight_decay,
        eps_root=eps_root,
    )


def adamw(
    lr: float | Tensor = 1e-3,
    betas: tuple[float | Tensor, float | Tensor] | Tensor = (0.9, 0.999),
    eps: float | Tensor = 1e-8,
    weight_decay: float | Tensor = 1e-2,
    amsgrad: bool = False,
    *,
    maximize: bool = False,
    eps_root: float | Tensor = 0.0,
) -> GradientTransformation:
    """AdamW as a pure transformation, with ``torch.optim.AdamW``'s arguments and
    defaults: `adam` with decoupled weight decay (the params are multiplied by
    ``1 - lr * weight_decay`` at each step, before Adam's update).

    Args:
        lr: learning rate.
        betas: decay rates of the first and second moment averages, or one tensor of the two.
        eps: added to the denominator, after the square root.
        weight_decay: the decoupled weight decay coefficient.
        amsgrad: use the running maximum of the second moment (AMSGrad).
        maximize: maximize the objective instead of minimizing it.
        eps_root: added inside the square root (funcopt only; see `adam`).

    Example:
        >>> import torch, funcopt as fo
        >>> params = {"w": torch.tensor([1.0, -2.0])}
        >>> tx = fo.adamw(lr=0.1, weight_decay=0.5)
        >>> state = tx.init(params)
        >>> updates, state = tx.update({"w": torch.tensor([0.5, -0.5])}, state, params)
        >>> fo.apply_updates(params, updates)["w"]
        tensor([ 0.8500, -1.8000])
    """
    return ADAMW.transform(
        lr=lr,
        betas=betas,
        eps=eps,
        weight_decay=weight_decay,
        amsgrad=amsgrad,
        maximize=maximize,
        decoupled_weight_decay=True,
        eps_root=eps_root,
    )
