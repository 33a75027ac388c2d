"""Yogi, NAdamW, Signum, ADOPT, AdEMAMix, LARS, NovoGrad and MADGRAD as engine
`Algorithm`s, for the in-place drop-in classes (``fo.Yogi``, ...): Yogi to AdEMAMix the
math of its optax chain (``fo.yogi``, ``fo.nadamw``, ...), per tensor, to round-off; LARS,
NovoGrad and MADGRAD timm's (``timm.optim.Lars``, ``NvNovoGrad``, ``MADGRAD``), with each
of timm's options (tests/test_timm_reference.py), while ``fo.lars``, ``fo.novograd`` and
``fo.madgrad`` stay optax's.

The functional forms ``fo.yogi`` etc. stay optax's chains of public blocks, with optax's
state trees; these algorithms are the classes' math (and ``YOGI.transform(...)`` its
functional face), equal to those chains to round-off (tests/test_catalogue_inplace.py).
The math exists once: ``scale_by_yogi``, ``scale_by_adopt``, ``scale_by_ademamix``,
``scale_by_novograd``, ``scale_by_madgrad`` run Yogi's, ADOPT's, AdEMAMix's, NovoGrad's
and MADGRAD's here (``transforms/from_algorithm.py``), and NAdamW is Adam's (``adam.py``,
as ``fo.nadamw``'s ``scale_by_adam(nesterov=True)``).
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import torch
from torch import Tensor

from ..core.base import Params
from ..engine.algorithm import Algorithm
from ..engine.bounds import Bound, Check, Hyperparams
from ..engine.leaves import AtFirstStep
from ..engine.ops import Coef, Ops, nonzero, power
from .adam import _elementwise as adam_elementwise
from .adam import _schedule as adam_schedule
from .adam import _second_moment as adam_second_moment
from .sgd import DampedFromSecondStep, momentum_step
from .sgd import _validate as sgd_validate

__all__ = [
    "LARS",
    "MADGRAD",
    "NOVOGRAD",
    "LarsState",
    "MADGRADState",
    "NovoGradState",
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
    coefficients: tuple[Coef, Coef, Coef], *, betas: tuple[Coef, Coef], eps: Coef, eps_root: Coef = 0.0,
    **_: Any,
) -> tuple[Tensor, tuple[Tensor, Tensor]]:  # fmt: skip
    """Yogi's step, also ``scale_by_yogi``'s (`eps_root` is its, added inside the root)."""
    neg_lr, bc1, bc2 = coefficients
    beta1, beta2 = betas
    exp_avg = o.lerp_(exp_avg, g, 1 - beta1)
    g2 = o.mul(g, g)
    # nu - (1 - b2) * sign(nu - g**2) * g**2
    exp_avg_sq = o.addcmul_(exp_avg_sq, o.sign_(o.sub(exp_avg_sq, g2)), g2, value=-(1 - beta2))
    quotient = o.div(exp_avg_sq, bc2)
    denom = o.add_(o.sqrt_(o.add_(quotient, eps_root) if nonzero(eps_root) else quotient), eps)
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


def _nadamw_schedule(step: Coef, **hyperparams: Any) -> tuple[tuple[Coef], tuple]:
    """Adam's, with Dozat's Nesterov momentum."""
    return adam_schedule(step, nesterov=True, **hyperparams)


def _nadamw_math(
    o: Ops, out: Tensor | None, p: Tensor, g: Tensor, exp_avg: Tensor, exp_avg_sq: Tensor,
    coefficients: tuple[Coef, ...], **hyperparams: Any,
) -> tuple[Tensor, tuple[Tensor, Tensor]]:  # fmt: skip
    """Adam's math (``adam._elementwise``, as `fo.nadamw`'s ``scale_by_adam``) with Dozat's
    Nesterov momentum, optax's denominator, and decoupled weight decay (optax adds
    ``weight_decay * p`` to the update: ``p * (1 - lr * weight_decay)``)."""
    out, (exp_avg, exp_avg_sq, _) = adam_elementwise(
        o, out, p, g, exp_avg, exp_avg_sq, None, coefficients, **hyperparams, amsgrad=False,
        maximize=False, decoupled_weight_decay=True, nesterov=True, root_of_quotient=True,
    )  # fmt: skip
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


def _lr_schedule(*, lr: Coef, **_: Any) -> tuple[tuple, tuple]:
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
    schedule=_lr_schedule,
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
    coefficients: tuple[Coef, ...], *, eps: Coef, nesterov: bool = False, **_: Any,
) -> tuple[Tensor, tuple[Tensor, Tensor]]:  # fmt: skip
    """ADOPT's step, also ``scale_by_adopt``'s: its clip may be None (no clipping), and
    `nesterov` (optax's) steps ``b1 * m + (1 - b1) * normalized`` with the new momentum."""
    neg_lr, weight1, beta2, clip = coefficients
    normalized = o.div(g, o.clamp_(o.sqrt(exp_avg_sq), eps, math.inf))  # by the previous moment
    if clip is not None:
        normalized = o.clamp_(normalized, -clip, clip)
    exp_avg = o.lerp_(exp_avg, normalized, weight1)
    exp_avg_sq = o.addcmul_(o.mul_(exp_avg_sq, beta2), g, g, value=1 - beta2)
    out = o.add_(out, o.lerp(exp_avg, normalized, weight1) if nesterov else exp_avg, alpha=neg_lr)
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
    alpha: Coef, eps: Coef, weight_decay: Coef, eps_root: Coef = 0.0, **_: Any,
) -> tuple[Tensor, tuple[Tensor, Tensor, Tensor]]:  # fmt: skip
    """AdEMAMix's step, also ``scale_by_ademamix``'s (`eps_root` is its, added inside the
    root; a complex gradient, its, squares to ``|g|^2``)."""
    neg_lr, bc1, bc2 = coefficients
    beta1, beta2, beta3 = betas
    exp_avg_fast = o.lerp_(exp_avg_fast, g, 1 - beta1)
    exp_avg_slow = o.lerp_(exp_avg_slow, g, 1 - beta3)
    exp_avg_sq = adam_second_moment(o, exp_avg_sq, g, beta2, False)
    quotient = o.div(exp_avg_sq, bc2)
    denom = o.add_(o.sqrt_(o.add_(quotient, eps_root) if nonzero(eps_root) else quotient), eps)
    if nonzero(weight_decay):  # optax adds weight_decay * p to the update: p * (1 - lr * weight_decay)
        out = o.decay_(out, p, 1 + neg_lr * weight_decay)
    out = o.addcdiv_(out, o.add_(o.div(exp_avg_fast, bc1), exp_avg_slow, alpha=alpha), denom, value=neg_lr)
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
    bounds=(*_bounds(), Check(_check_three_betas)),  # betas is a triple, which a Bound cannot index
)


