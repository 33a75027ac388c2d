"""LAMB, Adan and AdaBelief as engine `Algorithm`s, for the in-place drop-in classes
``fo.Lamb``, ``fo.Adan`` and ``fo.AdaBelief``: optax's math (``optax.lamb``,
``optax.adan``, ``optax.adabelief``) per tensor, to round-off.

The functional forms ``fo.lamb``, ``fo.adan`` and ``fo.adabelief`` stay optax's chains of public blocks
(`scale_by_adam`, `scale_by_trust_ratio`, `scale_by_adan`, `scale_by_belief`), with optax's state
trees, as the issue asks of every optax alias; these algorithms are the classes' math
(and ``LAMB.transform(...)``, ``ADAN.transform(...)`` its functional face), equal to
those chains to round-off (tests/test_catalogue_classes.py compares them).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import Tensor

from ..core.base import Params
from ..engine.algorithm import Algorithm
from ..engine.bounds import Bound, Hyperparams
from ..engine.ops import Coef, Ops, nonzero, power

__all__ = ["ADABELIEF", "ADAN", "LAMB", "AdaBeliefState", "AdanState", "LambState"]


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


# ---------------------------------------------------------------- LAMB


class LambState(NamedTuple):
    """LAMB's per-param state: the step count, Adam's two moments (torch's keys)."""

    step: Params
    exp_avg: Params
    exp_avg_sq: Params


def _lamb_initial(**_: Any) -> LambState:
    return LambState(step=0.0, exp_avg=0.0, exp_avg_sq=0.0)


def _lamb_schedule(step: Coef, *, lr: Coef, betas: tuple[Coef, Coef], **_: Any) -> tuple[tuple[Coef], tuple]:
    t = step + 1
    return (t,), (-lr, 1 - power(betas[0], t), 1 - power(betas[1], t))


def _trust_ratio(param_norm: Coef, update_norm: Coef) -> Coef:
    """``|p| / |u|``, or 1 where either is 0 (optax's `scale_by_trust_ratio`)."""
    if isinstance(param_norm, Tensor) or isinstance(update_norm, Tensor):
        zero = (param_norm == 0) | (update_norm == 0)
        return torch.where(zero, 1.0, param_norm / torch.where(zero, 1.0, update_norm))
    return 1.0 if param_norm == 0 or update_norm == 0 else param_norm / update_norm


def _lamb_math(
    o: Ops, out: Tensor | None, p: Tensor, g: Tensor, exp_avg: Tensor, exp_avg_sq: Tensor,
    coefficients: tuple[Coef, Coef, Coef], *, betas: tuple[Coef, Coef], eps: Coef, eps_root: Coef,
    weight_decay: Coef, **_: Any,
) -> tuple[Tensor, tuple[Tensor, Tensor]]:  # fmt: skip
    neg_lr, bc1, bc2 = coefficients
    beta1, beta2 = betas
    exp_avg = o.lerp_(exp_avg, g, 1 - beta1)
    exp_avg_sq = o.addcmul_(o.mul_(exp_avg_sq, beta2), g, g, value=1 - beta2)
    nu_hat = o.div(exp_avg_sq, bc2)
    if nonzero(eps_root):
        nu_hat = o.add_(nu_hat, eps_root)
    update = o.div_(o.div(exp_avg, bc1), o.add_(o.sqrt_(nu_hat), eps))  # Adam's step
    if nonzero(weight_decay):
        update = o.add_(update, p, alpha=weight_decay)
    ratio = _trust_ratio(o.item(torch.linalg.vector_norm(p)), o.item(torch.linalg.vector_norm(update)))
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


# ---------------------------------------------------------------- Adan


class AdanState(NamedTuple):
    """Adan's per-param state: the step count, the moments of the gradient, of its
    difference from the last one and of their Nesterov sum, and the last gradient."""

    step: Params
    exp_avg: Params
    exp_avg_diff: Params
    exp_avg_sq: Params
    prev_grad: Params


def _adan_initial(**_: Any) -> AdanState:
    return AdanState(step=0.0, exp_avg=0.0, exp_avg_diff=0.0, exp_avg_sq=0.0, prev_grad=0.0)


def _adan_schedule(
    step: Coef, *, lr: Coef, betas: tuple[Coef, Coef, Coef], **_: Any
) -> tuple[tuple[Coef], tuple]:
    t = step + 1
    beta1, beta2, beta3 = betas
    # no difference at the first step (the last gradient is not there yet)
    diff_weight = (1 - beta2) * (torch.clamp(step, max=1.0) if isinstance(step, Tensor) else min(step, 1.0))
    bc2 = 1 - power(beta2, t)
    return (t,), (-lr, 1 - power(beta1, t), (1 - beta2) / bc2, 1 - power(beta3, t), diff_weight)


def _adan_math(
    o: Ops, out: Tensor | None, p: Tensor, g: Tensor, exp_avg: Tensor, exp_avg_diff: Tensor, exp_avg_sq: Tensor,
    prev_grad: Tensor, coefficients: tuple[Coef, ...], *, betas: tuple[Coef, Coef, Coef], eps: Coef,
    eps_root: Coef, weight_decay: Coef, **_: Any,
) -> tuple[Tensor, tuple[Tensor, ...]]:  # fmt: skip
    neg_lr, bc1, v_scale, bc3, diff_weight = coefficients
    beta1, beta2, beta3 = betas
    diff = o.sub(g, prev_grad)
    exp_avg = o.lerp_(exp_avg, g, 1 - beta1)
    exp_avg_diff = o.add_(o.mul_(exp_avg_diff, beta2), diff, alpha=diff_weight)
    nesterov = o.add(g, diff, alpha=diff_weight)  # g + (1 - b2) diff
    exp_avg_sq = o.addcmul_(o.mul_(exp_avg_sq, beta3), nesterov, nesterov, value=1 - beta3)
    prev_grad = o.copy_(prev_grad, g)
    n_hat = o.div(exp_avg_sq, bc3)
    if nonzero(eps_root):
        n_hat = o.add_(n_hat, eps_root)
    update = o.add_(o.div(exp_avg, bc1), exp_avg_diff, alpha=v_scale)  # m_hat + (1 - b2) v_hat
    update = o.div_(update, o.add_(o.sqrt_(n_hat), eps))
    if nonzero(weight_decay):
        update = o.add_(update, p, alpha=weight_decay)
    out = o.add_(out, update, alpha=neg_lr)
    return out, (exp_avg, exp_avg_diff, exp_avg_sq, prev_grad)


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
    bounds=_bounds(),  # betas is a triple, which the bounds' pairs cannot index: see validate
    validate=_check_betas,
)


