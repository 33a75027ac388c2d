"""optax.contrib's step-size-adaptive optimizers (optax's names, arguments and math):
`dadapt_adamw`, `prodigy`, `momo`, `momo_adam`, `reduce_on_plateau`.

Each is one transformation, its learning rate (a number, a 0-d tensor or a schedule)
read inside at the step count. `momo`, `momo_adam` and `reduce_on_plateau` need the loss:
``update(grads, state, params, value=loss)``; `fo.Optimizer`'s ``step(closure)`` passes it.
Where optax branches (``lax.cond``), these compute both sides and pick with
``torch.where``, so that a compiled step is one graph."""

from __future__ import annotations

import functools
from typing import Any, NamedTuple, cast

import torch
from torch import Tensor

from ..core.base import GradientTransformation, Params, State, Updates, a_kind, flatten_together
from ..transforms.clipping import Scalar
from ._common import (
    _check_state,
    _count,
    _highest_dtype,
    _increment,
    _lowest_dtype,
    check_params,
    copy,
    device_of,
    leafwise,
    require_value,
    scalar,
    vdot,
    zeros,
)
from .distance_math import PURE, Group, dadapt_step, prodigy_step
from .loss_step_math import momo_step

__all__ = [
    "DAdaptAdamWState",
    "MomoAdamState",
    "MomoState",
    "ProdigyState",
    "ReduceLROnPlateauState",
    "dadapt_adamw",
    "momo",
    "momo_adam",
    "prodigy",
    "reduce_on_plateau",
]

_EPS64 = torch.finfo(torch.float64).eps  # optax's jnp.finfo(float).eps, with x64


def _at(value: Any, count: Tensor) -> Any:
    return value(count) if callable(value) else value


def _wide(count: Tensor) -> Tensor:
    return count.to(torch.float64 if count.device.type != "mps" else torch.float32)


# ---------------------------------------------------------------- D-Adaptation


class DAdaptAdamWState(NamedTuple):
    """D-Adapt AdamW's moments, its weighted gradient sum, the estimated step size, its
    numerator, and the step count (optax's names)."""

    exp_avg: Params
    exp_avg_sq: Params
    grad_sum: Params
    estim_lr: Tensor
    numerator_weighted: Tensor
    count: Tensor  # type: ignore[assignment]  # optax's name, which shadows tuple.count


def _dadapt_init(estim_lr0: Scalar, params: Params) -> DAdaptAdamWState:
    dtype, device = _lowest_dtype(params), device_of(params)
    return DAdaptAdamWState(
        zeros(params), zeros(params), zeros(params), scalar(estim_lr0, dtype, device),
        torch.zeros((), dtype=dtype, device=device), _count(params),
    )  # fmt: skip


def _dadapt_update(
    learning_rate: Any, betas: tuple[Scalar, Scalar], eps: Scalar, weight_decay: Scalar, bias_correction: bool,
    updates: Updates, state: State, params: Params | None = None, **extra_args: Any,
) -> tuple[Updates, State]:  # fmt: skip
    who = "dadapt_adamw update"
    _check_state(state, DAdaptAdamWState, who)
    check_params(who, params)
    count = _increment(state.count)
    lists, put_back = _present(who, updates, params, state.exp_avg, state.exp_avg_sq, state.grad_sum)
    [(out, *buffers)], scalars = dadapt_step(
        PURE, [(Group(eps, weight_decay), None, *lists)], state.estim_lr, state.numerator_weighted, _wide(count),
        lr=_at(learning_rate, state.count), betas=(betas[0], betas[1]), bias_correction=bias_correction,
    )  # fmt: skip
    estim_lr, numerator = cast(tuple[Tensor, Tensor], scalars)  # (PURE never skips)
    out, exp_avg, exp_avg_sq, grad_sum = put_back(out, *buffers)
    dtype = state.estim_lr.dtype
    return out, DAdaptAdamWState(
        exp_avg, exp_avg_sq, grad_sum, estim_lr.to(dtype), numerator.to(dtype), count
    )


