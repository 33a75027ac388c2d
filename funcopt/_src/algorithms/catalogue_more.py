"""Yogi, NAdamW, Signum, ADOPT, AdEMAMix, LARS, NovoGrad and MADGRAD as engine
`Algorithm`s, for the in-place drop-in classes (``fo.Yogi``, ...): each the math of its
optax chain (``fo.yogi``, ``fo.nadamw``, ...) as the class ran it, per tensor, to round-off.

The functional forms ``fo.yogi`` etc. stay optax's chains of public blocks, with optax's
state trees; these algorithms are the classes' math (and ``YOGI.transform(...)`` its
functional face), equal to those chains to round-off (tests/test_catalogue_inplace.py).
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import torch
from torch import Tensor

from ..core.base import Params
from ..engine.algorithm import Algorithm
from ..engine.bounds import Bound, Hyperparams
from ..engine.ops import Coef, Ops, nonzero, power

__all__ = [
    "ADEMAMIX",
    "ADOPT",
    "AdEMAMixState",
    "AdoptState",
    "NADAMW",
    "SIGNUM",
    "YOGI",
    "NAdamWState",
    "SignumState",
    "YogiState",
]


def _bounds(*betas: int, weight_decay: bool = True, momentum: bool = False) -> tuple[Bound, ...]:
    """The classes' checks, with torch's messages (a momentum is checked as beta 0)."""
    return (
        Bound("lr", "Invalid learning rate: {}"),
        Bound("eps", "Invalid epsilon value: {}"),
        *([Bound("weight_decay", "Invalid weight_decay value: {}")] if weight_decay else []),
        *(
            Bound("betas", f"Invalid beta parameter at index {i}: {{}}", i, high=1.0, inclusive=False)
            for i in betas
        ),
        *(
            [Bound("momentum", "Invalid beta parameter at index 0: {}", high=1.0, inclusive=False)]
            if momentum
            else []
        ),
    )


def _started(step: Coef) -> Coef:
    """0 at the first step, 1 after it (`step` is the count of steps taken)."""
    return torch.clamp(step, max=1.0) if isinstance(step, Tensor) else min(step, 1.0)


def _adam_schedule(step: Coef, *, lr: Coef, betas: tuple[Coef, ...], **_: Any) -> tuple[tuple[Coef], tuple]:
    """-lr and Adam's bias corrections."""
    t = step + 1
    return (t,), (-lr, 1 - power(betas[0], t), 1 - power(betas[1], t))


# ---------------------------------------------------------------- Yogi


class YogiState(NamedTuple):
    """Yogi's per-param state: the step count and its two moments (Adam's keys), both
    starting at 1e-6 (optax's ``initial_accumulator_value``)."""

    step: Params
    exp_avg: Params
    exp_avg_sq: Params


def _yogi_initial(**_: Any) -> YogiState:
    # optax's initial_accumulator_value, for both moments
    return YogiState(step=0.0, exp_avg=1e-6, exp_avg_sq=1e-6)


def _yogi_math(
    o: Ops, out: Tensor | None, p: Tensor, g: Tensor, exp_avg: Tensor, exp_avg_sq: Tensor,
    coefficients: tuple[Coef, Coef, Coef], *, betas: tuple[Coef, Coef], eps: Coef, **_: Any,
) -> tuple[Tensor, tuple[Tensor, Tensor]]:  # fmt: skip
    neg_lr, bc1, bc2 = coefficients
    beta1, beta2 = betas
    exp_avg = o.lerp_(exp_avg, g, 1 - beta1)
    g2 = o.mul(g, g)
    # nu - (1 - b2) * sign(nu - g**2) * g**2
    exp_avg_sq = o.addcmul_(exp_avg_sq, o.sign(o.sub(exp_avg_sq, g2)), g2, value=-(1 - beta2))
    denom = o.add_(o.sqrt_(o.div(exp_avg_sq, bc2)), eps)
    out = o.addcdiv_(out, o.div(exp_avg, bc1), denom, value=neg_lr)
    return out, (exp_avg, exp_avg_sq)


YOGI = Algorithm(
    name="Yogi",
    state=YogiState,
    counters=("step",),
    initial=_yogi_initial,
    schedule=_adam_schedule,
    elementwise=_yogi_math,
    bounds=_bounds(0, 1, weight_decay=False),
)