# ---------------------------------------------------------------- AdaBelief


class AdaBeliefState(NamedTuple):
    """AdaBelief's per-param state: the step count, the first moment and the second
    moment of the gradient's deviation from it (timm's keys)."""

    step: Params
    exp_avg: Params
    exp_avg_var: Params


def _adabelief_initial(**_: Any) -> AdaBeliefState:
    return AdaBeliefState(step=0.0, exp_avg=0.0, exp_avg_var=0.0)


def _adabelief_math(
    o: Ops, out: Tensor | None, p: Tensor, g: Tensor, exp_avg: Tensor, exp_avg_var: Tensor,
    coefficients: tuple[Coef, Coef, Coef], *, betas: tuple[Coef, Coef], eps: Coef, eps_root: Coef, **_: Any,
) -> tuple[Tensor, tuple[Tensor, Tensor]]:  # fmt: skip
    neg_lr, bc1, bc2 = coefficients
    beta1, beta2 = betas
    exp_avg = o.lerp_(exp_avg, g, 1 - beta1)
    deviation = o.sub(g, exp_avg)
    exp_avg_var = o.addcmul_(o.mul_(exp_avg_var, beta2), deviation, deviation, value=1 - beta2)
    if nonzero(eps_root):  # optax adds it to the state itself, at each step
        exp_avg_var = o.add_(exp_avg_var, eps_root)
    denom = o.add_(o.sqrt_(o.div(exp_avg_var, bc2)), eps)
    out = o.addcdiv_(out, o.div(exp_avg, bc1), denom, value=neg_lr)
    return out, (exp_avg, exp_avg_var)


ADABELIEF = Algorithm(
    name="AdaBelief",
    state=AdaBeliefState,
    counters=("step",),
    initial=_adabelief_initial,
    schedule=_lamb_schedule,  # the same coefficients: -lr and Adam's bias corrections
    elementwise=_adabelief_math,
    bounds=_bounds(0, 1, weight_decay=False),
)
