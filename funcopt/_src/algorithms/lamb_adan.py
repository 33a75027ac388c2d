"""LAMB, Adan and AdaBelief as engine `Algorithm`s, for the in-place drop-in classes
``fo.Lamb``, ``fo.Adan`` and ``fo.AdaBelief``: timm's math (``timm.optim.Lamb``,
``Adan``, ``AdaBelief``, timm 1.0.31), with each of timm's options a hyperparameter or
switch here, per tensor, to float64 round-off (tests/test_timm_reference.py).

The functional forms ``fo.lamb``, ``fo.adan`` and ``fo.adabelief`` stay optax's chains of
public blocks (`scale_by_adam`, `scale_by_trust_ratio`, `scale_by_adan`, `scale_by_belief`),
with optax's math and state trees, as the issue asks of every optax alias; the algorithm
pages (docs/algorithms/lamb.md, ...) say where the two differ. The math exists once:
``scale_by_adan`` runs Adan's here (``transforms/from_algorithm.py``), with optax's weight
``1 - b2`` of the gradient difference (``diff_weight``) and its ``eps_root``, and
``scale_by_belief`` AdaBelief's, not rectified, with optax's ``eps_root`` and ``nesterov``.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import torch
from torch import Tensor

from ..core.base import Params
from ..engine.algorithm import Algorithm
from ..engine.bounds import Bound, Check, Hyperparams
from ..engine.ops import Coef, InPlace, Ops, nonzero, power
from .adam import _denominator as adam_denominator
from .adam import _first_moment as adam_first_moment
from .adam import _second_moment as second_moment
from .catalogue_more import trust_ratio

__all__ = ["ADABELIEF", "ADAN", "CAUTIOUS_ADAN", "LAMB", "AdaBeliefState", "AdanState", "LambState"]


def _bounds(*betas: int, weight_decay: bool = True) -> tuple[Bound, ...]:
    """torch's checks, with its messages (the catalogue classes' `_check`)."""
    return (
        Bound("lr", "Invalid learning rate: {}"),
        Bound("eps", "Invalid epsilon value: {}"),
        *([Bound("weight_decay", "Invalid weight_decay value: {}")] if weight_decay else []),
        *(
            Bound("betas", f"Invalid beta parameter at index {i}: {{}}", i, high=1.0, inclusive=False)
            for i in betas
        ),
    )


def _started(step: Coef) -> Coef:
    """0 at the first step, 1 after it (`step` is the count of steps taken)."""
    return torch.clamp(step, max=1.0) if isinstance(step, Tensor) else min(step, 1.0)


def _root(x: Coef) -> Coef:
    return torch.sqrt(x) if isinstance(x, Tensor) else math.sqrt(x)


def decay_scale(lr: Coef, corrected_weight_decay: bool, max_lr_snapshot: Coef) -> Coef:
    """What multiplies weight_decay in timm's decoupled decay: lr, or ``lr**2 / max_lr``
    with ``corrected_weight_decay`` (the constructor's lr, timm's ``max_lr_snapshot``)."""
    return lr**2 / max_lr_snapshot if corrected_weight_decay else lr


def cautious(o: Ops, update: Tensor, g: Tensor) -> Tensor:
    """Cautious Optimizers (Liang et al. 2024), as timm: the update where it agrees in sign
    with the gradient, rescaled by the share of such entries (at least 1e-3). A mean over
    the whole tensor: for algorithms that step each param whole (not `per_element`)."""
    mask = (update * g > 0).to(update.dtype)
    return o.mul_(update, mask / mask.mean().clamp(min=1e-3))


# ---------------------------------------------------------------- LAMB


class LambState(NamedTuple):
    """LAMB's per-param state: the step count, Adam's two moments (timm's keys)."""

    step: Params
    exp_avg: Params
    exp_avg_sq: Params


def _lamb_initial(**_: Any) -> LambState:
    return LambState(step=0.0, exp_avg=0.0, exp_avg_sq=0.0)


def _lamb_schedule(
    step: Coef, *, lr: Coef, betas: tuple[Coef, Coef], weight_decay: Coef, bias_correction: bool = True,
    corrected_weight_decay: bool = False, max_lr_snapshot: Coef = 1.0, **_: Any,
) -> tuple[tuple[Coef], tuple]:  # fmt: skip
    t = step + 1
    bc1, bc2 = (1 - power(betas[0], t), 1 - power(betas[1], t)) if bias_correction else (1.0, 1.0)
    decay = 1 - decay_scale(lr, corrected_weight_decay, max_lr_snapshot) * weight_decay
    return (t,), (-lr, bc1, bc2**0.5, decay)


def _trust_ratio(param_norm: Coef, update_norm: Coef, clip: bool = False) -> Coef:
    """``|p| / |u|``, or 1 where either is 0 (LARS's `trust_ratio`); at most 1 with `clip`
    (timm's LAMBC)."""
    ratio = trust_ratio(param_norm, update_norm)
    if not clip:
        return ratio
    return torch.clamp(ratio, max=1.0) if isinstance(ratio, Tensor) else min(ratio, 1.0)


def _lamb_math(
    o: Ops, out: Tensor | None, p: Tensor, g: Tensor, exp_avg: Tensor, exp_avg_sq: Tensor,
    coefficients: tuple[Coef, ...], *, betas: tuple[Coef, Coef], eps: Coef, weight_decay: Coef,
    grad_averaging: bool = True, trust_clip: bool = False, always_adapt: bool = False, caution: bool = False,
    decoupled_decay: bool = False, grad_divisor: Coef | None = None, max_grad_norm: float | None = None,
    **_: Any,
) -> tuple[Tensor, tuple[Tensor, Tensor]]:  # fmt: skip
    neg_lr, bc1, bc2_sqrt, decay = coefficients
    beta1, beta2 = betas
    if grad_divisor is None and max_grad_norm is not None:
        raise ValueError(
            f"Lamb: max_grad_norm={max_grad_norm!r} clips the gradients of all param groups together, "
            "which only fo.Lamb's step does; use fo.Lamb, or chain fo.clip_by_global_norm before the "
            "algorithm and leave max_grad_norm=None"
        )
    if grad_divisor is not None and (isinstance(grad_divisor, Tensor) or grad_divisor != 1.0):
        g = o.div(g, grad_divisor)  # fo.Lamb's global-norm clip
    # Adam's moments and denominator (algorithms/adam.py); timm's first moment without
    # grad_averaging sums the gradient undamped
    exp_avg = adam_first_moment(o, exp_avg, g, beta1) if grad_averaging else o.add_(o.mul_(exp_avg, beta1), g)
    exp_avg_sq = second_moment(o, exp_avg_sq, g, beta2, False)
    denom = adam_denominator(o, exp_avg_sq, bc2_sqrt, eps)
    update = o.div_(o.div(exp_avg, bc1), denom)  # timm's (m / bc1) / denom, apart from the step
    if caution:
        update = cautious(o, update, g)
    adapt = nonzero(weight_decay) or always_adapt
    param_norm = o.item(torch.linalg.vector_norm(p)) if adapt else 1.0
    if nonzero(weight_decay):
        if decoupled_decay:  # the trust ratio reads the decayed param
            out = o.decay_(out, p, decay)
            param_norm = param_norm * abs(decay)
        else:
            update = o.add_(update, p, alpha=weight_decay)
    # timm skips the trust ratio for params without weight decay, unless always_adapt
    ratio = _trust_ratio(param_norm, o.item(torch.linalg.vector_norm(update)), trust_clip) if adapt else 1.0
    out = o.add_(out, update, alpha=neg_lr * ratio)
    return out, (exp_avg, exp_avg_sq)


LAMB = Algorithm(
    name="Lamb",
    state=LambState,
    counters=("step",),
    initial=_lamb_initial,
    schedule=_lamb_schedule,
    elementwise=_lamb_math,
    bounds=_bounds(0, 1),
    per_element=False,  # the trust ratio: norms of the param and its update
    needs_params=True,  # the trust ratio reads the param's norm
)
"""timm's Lamb, less its clip of the gradients' global norm (``max_grad_norm``), which
reads all param groups at once: ``fo.Lamb`` computes it and hands the math its divisor,
``grad_divisor`` (1: no clip)."""


# ---------------------------------------------------------------- Adan


class AdanState(NamedTuple):
    """Adan's per-param state: the step count, the moments of the gradient, of its
    difference from the last one and of their Nesterov sum, and the last gradient's
    negative (timm's keys: its ``neg_pre_grad`` is the step's scratch space too)."""

    step: Params
    exp_avg: Params
    exp_avg_diff: Params
    exp_avg_sq: Params
    neg_pre_grad: Params


def _adan_initial(**_: Any) -> AdanState:
    return AdanState(step=0.0, exp_avg=0.0, exp_avg_diff=0.0, exp_avg_sq=0.0, neg_pre_grad=0.0)


def _adan_schedule(
    step: Coef,
    *,
    lr: Coef,
    betas: tuple[Coef, Coef, Coef],
    weight_decay: Coef,
    no_prox: bool = False,
    diff_weight: Coef | None = None,
    **_: Any,
) -> tuple[tuple[Coef], tuple]:
    """The step sizes of the two moments' terms (times -lr), the root of bias correction 3,
    whether the last gradient is there, the decay factor, and bias correction 3 itself
    (for ``eps_root``). `diff_weight` (funcopt only, default ``beta2``) weights the
    gradient difference's moment in the step, as in the math's Nesterov sum."""
    t = step + 1
    beta1, beta2, beta3 = betas
    # timm's proximal decay divides the param by 1 + lr * wd after the step (no_prox:
    # multiplies it by 1 - lr * wd before): both as one factor of the param and the step
    decay = 1 - lr * weight_decay if no_prox else 1 / (1 + lr * weight_decay)
    step_scale = 1.0 if no_prox else decay
    bc3 = 1 - power(beta3, t)
    return (t,), (
        -lr / (1 - power(beta1, t)) * step_scale,
        -lr * (beta2 if diff_weight is None else diff_weight) / (1 - power(beta2, t)) * step_scale,
        _root(bc3),
        _started(step),  # no difference at the first step (the last gradient is not there yet)
        decay,
        bc3,
    )


def _adan_math(
    o: Ops, out: Tensor | None, p: Tensor, g: Tensor, exp_avg: Tensor, exp_avg_diff: Tensor, exp_avg_sq: Tensor,
    neg_pre_grad: Tensor, coefficients: tuple[Coef, ...], *, betas: tuple[Coef, Coef, Coef], eps: Coef,
    weight_decay: Coef, caution: bool = False, diff_weight: Coef | None = None, eps_root: Coef = 0.0,
    **_: Any,
) -> tuple[Tensor, tuple[Tensor, ...]]:  # fmt: skip
    if caution:
        raise ValueError(
            "Adan: caution=True takes a mean over each tensor, which the per-element ADAN cannot: "
            "use CAUTIOUS_ADAN (fo.Adan picks it when a group has caution=True at construction, "
            "add_param_group, load_state_dict or step)"
        )
    return _adan_step(
        o, out, p, g, exp_avg, exp_avg_diff, exp_avg_sq, neg_pre_grad, coefficients, betas=betas, eps=eps,
        weight_decay=weight_decay, diff_weight=diff_weight, eps_root=eps_root,
    )  # fmt: skip


def _cautious_adan_math(
    o: Ops, out: Tensor | None, p: Tensor, g: Tensor, exp_avg: Tensor, exp_avg_diff: Tensor, exp_avg_sq: Tensor,
    neg_pre_grad: Tensor, coefficients: tuple[Coef, ...], *, betas: tuple[Coef, Coef, Coef], eps: Coef,
    weight_decay: Coef, caution: bool = False, **_: Any,
) -> tuple[Tensor, tuple[Tensor, ...]]:  # fmt: skip
    """Adan with timm's ``caution`` (Cautious Optimizers, Liang et al. 2024): the first
    moment's term only where it agrees in sign with the gradient, rescaled by the share of
    such entries in the tensor (at least 1e-3)."""
    return _adan_step(
        o, out, p, g, exp_avg, exp_avg_diff, exp_avg_sq, neg_pre_grad, coefficients, betas=betas, eps=eps,
        weight_decay=weight_decay, caution=caution,
    )  # fmt: skip


def _caution_mask(o: Ops, exp_avg: Tensor, g: Tensor) -> Tensor:
    """timm's mask: 1 where the first moment and the gradient agree in sign, else 0,
    over its mean (at least 1e-3). A constant (no gradient flows through it). In place
    on one temporary for the eager step; out of place otherwise (vmap has no batching
    rule for the in-place comparison)."""
    with torch.no_grad():
        if o is InPlace:
            mask = torch.mul(exp_avg, g).gt_(0)
            return mask.div_(mask.mean().clamp_(min=1e-3))
        agree = torch.mul(exp_avg, g) > 0
        return agree / (agree.sum(dtype=g.dtype) / agree.numel()).clamp(min=1e-3)


def _adan_step(
    o: Ops, out: Tensor | None, p: Tensor, g: Tensor, exp_avg: Tensor, exp_avg_diff: Tensor, exp_avg_sq: Tensor,
    neg_pre_grad: Tensor, coefficients: tuple[Coef, ...], *, betas: tuple[Coef, Coef, Coef], eps: Coef,
    weight_decay: Coef, caution: bool = False, diff_weight: Coef | None = None, eps_root: Coef = 0.0,
) -> tuple[Tensor, tuple[Tensor, ...]]:  # fmt: skip
    """timm's Adan step; funcopt only, for ``scale_by_adan`` (optax's): `diff_weight`, the
    weight of the gradient difference in the Nesterov sum (default ``beta2``, timm's and
    the paper's; optax's is ``1 - beta2``: the schedule takes the same for the step), and
    `eps_root`, inside the root of the bias-corrected second moment."""
    neg_step, neg_step_diff, bc3_sqrt, started, decay, bc3 = coefficients
    beta1, beta2, beta3 = betas
    # as timm, neg_pre_grad holds the difference, then the Nesterov sum, then -g
    diff = o.mul_(o.add_(neg_pre_grad, g), started)  # no difference at the first step
    exp_avg = o.lerp_(exp_avg, g, 1 - beta1)
    exp_avg_diff = o.add_(o.mul_(exp_avg_diff, beta2), diff, alpha=1 - beta2)
    nesterov = o.add_(o.mul_(diff, beta2 if diff_weight is None else diff_weight), g)  # g + b2 (g - g_prev)
    exp_avg_sq = second_moment(o, exp_avg_sq, nesterov, beta3, False)  # |.|^2 of a complex update
    neg_pre_grad = o.mul_(o.copy_(nesterov, g), -1.0)
    if nonzero(eps_root):  # optax's sqrt(n / bc3 + eps_root)
        denom = o.add_(o.sqrt_(o.add_(o.div(exp_avg_sq, bc3), eps_root)), eps)
    else:
        denom = adam_denominator(o, exp_avg_sq, bc3_sqrt, eps)
    if nonzero(weight_decay):
        out = o.decay_(out, p, decay)
    step = exp_avg
    if caution:  # timm masks the first moment's term only, by its sign against the gradient's
        step = o.mul(exp_avg, _caution_mask(o, exp_avg, g))
    out = o.addcdiv_(out, step, denom, value=neg_step)
    out = o.addcdiv_(out, exp_avg_diff, denom, value=neg_step_diff)
    return out, (exp_avg, exp_avg_diff, exp_avg_sq, neg_pre_grad)


def _check_betas(hyperparams: Hyperparams) -> None:
    """torch's check of each beta (Python numbers only: a tensor may be traced)."""
    betas = hyperparams.get("betas", ())
    if not isinstance(betas, (tuple, list)) or len(betas) != 3:
        raise ValueError(f"Adan: betas must be a triple (b1, b2, b3), got {betas!r}")
    for i, beta in enumerate(betas):
        if not isinstance(beta, Tensor) and not 0.0 <= beta < 1.0:
            raise ValueError(f"Invalid beta parameter at index {i}: {beta}")


ADAN = Algorithm(
    name="Adan",
    state=AdanState,
    counters=("step",),
    initial=_adan_initial,
    schedule=_adan_schedule,
    elementwise=_adan_math,
    bounds=(*_bounds(), Check(_check_betas)),  # betas is a triple, which a Bound cannot index
)

CAUTIOUS_ADAN = Algorithm(
    name="CautiousAdan",
    state=AdanState,
    counters=("step",),
    initial=_adan_initial,
    schedule=_adan_schedule,
    elementwise=_cautious_adan_math,
    bounds=(*_bounds(), Check(_check_betas)),
    per_element=False,  # caution's mask is rescaled by its mean over the tensor
)
"""timm's Adan with ``caution`` (each param steps by itself); ``fo.Adan`` steps with it
when any param group sets ``caution=True``, with `ADAN` otherwise (whose per-element
math may step small params together, and refuses ``caution``)."""


# ---------------------------------------------------------------- AdaBelief


class AdaBeliefState(NamedTuple):
    """AdaBelief's per-param state: the step count, the first moment, the second moment
    of the gradient's deviation from it, and its running maximum with ``amsgrad``
    (timm's keys)."""

    step: Params
    exp_avg: Params
    exp_avg_var: Params
    max_exp_avg_var: Params


def _adabelief_initial(*, amsgrad: bool = False, **_: Any) -> AdaBeliefState:
    return AdaBeliefState(step=0.0, exp_avg=0.0, exp_avg_var=0.0, max_exp_avg_var=0.0 if amsgrad else None)


def _adabelief_schedule(
    step: Coef, *, lr: Coef, betas: tuple[Coef, Coef], weight_decay: Coef, fixed_decay: bool = False,
    rectify: bool = True, degenerated_to_sgd: bool = True, nesterov: bool = False, **_: Any,
) -> tuple[tuple[Coef], tuple]:  # fmt: skip
    """-lr / bias correction 1, the root of bias correction 2, the decoupled decay factor,
    and with ``rectify`` RAdam's two step sizes (times -lr): of the adaptive step while the
    variance is tractable (``num_sma >= 5``), else of the SGD step (0 without
    ``degenerated_to_sgd``); one of the two is 0. With `nesterov` (not rectified) the step
    size is -lr and the two weights of the math's numerator follow."""
    t = step + 1
    beta1, beta2 = betas
    bc1, beta2_t = 1 - power(beta1, t), power(beta2, t)
    decay = 1 - weight_decay if fixed_decay else 1 - lr * weight_decay
    if not rectify and nesterov:  # Dozat's, as optax: b1 m / (1 - b1**(t+1)) + (1 - b1) g / (1 - b1**t)
        weights = (beta1 / (1 - power(beta1, t + 1)), (1 - beta1) / bc1)
        return (t,), (-lr, _root(1 - beta2_t), decay, 0.0, 0.0, *weights)
    if not rectify:
        return (t,), (-(lr / bc1), _root(1 - beta2_t), decay, 0.0, 0.0)
    sma_max = 2 / (1 - beta2) - 1
    sma = sma_max - 2 * t * beta2_t / (1 - beta2_t)
    sgd = 1.0 / bc1 if degenerated_to_sgd else 0.0
    if not isinstance(sma, Tensor):
        if sma < 5:
            return (t,), (0.0, 1.0, decay, 0.0, -sgd * lr)
        return (t,), (0.0, 1.0, decay, -_rectified(sma, sma_max, beta2_t, bc1) * lr, 0.0)
    adaptive = sma >= 5  # no branch on a tensor: the unused term from values where it is defined
    size = _rectified(torch.where(adaptive, sma, 6.0), sma_max, beta2_t, bc1)
    return (t,), (
        0.0,
        1.0,
        decay,
        torch.where(adaptive, -size * lr, 0.0),
        torch.where(adaptive, 0.0, -sgd * lr),
    )


def _rectified(sma: Coef, sma_max: Coef, beta2_t: Coef, bc1: Coef) -> Coef:
    """RAdam's step size (timm's, lr left out)."""
    return _root(
        (1 - beta2_t) * (sma - 4) / (sma_max - 4) * (sma - 2) / sma * sma_max / (sma_max - 2)
    ) / bc1  # fmt: skip


def _adabelief_math(
    o: Ops, out: Tensor | None, p: Tensor, g: Tensor, exp_avg: Tensor, exp_avg_var: Tensor,
    max_exp_avg_var: Tensor | None, coefficients: tuple[Coef, ...], *, betas: tuple[Coef, Coef], eps: Coef,
    weight_decay: Coef, amsgrad: bool = False, decoupled_decay: bool = True, rectify: bool = True,
    eps_root: Coef | None = None, nesterov: bool = False, **_: Any,
) -> tuple[Tensor, tuple[Tensor, Tensor, Tensor | None]]:  # fmt: skip
    """timm's AdaBelief step; funcopt only, for ``scale_by_belief`` (optax's): `eps_root`,
    what is added to the second moment at each step (default `eps`, as timm), and
    `nesterov` (Dozat's momentum, not rectified: the schedule gives its two weights)."""
    neg_step, bc2_sqrt, decay, neg_adaptive, neg_sgd = coefficients[:5]
    beta1, beta2 = betas
    if nesterov and rectify:
        raise ValueError("AdaBelief: nesterov (optax's scale_by_belief) takes rectify=False")
    if nonzero(weight_decay):
        if decoupled_decay:
            out = o.decay_(out, p, decay)
        else:
            g = o.add(g, p, alpha=weight_decay)
    exp_avg = o.lerp_(exp_avg, g, 1 - beta1)
    residual = o.sub(g, exp_avg)
    exp_avg_var = second_moment(o, exp_avg_var, residual, beta2, False)  # |.|^2 of a complex update
    exp_avg_var = o.add_(exp_avg_var, eps if eps_root is None else eps_root)  # timm adds eps at each step
    second = exp_avg_var
    if amsgrad:
        second = max_exp_avg_var = o.maximum_(max_exp_avg_var, exp_avg_var)
    if not rectify:
        denom = adam_denominator(o, second, bc2_sqrt, eps)
        numerator = exp_avg
        if nesterov:
            momentum_weight, grad_weight = coefficients[5:]
            numerator = o.add_(o.mul(exp_avg, momentum_weight), o.mul(g, grad_weight))
        out = o.addcdiv_(out, numerator, denom, value=neg_step)
        return out, (exp_avg, exp_avg_var, max_exp_avg_var)
    if nonzero(neg_adaptive):  # timm's rectified step reads exp_avg_var, amsgrad or not
        out = o.addcdiv_(out, exp_avg, o.add_(o.sqrt(exp_avg_var), eps), value=neg_adaptive)
    if nonzero(neg_sgd):
        out = o.add_(out, exp_avg, alpha=neg_sgd)
    if out is None:  # no step (timm's, without degenerated_to_sgd), as a zero update
        out = o.add_(out, exp_avg, alpha=0.0)
    return out, (exp_avg, exp_avg_var, max_exp_avg_var)


ADABELIEF = Algorithm(
    name="AdaBelief",
    state=AdaBeliefState,
    counters=("step",),
    initial=_adabelief_initial,
    schedule=_adabelief_schedule,
    elementwise=_adabelief_math,
    bounds=_bounds(0, 1),
)