def _present(who: str, updates: Updates, params: Params, *buffers: Any) -> tuple[list[list[Tensor]], Any]:
    """The leaves with an update, as lists: (params, updates, *buffers), and a function
    that puts the new update and buffers back in trees (an absent update stays None, its
    buffers as they were)."""
    names = (f"{who}: updates", "params", *(f"state field {i}" for i in range(len(buffers))))
    columns, unflatten = flatten_together(
        updates, params, *buffers, names=names,
        hint="Pass updates with the structure of the params given to init, and the state it returned.",
    )  # fmt: skip
    gs, ps, *bufs = columns
    idx = [i for i, g in enumerate(gs) if g is not None]
    for i in idx:
        for name, column in zip(names[1:], (ps, *bufs)):
            if not isinstance(column[i], Tensor):
                raise ValueError(
                    f"{who}: leaf {i} has an update but {name} holds {a_kind(column[i])} for it; init with "
                    "a tensor in that place and pass the params to update"
                )
    lists = [[column[i] for i in idx] for column in (ps, gs, *bufs)]

    def put_back(out: list[Tensor], *new: list[Tensor]) -> tuple[Any, ...]:
        trees = []
        for old, values in zip((gs, *bufs), (out, *new)):
            column = list(old)
            for i, v in zip(idx, values):
                column[i] = v
            trees.append(unflatten(column))
        return tuple(trees)

    return lists, put_back


def _with_buffers(who: str, one: Any, updates: Updates, *buffers: Any) -> tuple[Any, ...]:
    """`one(g, *buffers) -> new buffers` over the leaves: (updates, *new buffers)."""
    return leafwise(who, lambda g, *b: (g, *one(g, *b)), updates, *buffers, n_out=1 + len(buffers))


def dadapt_adamw(
    learning_rate: Any = 1.0,
    betas: tuple[Scalar, Scalar] = (0.9, 0.999),
    eps: Scalar = 1e-8,
    estim_lr0: Scalar = 1e-6,
    weight_decay: Scalar = 0.0,
    *,
    bias_correction: bool = True,
) -> GradientTransformation:
    """D-Adaptation AdamW (Defazio and Mishchenko 2023; optax.contrib's ``dadapt_adamw``):
    AdamW whose step size is estimated from the distance travelled. `learning_rate` is
    a multiplier of the estimate. `update` needs the params. ``bias_correction=False``
    (funcopt's addition; the authors' ``dadaptation`` default) leaves Adam's bias
    correction out of the step size: ``DAdaptAdam(decouple=True)`` then.

    Example:
        >>> import torch, funcopt as fo
        >>> tx = fo.dadapt_adamw()
        >>> tx.init([torch.zeros(2)]).estim_lr
        tensor(1.0000e-06)
    """
    return GradientTransformation(
        functools.partial(_dadapt_init, estim_lr0),
        functools.partial(
            _dadapt_update, learning_rate, (betas[0], betas[1]), eps, weight_decay, bias_correction
        ),
    )


# ---------------------------------------------------------------- Prodigy


class ProdigyState(NamedTuple):
    """Prodigy's moments, weighted gradient sum, initial params, estimated step size,
    its numerator, and the step count (optax's names)."""

    exp_avg: Params
    exp_avg_sq: Params
    grad_sum: Params
    params0: Params
    estim_lr: Tensor
    numerator_weighted: Tensor
    count: Tensor  # type: ignore[assignment]  # optax's name, which shadows tuple.count


def _prodigy_init(estim_lr0: Scalar, params: Params) -> ProdigyState:
    dtype, device = _lowest_dtype(params), device_of(params)
    return ProdigyState(
        zeros(params), zeros(params), zeros(params), copy(params), scalar(estim_lr0, dtype, device),
        torch.zeros((), dtype=dtype, device=device), _count(params),
    )  # fmt: skip