# ---------------------------------------------------------------- LARS (timm's)


class LarsState(NamedTuple):
    """LARS's per-param state: the momentum buffer (timm's, as torch's SGD: made at the
    first step, a copy of the scaled gradient; absent without momentum)."""

    momentum_buffer: Params


def _lars_initial(*, momentum: Coef = 0.0, **_: Any) -> LarsState:
    """As SGD's: a functional state holds the buffer from init, as zeros, and the first
    step from zeros is the copy (see `DampedFromSecondStep`)."""
    return LarsState(momentum_buffer=AtFirstStep(0.0) if nonzero(momentum) else None)


def trust_ratio(
    w_norm: Coef, u_norm: Coef, trust_coeff: Coef = 1.0, eps: Coef = 0.0, weight_decay: Coef | None = None
) -> Coef:
    """The layer-wise trust ratio ``trust_coeff * |w| / (|u| + eps)``, or 1 where either
    norm is 0: timm's LARS with the ``weight_decay * |w|`` its denominator adds (the decay
    joins the update after the ratio), optax's ``scale_by_trust_ratio`` (catalogue/scaling.py)
    without (`weight_decay` None: the decay is in its update already). Norms as numbers (the
    torch classes read them) or tensors; the division is guarded where a norm is 0, so that
    a gradient through the ratio stays finite there."""
    if isinstance(w_norm, Tensor) or isinstance(u_norm, Tensor):
        zero = (w_norm == 0) | (u_norm == 0)
        denominator = u_norm if weight_decay is None else u_norm + w_norm * weight_decay
        return torch.where(zero, 1.0, trust_coeff * w_norm / torch.where(zero, 1.0, denominator + eps))
    if w_norm == 0 or u_norm == 0:
        return 1.0
    denominator = u_norm if weight_decay is None else u_norm + w_norm * weight_decay
    return trust_coeff * w_norm / (denominator + eps)


def _lars_ratio(
    w_norm: Coef,
    g_norm: Coef,
    *,
    lr: Coef,
    trust_coeff: Coef,
    weight_decay: Coef,
    eps: Coef,
    trust_clip: bool,
) -> Coef:
    """timm's ``trust_coeff * |p| / (|g| + weight_decay * |p| + eps)`` (`trust_ratio`), or 1
    where either norm is 0; with `trust_clip` (LARC), divided by lr and at most 1."""
    ratio = trust_ratio(w_norm, g_norm, trust_coeff, eps, weight_decay)
    if not trust_clip:
        return ratio
    ratio = ratio / lr  # (a tensor where lr is one)
    return torch.clamp(ratio, max=1.0) if isinstance(ratio, Tensor) else min(ratio, 1.0)