# ---------------------------------------------------------------- NAdamW


class NAdamWState(NamedTuple):
    """NAdamW's per-param state: the step count and Adam's two moments."""

    step: Params
    exp_avg: Params
    exp_avg_sq: Params


def _nadamw_initial(**_: Any) -> NAdamWState:
    return NAdamWState(step=0.0, exp_avg=0.0, exp_avg_sq=0.0)


def _nadamw_schedule(
    step: Coef, *, lr: Coef, betas: tuple[Coef, Coef], **_: Any
) -> tuple[tuple[Coef], tuple]:
    t = step + 1
    beta1, beta2 = betas
    return (t,), (-lr, 1 - power(beta1, t), 1 - power(beta1, t + 1), 1 - power(beta2, t))


def _nadamw_math(
    o: Ops, out: Tensor | None, p: Tensor, g: Tensor, exp_avg: Tensor, exp_avg_sq: Tensor,
    coefficients: tuple[Coef, ...], *, betas: tuple[Coef, Coef], eps: Coef, weight_decay: Coef, **_: Any,
) -> tuple[Tensor, tuple[Tensor, Tensor]]:  # fmt: skip
    neg_lr, bc1, bc1_next, bc2 = coefficients
    beta1, beta2 = betas
    exp_avg = o.lerp_(exp_avg, g, 1 - beta1)
    exp_avg_sq = o.addcmul_(o.mul_(exp_avg_sq, beta2), g, g, value=1 - beta2)
    denom = o.add_(o.sqrt_(o.div(exp_avg_sq, bc2)), eps)
    # Dozat 2016, as optax: b1 * mu / correction1_next + (1 - b1) * g / correction1
    m_hat = o.add_(o.mul_(o.div(exp_avg, bc1_next), beta1), o.mul_(o.div(g, bc1), 1 - beta1))
    update = o.div_(m_hat, denom)
    if nonzero(weight_decay):
        update = o.add_(update, p, alpha=weight_decay)
    out = o.add_(out, update, alpha=neg_lr)
    return out, (exp_avg, exp_avg_sq)


NADAMW = Algorithm(
    name="NAdamW",
    state=NAdamWState,
    counters=("step",),
    initial=_nadamw_initial,
    schedule=_nadamw_schedule,
    elementwise=_nadamw_math,
    bounds=_bounds(0, 1),
)


# ---------------------------------------------------------------- Signum


class SignumState(NamedTuple):
    """Signum's per-param state: the momentum (an EMA of the gradients, not debiased)."""

    momentum_buffer: Params


def _signum_initial(**_: Any) -> SignumState:
    return SignumState(momentum_buffer=0.0)


def _signum_schedule(*, lr: Coef, **_: Any) -> tuple[tuple, tuple]:
    return (), (-lr,)


def _signum_math(
    o: Ops, out: Tensor | None, p: Tensor, g: Tensor, momentum_buffer: Tensor,
    coefficients: tuple[Coef], *, momentum: Coef, **_: Any,
) -> tuple[Tensor, tuple[Tensor]]:  # fmt: skip
    (neg_lr,) = coefficients
    momentum_buffer = o.lerp_(momentum_buffer, g, 1 - momentum)
    out = o.add_(out, o.sign(momentum_buffer), alpha=neg_lr)
    return out, (momentum_buffer,)


SIGNUM = Algorithm(
    name="Signum",
    state=SignumState,
    counters=(),
    initial=_signum_initial,
    schedule=_signum_schedule,
    elementwise=_signum_math,
    bounds=_bounds(weight_decay=False, momentum=True),  # no eps: its bound checks nothing
)


# ---------------------------------------------------------------- ADOPT


class AdoptState(NamedTuple):
    """ADOPT's per-param state: the step count and its two moments (the authors' keys)."""

    step: Params
    exp_avg: Params
    exp_avg_sq: Params


def _adopt_initial(**_: Any) -> AdoptState:
    return AdoptState(step=0.0, exp_avg=0.0, exp_avg_sq=0.0)


def _adopt_schedule(step: Coef, *, lr: Coef, betas: tuple[Coef, Coef], **_: Any) -> tuple[tuple[Coef], tuple]:
    """The first step only sets the second moment (its momentum weight is 0, the second
    moment's 1); the normalized gradient is clipped to ``step**0.25`` (optax's
    ``clip_value_fn`` at the steps taken before)."""
    started = _started(step)
    beta1, beta2 = betas
    return (step + 1,), (-lr, (1 - beta1) * started, beta2 * started, step**0.25)