def _prodigy_update(
    learning_rate: Any, betas: tuple[Scalar, Scalar], beta3: Scalar | None, eps: Scalar, estim_lr0: Scalar,
    estim_lr_coef: Scalar, weight_decay: Scalar, safeguard_warmup: bool, bias_correction: bool,
    updates: Updates, state: State, params: Params | None = None, **extra_args: Any,
) -> tuple[Updates, State]:  # fmt: skip
    who = "prodigy update"
    _check_state(state, ProdigyState, who)
    check_params(who, params)
    count = _increment(state.count)
    lists, put_back = _present(
        who, updates, params, state.exp_avg, state.exp_avg_sq, state.grad_sum, state.params0
    )
    group = Group(eps, weight_decay, d0=estim_lr0, safeguard_warmup=safeguard_warmup)
    [(out, *buffers)], scalars = prodigy_step(
        PURE, [(group, None, *lists)], state.estim_lr, state.numerator_weighted, _wide(count),
        lr=_at(learning_rate, state.count), betas=(betas[0], betas[1]), beta3=beta3, d_coef=estim_lr_coef,
        bias_correction=bias_correction,
    )  # fmt: skip
    estim_lr, numerator, _ = cast(tuple[Tensor, Tensor, Tensor], scalars)  # (PURE never skips)
    out, exp_avg, exp_avg_sq, grad_sum, _ = put_back(out, *buffers)
    dtype = state.estim_lr.dtype
    new = ProdigyState(
        exp_avg, exp_avg_sq, grad_sum, state.params0, estim_lr.to(dtype), numerator.to(dtype), count
    )
    return out, new


def prodigy(
    learning_rate: Any = 1.0,
    betas: tuple[Scalar, Scalar] = (0.9, 0.999),
    beta3: Scalar | None = None,
    eps: Scalar = 1e-8,
    estim_lr0: Scalar = 1e-6,
    estim_lr_coef: Scalar = 1.0,
    weight_decay: Scalar = 0.0,
    safeguard_warmup: bool = False,
    *,
    bias_correction: bool = True,
) -> GradientTransformation:
    """Prodigy (Mishchenko and Defazio 2023; optax.contrib's ``prodigy``): Adam whose
    step size is estimated from the distance to the initial params. `learning_rate` is
    a multiplier of the estimate. `update` needs the params. ``bias_correction=False``
    (funcopt's addition; the default of the authors' ``prodigyopt``) leaves Adam's bias
    correction out of the step size, as ``prodigyopt.Prodigy`` then steps.

    Example:
        >>> import torch, funcopt as fo
        >>> tx = fo.prodigy()
        >>> tx.init([torch.zeros(2)]).estim_lr
        tensor(1.0000e-06)
    """
    return GradientTransformation(
        functools.partial(_prodigy_init, estim_lr0),
        functools.partial(
            _prodigy_update, learning_rate, (betas[0], betas[1]), beta3, eps, estim_lr0, estim_lr_coef, weight_decay,
            safeguard_warmup, bias_correction,
        ),
    )  # fmt: skip


# ---------------------------------------------------------------- MoMo


class MomoState(NamedTuple):
    """MoMo's momentum, loss average, its inner-product average, lower bound and step
    count (optax's names)."""

    exp_avg: Params
    barf: Tensor
    gamma: Tensor
    lb: Tensor
    count: Tensor  # type: ignore[assignment]  # optax's name, which shadows tuple.count


def _momo_init(lower_bound: Scalar, params: Params) -> MomoState:
    dtype, device = _lowest_dtype(params), device_of(params)
    z = torch.zeros((), dtype=dtype, device=device)
    return MomoState(zeros(params), z, z.clone(), scalar(lower_bound, dtype, device), _count(params))