def _lars_math(
    o: Ops, out: Tensor | None, p: Tensor, g: Tensor, momentum_buffer: Tensor | None, coefficients: tuple[Coef],
    *, lr: Coef, momentum: Coef, dampening: Coef = 0.0, weight_decay: Coef, nesterov: bool, trust_coeff: Coef,
    eps: Coef, trust_clip: bool = False, always_adapt: bool = False, **_: Any,
) -> tuple[Tensor, tuple[Tensor | None]]:  # fmt: skip
    (neg_lr,) = coefficients
    if nonzero(weight_decay) or always_adapt:  # timm adapts params with weight decay only, by default
        norms = o.item(torch.linalg.vector_norm(p)), o.item(torch.linalg.vector_norm(g))
        ratio = _lars_ratio(
            *norms, lr=lr, trust_coeff=trust_coeff, weight_decay=weight_decay, eps=eps, trust_clip=trust_clip
        )
        g = o.mul_(o.add(g, p, alpha=weight_decay), ratio)
    if nonzero(momentum):  # SGD's, of the scaled gradient
        g, momentum_buffer = momentum_step(o, g, momentum_buffer, momentum, dampening, nesterov)
    out = o.add_(out, g, alpha=neg_lr)
    return out, (momentum_buffer,)


LARS = DampedFromSecondStep(
    name="Lars",
    state=LarsState,
    counters=(),
    initial=_lars_initial,
    schedule=_lr_schedule,
    elementwise=_lars_math,
    bounds=(
        Bound("lr", "Invalid learning rate: {}"),
        Bound("momentum", "Invalid momentum value: {}"),
        Bound("weight_decay", "Invalid weight_decay value: {}"),
        Check(sgd_validate),  # SGD's Nesterov rule
    ),
    per_element=False,  # the trust ratio: norms of the param and its gradient
    needs_params=True,  # the param's norm
)


# ---------------------------------------------------------------- NovoGrad (timm's NvNovoGrad)


class NovoGradState(NamedTuple):
    """NovoGrad's per-param state: the step count, the momentum, the second moment of the
    gradient's norm and its running maximum with ``amsgrad`` (one number per param, 0-d
    tensors)."""

    step: Params
    exp_avg: Params
    exp_avg_sq: Params
    max_exp_avg_sq: Params


def _scalar_like(p: Tensor) -> Tensor:
    """A param's 0-d buffer, 0, in its dtype and on its device."""
    return torch.zeros((), dtype=p.dtype, device=p.device)


def _novograd_initial(*, amsgrad: bool = False, **_: Any) -> NovoGradState:
    return NovoGradState(
        step=0.0, exp_avg=0.0, exp_avg_sq=_scalar_like, max_exp_avg_sq=_scalar_like if amsgrad else None
    )


def _novograd_schedule(
    step: Coef, *, lr: Coef, weight_decay: Coef, corrected_weight_decay: bool = False,
    max_lr_snapshot: Coef = 1.0, **_: Any,
) -> tuple[tuple[Coef], tuple]:  # fmt: skip
    scale = lr**2 / max_lr_snapshot if corrected_weight_decay else lr
    return (step + 1,), (-lr, 1 - scale * weight_decay)


def _novograd_math(
    o: Ops, out: Tensor | None, p: Tensor, g: Tensor, exp_avg: Tensor, exp_avg_sq: Tensor,
    max_exp_avg_sq: Tensor | None, coefficients: tuple[Coef, Coef], *, betas: tuple[Coef, Coef], eps: Coef,
    weight_decay: Coef, grad_averaging: bool = False, amsgrad: bool = False, decoupled_decay: bool = False,
    eps_root: Coef = 0.0, first_step: bool | Tensor | None = None, **_: Any,
) -> tuple[Tensor, tuple[Tensor, Tensor, Tensor | None]]:  # fmt: skip
    """timm's NvNovoGrad step; funcopt only, for ``scale_by_novograd`` (optax's):
    `eps_root`, inside the root, and `first_step`, whether this is the first step (a bool
    or a 0-d bool tensor, from optax's count), where timm tests for a second moment still 0."""
    neg_lr, decay = coefficients
    beta1, beta2 = betas
    if g.is_complex():  # |g|^2, as a complex number (whose buffer is complex, as optax's)
        norm = torch.sum(g.real.square() + g.imag.square()).to(g.dtype)
    else:
        norm = torch.sum(g * g)
    # timm: a second moment still 0 takes the squared norm itself (the first step)
    blended = o.add(o.mul(exp_avg_sq, beta2), norm, alpha=1 - beta2)
    first = o.eq(exp_avg_sq, 0) if first_step is None else first_step
    exp_avg_sq = o.copy_(exp_avg_sq, o.where(first, norm, blended))
    if amsgrad:
        max_exp_avg_sq = o.maximum_(max_exp_avg_sq, exp_avg_sq)
    second = max_exp_avg_sq if amsgrad else exp_avg_sq
    update = o.div(g, o.add_(o.sqrt(o.add(second, eps_root) if nonzero(eps_root) else second), eps))
    if nonzero(weight_decay):
        if decoupled_decay:
            out = o.decay_(out, p, decay)
        else:
            update = o.add_(update, p, alpha=weight_decay)
    if grad_averaging:
        update = o.mul_(update, 1 - beta1)
    exp_avg = o.add_(o.mul_(exp_avg, beta1), update)
    out = o.add_(out, exp_avg, alpha=neg_lr)
    return out, (exp_avg, exp_avg_sq, max_exp_avg_sq)