def _adopt_math(
    o: Ops, out: Tensor | None, p: Tensor, g: Tensor, exp_avg: Tensor, exp_avg_sq: Tensor,
    coefficients: tuple[Coef, ...], *, eps: Coef, **_: Any,
) -> tuple[Tensor, tuple[Tensor, Tensor]]:  # fmt: skip
    neg_lr, weight1, beta2, clip = coefficients
    normalized = o.div(g, o.clamp_(o.sqrt(exp_avg_sq), eps, math.inf))  # by the previous moment
    normalized = o.clamp_(normalized, -clip, clip)
    exp_avg = o.lerp_(exp_avg, normalized, weight1)
    exp_avg_sq = o.addcmul_(o.mul_(exp_avg_sq, beta2), g, g, value=1 - beta2)
    out = o.add_(out, exp_avg, alpha=neg_lr)
    return out, (exp_avg, exp_avg_sq)


ADOPT = Algorithm(
    name="Adopt",
    state=AdoptState,
    counters=("step",),
    initial=_adopt_initial,
    schedule=_adopt_schedule,
    elementwise=_adopt_math,
    bounds=_bounds(0, 1, weight_decay=False),
)


# ---------------------------------------------------------------- AdEMAMix


class AdEMAMixState(NamedTuple):
    """AdEMAMix's per-param state: the step count, the fast and slow EMAs of the gradient
    and the second moment (the authors' keys)."""

    step: Params
    exp_avg_fast: Params
    exp_avg_slow: Params
    exp_avg_sq: Params


def _ademamix_initial(**_: Any) -> AdEMAMixState:
    return AdEMAMixState(step=0.0, exp_avg_fast=0.0, exp_avg_slow=0.0, exp_avg_sq=0.0)


def _ademamix_math(
    o: Ops, out: Tensor | None, p: Tensor, g: Tensor, exp_avg_fast: Tensor, exp_avg_slow: Tensor,
    exp_avg_sq: Tensor, coefficients: tuple[Coef, Coef, Coef], *, betas: tuple[Coef, Coef, Coef],
    alpha: Coef, eps: Coef, weight_decay: Coef, **_: Any,
) -> tuple[Tensor, tuple[Tensor, Tensor, Tensor]]:  # fmt: skip
    neg_lr, bc1, bc2 = coefficients
    beta1, beta2, beta3 = betas
    exp_avg_fast = o.lerp_(exp_avg_fast, g, 1 - beta1)
    exp_avg_slow = o.lerp_(exp_avg_slow, g, 1 - beta3)
    exp_avg_sq = o.addcmul_(o.mul_(exp_avg_sq, beta2), g, g, value=1 - beta2)
    denom = o.add_(o.sqrt_(o.div(exp_avg_sq, bc2)), eps)
    update = o.div_(o.add_(o.div(exp_avg_fast, bc1), exp_avg_slow, alpha=alpha), denom)
    if nonzero(weight_decay):
        update = o.add_(update, p, alpha=weight_decay)
    out = o.add_(out, update, alpha=neg_lr)
    return out, (exp_avg_fast, exp_avg_slow, exp_avg_sq)


def _check_three_betas(hyperparams: Hyperparams) -> None:
    """torch's check of each beta (Python numbers only: a tensor may be traced)."""
    betas = hyperparams.get("betas", ())
    if not isinstance(betas, (tuple, list)) or len(betas) != 3:
        raise ValueError(f"AdEMAMix: betas must be a triple (b1, b2, b3), got {betas!r}")
    for i, beta in enumerate(betas):
        if not isinstance(beta, Tensor) and not 0.0 <= beta < 1.0:
            raise ValueError(f"Invalid beta parameter at index {i}: {beta}")


ADEMAMIX = Algorithm(
    name="AdEMAMix",
    state=AdEMAMixState,
    counters=("step",),
    initial=_ademamix_initial,
    schedule=_adam_schedule,  # -lr and the bias corrections of betas[0], betas[1]
    elementwise=_ademamix_math,
    bounds=_bounds(),  # betas is a triple, which the bounds' pairs cannot index: see validate
    validate=_check_three_betas,
)