def _momo_update(
    learning_rate: Any, beta: Scalar, lower_bound: Scalar, weight_decay: Scalar, adapt_lower_bound: bool,
    updates: Updates, state: State, params: Params | None = None, *, value: Any = None, **extra_args: Any,
) -> tuple[Updates, State]:  # fmt: skip
    who = "momo update"
    _check_state(state, MomoState, who)
    check_params(who, params)
    value = require_value(who, value)
    dtype = state.barf.dtype
    (ps, gs, exp_avg), put_back = _present(who, updates, params, state.exp_avg)
    out, exp_avg, (barf, gamma, lb) = momo_step(
        PURE, None, ps, gs, exp_avg, (state.barf, state.gamma, state.lb), state.count == 0,
        torch.as_tensor(value).to(dtype), lr=_at(learning_rate, state.count),
        beta=scalar(beta, torch.float64, state.count.device), lower_bound=lower_bound, weight_decay=weight_decay,
        adapt_lower_bound=adapt_lower_bound,
    )  # fmt: skip
    out, exp_avg = put_back(out, exp_avg)
    return out, MomoState(exp_avg, barf.to(dtype), gamma.to(dtype), lb.to(dtype), _increment(state.count))


def momo(
    learning_rate: Any = 1.0,
    beta: Scalar = 0.9,
    lower_bound: Scalar = 0.0,
    weight_decay: Scalar = 0.0,
    adapt_lower_bound: bool = False,
) -> GradientTransformation:
    """MoMo (Schaipp et al. 2023; optax.contrib's ``momo``): SGD with momentum and a
    Polyak-type step size from a model of the loss, capped at `learning_rate`. `update`
    needs the params and the loss: ``update(g, state, params, value=loss)``.

    Example:
        >>> import torch, funcopt as fo
        >>> tx = fo.momo()
        >>> p = [torch.zeros(2)]
        >>> tx.update([torch.tensor([1.0, 1.0])], tx.init(p), p, value=torch.tensor(0.5))[0]
        [tensor([-0.2500, -0.2500])]
    """
    return GradientTransformation(
        functools.partial(_momo_init, lower_bound),
        functools.partial(_momo_update, learning_rate, beta, lower_bound, weight_decay, adapt_lower_bound),
    )


class MomoAdamState(NamedTuple):
    """MoMo-Adam's moments, loss average, inner-product average, lower bound and step
    count (optax's names)."""

    exp_avg: Params
    exp_avg_sq: Params
    barf: Tensor
    gamma: Tensor
    lb: Tensor
    count: Tensor  # type: ignore[assignment]  # optax's name, which shadows tuple.count


def _momo_adam_init(lower_bound: Scalar, params: Params) -> MomoAdamState:
    dtype, device = _lowest_dtype(params), device_of(params)
    z = torch.zeros((), dtype=dtype, device=device)
    return MomoAdamState(
        zeros(params), zeros(params), z, z.clone(), scalar(lower_bound, dtype, device), _count(params)
    )