NOVOGRAD = Algorithm(
    name="NovoGrad",
    state=NovoGradState,
    counters=("step",),
    initial=_novograd_initial,
    schedule=_novograd_schedule,
    elementwise=_novograd_math,
    bounds=_bounds(0, 1),
    per_element=False,  # the second moment of each gradient's norm
    buffers_like_param=False,  # that second moment: one number per param
)


# ---------------------------------------------------------------- MADGRAD (timm's)


class MADGRADState(NamedTuple):
    """MADGRAD's per-param state: the step count, the weighted sums of the squared
    gradients and of the gradients, and the initial param (the authors' keys; no ``x0``
    without momentum, as timm)."""

    step: Params
    grad_sum_sq: Params
    s: Params
    x0: Params


def _clone(p: Tensor) -> Tensor:
    return torch.clone(p, memory_format=torch.preserve_format)


def _madgrad_initial(*, momentum: Coef = 0.9, **_: Any) -> MADGRADState:
    return MADGRADState(step=0.0, grad_sum_sq=0.0, s=0.0, x0=_clone if nonzero(momentum) else None)


def _madgrad_schedule(
    step: Coef, *, lr: Coef, eps: Coef, weight_decay: Coef, **_: Any
) -> tuple[tuple[Coef], tuple]:
    """The weight ``(lr + eps) * sqrt(k + 1)`` of the k-th step (from 0), in double
    precision (optax rounds ``sqrt(k + 1)`` to float32), and the decoupled decay factor."""
    root = torch.sqrt(step + 1) if isinstance(step, Tensor) else math.sqrt(step + 1)
    return (step + 1,), ((lr + eps) * root, 1 - lr * weight_decay)


def _madgrad_math(
    o: Ops, out: Tensor | None, p: Tensor, g: Tensor, grad_sum_sq: Tensor, s: Tensor, x0: Tensor | None,
    coefficients: tuple[Coef, Coef], *, momentum: Coef, weight_decay: Coef, eps: Coef,
    decoupled_decay: bool = False, stored_x0: bool = False, **_: Any,
) -> tuple[Tensor, tuple[Tensor, Tensor, Tensor | None]]:  # fmt: skip
    """timm's MADGRAD step; funcopt only, for ``scale_by_madgrad`` (optax's): `stored_x0`,
    the dual average from the stored x0 also without momentum, where timm recovers x0 from
    the param (the same while only this step moves the param)."""
    weight, decay = coefficients
    factor = 1.0  # what multiplies the param: decoupled decay, then momentum
    if nonzero(weight_decay):
        if decoupled_decay:
            factor = decay
        else:
            g = o.add(g, p, alpha=weight_decay)
    recover_x0 = not nonzero(momentum) and not stored_x0
    if recover_x0:  # timm keeps no x0: the param plus s / rms, before this step
        if isinstance(factor, Tensor) or factor != 1.0:
            out = o.decay_(out, p, factor)
        out = o.addcdiv_(out, s, o.add_(torch.pow(grad_sum_sq, 1 / 3), eps))
    grad_sum_sq = o.addcmul_(grad_sum_sq, g, g, value=weight)
    s = o.add_(s, g, alpha=weight)
    denom = o.add_(torch.pow(grad_sum_sq, 1 / 3), eps)  # one tensor: not per_element, for this op
    if recover_x0:
        return o.addcdiv_(out, s, denom, value=-1), (grad_sum_sq, s, x0)
    # the param moves to momentum * p + (1 - momentum) * z, with z = x0 - s / denom
    out = o.decay_(out, p, factor * momentum)
    out = o.addcdiv_(o.add_(out, x0, alpha=1 - momentum), s, denom, value=-(1 - momentum))
    return out, (grad_sum_sq, s, x0)


MADGRAD = Algorithm(
    name="MADGRAD",
    state=MADGRADState,
    counters=("step",),
    initial=_madgrad_initial,
    schedule=_madgrad_schedule,
    elementwise=_madgrad_math,
    bounds=_bounds(momentum=True),
    per_element=False,  # the cube root, which the engine's list ops lack
    needs_params=True,  # the step moves the param towards its dual average
)