def _momo_adam_update(
    learning_rate: Any, b1: Scalar, b2: Scalar, eps: Scalar, lower_bound: Scalar, weight_decay: Scalar,
    adapt_lower_bound: bool, updates: Updates, state: State, params: Params | None = None, *, value: Any = None,
    **extra_args: Any,
) -> tuple[Updates, State]:  # fmt: skip
    who = "momo_adam update"
    _check_state(state, MomoAdamState, who)
    check_params(who, params)
    value = require_value(who, value)
    dtype = state.barf.dtype
    count = _increment(state.count)
    barf = b1 * state.barf + (1 - b1) * torch.as_tensor(value).to(dtype)

    def moments(g: Tensor, ea0: Tensor, eas0: Tensor) -> tuple[Tensor, ...]:
        return b1 * ea0 + (1 - b1) * g, b2 * eas0 + (1 - b2) * g * g

    _, exp_avg, exp_avg_sq = _with_buffers(who, moments, updates, state.exp_avg, state.exp_avg_sq)
    bc2 = (1 - b2 ** _wide(count)).to(dtype)
    precond = leafwise(who, lambda eas: (eps + torch.sqrt(eas / bc2.to(eas.dtype)),), exp_avg_sq)[0]
    exp_avg_weighted = leafwise(who, lambda ea, pc: (ea / pc,), exp_avg, precond)[0]
    exp_avg_norm = vdot(exp_avg, exp_avg_weighted)
    gamma = b1 * state.gamma + (1 - b1) * vdot(updates, params)
    iprod = vdot(exp_avg, params)
    alpha = _at(learning_rate, state.count)
    bc1 = (1 - b1 ** _wide(count)).to(dtype)
    wd = 1 + alpha * weight_decay
    if adapt_lower_bound:
        cap = wd * (barf - gamma) + iprod
        this_lb = torch.where(
            cap < wd * bc1 * state.lb, torch.clamp(cap / (2 * bc1 * wd), min=lower_bound), state.lb
        )
    else:
        this_lb = state.lb
    t1 = torch.clamp(wd * (barf - bc1 * this_lb - gamma) + iprod, min=0.0) / exp_avg_norm
    t1 = torch.where(exp_avg_norm <= _EPS64, 0.0, t1)
    tau = torch.minimum(alpha / bc1, t1)
    decay = (alpha * weight_decay) / wd
    out = leafwise(
        who, lambda ea, pc, p: (-decay * p - tau.to(p.dtype) * ea / pc,), exp_avg, precond, params
    )[0]
    if adapt_lower_bound:
        new_lb = torch.clamp(((barf + iprod - gamma) - 0.5 * tau * exp_avg_norm) / bc1, min=lower_bound)
    else:
        new_lb = state.lb
    new = MomoAdamState(exp_avg, exp_avg_sq, barf.to(dtype), gamma.to(dtype), new_lb.to(dtype), count)
    return out, new


def momo_adam(
    learning_rate: Any = 1e-2,
    b1: Scalar = 0.9,
    b2: Scalar = 0.999,
    eps: Scalar = 1e-8,
    lower_bound: Scalar = 0.0,
    weight_decay: Scalar = 0.0,
    adapt_lower_bound: bool = False,
) -> GradientTransformation:
    """MoMo-Adam (Schaipp et al. 2023; optax.contrib's ``momo_adam``): MoMo's step size
    with Adam's preconditioning. `update` needs the params and the loss (``value=``).

    Example:
        >>> import torch, funcopt as fo
        >>> len(fo.momo_adam().init([torch.zeros(2)]))
        6
    """
    return GradientTransformation(
        functools.partial(_momo_adam_init, lower_bound),
        functools.partial(
            _momo_adam_update, learning_rate, b1, b2, eps, lower_bound, weight_decay, adapt_lower_bound
        ),
    )


# ---------------------------------------------------------------- reduce on plateau


class ReduceLROnPlateauState(NamedTuple):
    """The current scale, the best loss, the steps without improvement, the cooldown
    left, the losses accumulated and their average (optax's names)."""

    scale: Tensor
    best_value: Tensor
    plateau_count: Tensor
    cooldown_count: Tensor
    count: Tensor  # type: ignore[assignment]  # optax's name, which shadows tuple.count
    avg_value: Tensor


def _plateau_init(params: Params) -> ReduceLROnPlateauState:
    low, high, device = _lowest_dtype(params), _highest_dtype(params), device_of(params)
    i0 = torch.zeros((), dtype=torch.int32, device=device)
    return ReduceLROnPlateauState(
        torch.ones((), dtype=low, device=device), torch.full((), float("inf"), dtype=high, device=device),
        i0, i0.clone(), i0.clone(), torch.zeros((), dtype=high, device=device),
    )  # fmt: skip


def _plateau_scale(
    factor: float,
    patience: Any,
    rtol: float,
    atol: float,
    cooldown: Any,
    min_scale: Any,
    s: ReduceLROnPlateauState,
) -> ReduceLROnPlateauState:
    """optax's ``_update_scale``, both of its branches computed and one picked."""
    improved = s.avg_value < (1 - rtol) * s.best_value - atol
    best = torch.where(improved, s.avg_value.to(s.best_value.dtype), s.best_value)
    plateau = torch.where(improved, 0, _increment(s.plateau_count)).to(torch.int32)
    hit = plateau == patience
    cooling = s.cooldown_count > 0
    zero = torch.zeros_like(s.plateau_count)
    new_plateau = torch.where(cooling, zero, torch.where(hit, zero, plateau))
    reduced = torch.clamp(torch.where(hit, s.scale * factor, s.scale), min=min_scale).to(s.scale.dtype)
    new_scale = torch.where(cooling, s.scale, reduced)
    new_cooldown = torch.where(cooling, s.cooldown_count - 1, torch.where(hit, cooldown, 0)).to(torch.int32)
    return ReduceLROnPlateauState(
        new_scale, best, new_plateau, new_cooldown, zero, torch.zeros_like(s.avg_value)
    )


def _plateau_update(
    factor: float, patience: Any, rtol: float, atol: float, cooldown: Any, accumulation_size: Any, min_scale: Any,
    updates: Updates, state: State, params: Params | None = None, *, value: Any = None, **extra_args: Any,
) -> tuple[Updates, State]:  # fmt: skip
    who = "reduce_on_plateau update"
    _check_state(state, ReduceLROnPlateauState, who)
    value = require_value(who, value)
    new_count = _increment(state.count)
    avg = (state.count * state.avg_value + torch.as_tensor(value).to(state.avg_value.dtype)) / new_count
    s = state._replace(avg_value=avg.to(state.avg_value.dtype), count=new_count)
    rescaled = _plateau_scale(factor, patience, rtol, atol, cooldown, min_scale, s)
    due = new_count == accumulation_size
    s = ReduceLROnPlateauState(*(torch.where(due, a, b) for a, b in zip(rescaled, s)))
    out = leafwise(who, lambda g: (s.scale.to(g.dtype) * g,), updates)[0]
    return out, s


def reduce_on_plateau(
    factor: float = 0.1,
    patience: int = 10,
    rtol: float = 1e-4,
    atol: float = 0.0,
    cooldown: int = 0,
    accumulation_size: int = 1,
    min_scale: float = 0.0,
) -> GradientTransformation:
    """Scale the updates by `factor` each time the loss (averaged over
    `accumulation_size` steps) has not improved by ``rtol`` relative and ``atol``
    absolute for `patience` averages (optax.contrib's ``reduce_on_plateau``; torch's
    ``ReduceLROnPlateau`` as a transformation). `update` needs the loss (``value=``).

    Example:
        >>> import torch, funcopt as fo
        >>> tx = fo.reduce_on_plateau(patience=1)
        >>> g, s = [torch.ones(1)], None
        >>> s = tx.init(g)
        >>> for loss in (1.0, 1.0, 1.0):
        ...     u, s = tx.update(g, s, value=torch.tensor(loss))
        >>> u
        [tensor([0.0100])]
    """
    if not 0.0 < factor < 1.0:
        raise ValueError(f"reduce_on_plateau: factor must be in the range (0, 1), got {factor}")
    if rtol < 0.0 or atol < 0.0:
        raise ValueError(
            f"reduce_on_plateau: rtol and atol must be non-negative, got rtol={rtol}, atol={atol}"
        )
    if rtol == 0.0 and atol == 0.0:
        raise ValueError("reduce_on_plateau: at least one of rtol or atol must be positive, got both 0")
    if rtol > 1.0:
        raise ValueError(f"reduce_on_plateau: rtol must be at most 1, got {rtol}")
    return GradientTransformation(
        _plateau_init,
        functools.partial(
            _plateau_update, factor, patience, rtol, atol, cooldown, accumulation_size, min_scale
        ),
    )
