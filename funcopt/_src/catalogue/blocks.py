"""optax's moment-based scaling blocks, for `chain` (optax's names, arguments and math):
`scale_by_belief`, `scale_by_radam`, `scale_by_yogi`, `scale_by_amsgrad`,
`scale_by_adamax`, `scale_by_adan`, `scale_by_novograd`,
`scale_by_optimistic_gradient` (and, in accumulators.py, `scale_by_stddev`,
`scale_by_rss`, `scale_by_sm3`).

Each is a pure `GradientTransformation` whose state keeps one structure from `init` on.
Hyperparameters may be numbers, 0-d tensors or schedules (functions of the step count,
`accepts_schedules`). A None update passes through, its buffers keeping their values.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import optree
import torch
from torch import Tensor

from ..algorithms import adam
from ..algorithms.adamax import ADAMAX
from ..algorithms.catalogue_more import NOVOGRAD, YOGI
from ..algorithms.lamb_adan import ADABELIEF, ADAN
from ..algorithms.lion import LION
from ..algorithms.radam import RADAM
from ..core.base import GradientTransformation, Params, State, Updates
from ..core.hyperparams import accepts_schedules
from ..engine.ops import nonzero
from ..transforms.blocks import wide_count, wide_dtype
from ..transforms.clipping import Scalar, coef, map_updates
from ..transforms.from_algorithm import BlockMath, betas_and_eps, step_leaves
from ..transforms.moments import ScaleByAdamState
from ._common import (
    _check_state,
    _count,
    _increment,
    check_params,
    device_of,
    full,
    leafwise,
    zeros,
)

__all__ = [
    "ScaleByAdanState",
    "ScaleByAmsgradState",
    "ScaleByBeliefState",
    "ScaleByLionState",
    "ScaleByNovogradState",
    "ScaleByOptimisticGradientState",
    "scale_by_adamax",
    "scale_by_adan",
    "scale_by_amsgrad",
    "scale_by_belief",
    "scale_by_lion",
    "scale_by_novograd",
    "scale_by_optimistic_gradient",
    "scale_by_radam",
    "scale_by_yogi",
]


# ---------------------------------------------------------------- AdaBelief


class ScaleByBeliefState(NamedTuple):
    """The step count, the first moment and the second central moment (optax's names)."""

    count: Tensor  # type: ignore[assignment]  # optax's name, which shadows tuple.count
    mu: Params
    nu: Params


def _belief_init(params: Params) -> ScaleByBeliefState:
    return ScaleByBeliefState(_count(params), zeros(params), zeros(params))


def _belief_update(
    b1: Scalar, b2: Scalar, eps: Scalar, eps_root: Scalar, nesterov: bool,
    updates: Updates, state: State, params: Params | None = None, **extra_args: Any,
) -> tuple[Updates, State]:  # fmt: skip
    """`fo.AdaBelief`'s math (``lamb_adan._adabelief_math``), not rectified, with a learning
    rate of -1 (``transforms/from_algorithm.py``), its coefficients from its schedule."""
    who = "scale_by_belief update"
    _check_state(state, ScaleByBeliefState, who)
    nesterov = bool(nesterov)
    _, coefficients = ADABELIEF.schedule(
        wide_count(state.count), lr=-1, betas=(b1, b2), weight_decay=0, rectify=False, nesterov=nesterov
    )
    math = BlockMath(
        ADABELIEF.elementwise, 4, betas_and_eps, absent=1, weight_decay=0, rectify=False, nesterov=nesterov
    )
    scalars = (*coefficients, b1, b2, eps, eps_root)
    out, (mu, nu) = step_leaves(who, math, scalars, updates, state, ("mu", "nu"), (None, None))
    return out, ScaleByBeliefState(_increment(state.count), mu, nu)


@accepts_schedules
def scale_by_belief(
    b1: Scalar = 0.9,
    b2: Scalar = 0.999,
    eps: Scalar = 1e-16,
    eps_root: Scalar = 1e-16,
    *,
    nesterov: bool = False,
) -> GradientTransformation:
    """AdaBelief's scaling (Zhuang et al. 2020; optax's ``scale_by_belief``): Adam's,
    with the second moment of the prediction error ``g - mu`` in place of ``g**2``.

    Example:
        >>> import torch, funcopt as fo
        >>> tx = fo.scale_by_belief()
        >>> g = [torch.tensor([1.0, -1.0])]
        >>> tx.update(g, tx.init(g))[0][0].shape
        torch.Size([2])
    """
    return GradientTransformation(
        _belief_init, functools.partial(_belief_update, b1, b2, eps, eps_root, nesterov)
    )


# ---------------------------------------------------------------- Lion


class ScaleByLionState(NamedTuple):
    """The step count and Lion's momentum, like the params (optax's ``ScaleByLionState``)."""

    count: Tensor  # type: ignore[assignment]  # optax's name, which shadows tuple.count
    mu: Params


_LION_MODES = ("hard", "smooth", "refined")


def _lion_init(mu_dtype: torch.dtype | None, params: Params) -> ScaleByLionState:
    return ScaleByLionState(_count(params), zeros(params, mu_dtype))


def _lion_update(
    b1: Scalar, b2: Scalar, mu_dtype: torch.dtype | None, mode: str, smooth_beta: float,
    updates: Updates, state: State, params: Params | None = None, **extra_args: Any,
) -> tuple[Updates, State]:  # fmt: skip
    """`fo.Lion`'s math (``lion._math``, with optax's `mode`) with a learning rate of -1
    (``transforms/from_algorithm.py``), its coefficients from its schedule."""
    who = "scale_by_lion update"
    _check_state(state, ScaleByLionState, who)
    _, coefficients = LION.schedule(lr=-1, weight_decay=0)
    math = BlockMath(LION.elementwise, 2, _lion_betas, weight_decay=0, mode=mode, smooth_beta=smooth_beta)
    out, (mu,) = step_leaves(who, math, (*coefficients, b1, b2), updates, state, ("mu",), (mu_dtype,))
    return out, ScaleByLionState(_increment(state.count), mu)


def _lion_betas(b1: Any, b2: Any) -> dict[str, Any]:
    return {"betas": (b1, b2)}


@accepts_schedules
def scale_by_lion(
    b1: Scalar = 0.9,
    b2: Scalar = 0.99,
    mu_dtype: torch.dtype | None = None,
    *,
    mode: str = "hard",
    smooth_beta: float = 1.0,
) -> GradientTransformation:
    """Lion's scaling (Chen et al. 2023; optax's ``scale_by_lion``): the sign of
    ``(1 - b1) * g + b1 * mu``, then ``mu`` moves to ``g`` at rate ``1 - b2``. `mode`
    "smooth" takes ``tanh(smooth_beta * x)`` for the sign, "refined" keeps ``x`` where
    ``|x| < 1``. Chain it with `add_decayed_weights` and `scale_by_learning_rate` for
    Lion (`fo.lion` is that chain's math as one algorithm, whose math this block runs).

    Example:
        >>> import torch, funcopt as fo
        >>> tx = fo.scale_by_lion()
        >>> g = [torch.tensor([0.5, -2.0])]
        >>> tx.update(g, tx.init(g))[0]
        [tensor([ 1., -1.])]
    """
    if mode not in _LION_MODES:
        raise ValueError(f"scale_by_lion: unknown mode {mode!r}; pass one of {', '.join(_LION_MODES)}")
    return GradientTransformation(
        functools.partial(_lion_init, mu_dtype),
        functools.partial(_lion_update, b1, b2, mu_dtype, mode, smooth_beta),
    )


# ---------------------------------------------------------------- RAdam, Yogi, AMSGrad, AdaMax


def _adam_init(params: Params) -> ScaleByAdamState:
    return ScaleByAdamState(_count(params), zeros(params), zeros(params))


def _radam_update(
    b1: Scalar, b2: Scalar, eps: Scalar, eps_root: Scalar, threshold: Scalar, nesterov: bool,
    updates: Updates, state: State, params: Params | None = None, **extra_args: Any,
) -> tuple[Updates, State]:  # fmt: skip
    """`fo.RAdam`'s math (``radam._elementwise``) with a learning rate of -1
    (``transforms/from_algorithm.py``), its coefficients from its schedule with optax's
    `threshold` and `nesterov`. optax's denominator ``sqrt(nu / bc2 + eps_root) + eps``
    is RAdam's ``(sqrt(nu + eps_root * bc2) + eps * sqrt(bc2)) / sqrt(bc2)``."""
    who = "scale_by_radam update"
    _check_state(state, ScaleByAdamState, who)
    wide = wide_dtype(state.count)
    betas = tuple(b.to(wide) if isinstance(b, Tensor) else b for b in (b1, b2))  # rho_inf in float64
    _, coefficients = RADAM.schedule(
        state.count.to(wide), lr=-1, betas=betas, weight_decay=0, counter_dtypes=(None,),
        threshold=threshold, nesterov=nesterov,
    )  # fmt: skip
    root_bc2 = coefficients[1]
    root = eps_root * (root_bc2 * root_bc2) if nonzero(eps_root) else eps_root
    math = BlockMath(
        RADAM.elementwise, 4, betas_and_eps, lr=-1, weight_decay=0, decoupled_weight_decay=False,
        maximize=False, nesterov=bool(nesterov),
    )  # fmt: skip
    scalars = (*coefficients, b1, b2, eps * root_bc2, root)
    out, (mu, nu) = step_leaves(who, math, scalars, updates, state, ("mu", "nu"), (None, None))
    return out, ScaleByAdamState(_increment(state.count), mu, nu)


@accepts_schedules
def scale_by_radam(
    b1: Scalar = 0.9,
    b2: Scalar = 0.999,
    eps: Scalar = 1e-8,
    eps_root: Scalar = 0.0,
    threshold: Scalar = 5.0,
    *,
    nesterov: bool = False,
) -> GradientTransformation:
    """Rectified Adam's scaling (Liu et al. 2020; optax's ``scale_by_radam``): Adam's,
    rectified by its variance term once that is tractable (``ro >= threshold``), the
    bias-corrected first moment before.

    Example:
        >>> import torch, funcopt as fo
        >>> tx = fo.scale_by_radam()
        >>> g = [torch.tensor([2.0, -1.0])]
        >>> tx.update(g, tx.init(g))[0]  # the first steps: the first moment itself
        [tensor([ 2., -1.])]
    """
    return GradientTransformation(
        _adam_init, functools.partial(_radam_update, b1, b2, eps, eps_root, threshold, nesterov)
    )


def _yogi_init(initial_accumulator_value: Scalar, params: Params) -> ScaleByAdamState:
    return ScaleByAdamState(
        _count(params), full(params, initial_accumulator_value), full(params, initial_accumulator_value)
    )


def _yogi_update(
    b1: Scalar, b2: Scalar, eps: Scalar, eps_root: Scalar,
    updates: Updates, state: State, params: Params | None = None, **extra_args: Any,
) -> tuple[Updates, State]:  # fmt: skip
    """`fo.Yogi`'s math (``catalogue_more._yogi_math``) with a learning rate of -1
    (``transforms/from_algorithm.py``), its coefficients from its schedule."""
    who = "scale_by_yogi update"
    _check_state(state, ScaleByAdamState, who)
    _, coefficients = YOGI.schedule(wide_count(state.count), lr=-1, betas=(b1, b2))
    math = BlockMath(YOGI.elementwise, 4, betas_and_eps)
    scalars = (*coefficients, b1, b2, eps, eps_root)
    out, (mu, nu) = step_leaves(who, math, scalars, updates, state, ("mu", "nu"), (None, None))
    return out, ScaleByAdamState(_increment(state.count), mu, nu)


@accepts_schedules
def scale_by_yogi(
    b1: Scalar = 0.9,
    b2: Scalar = 0.999,
    eps: Scalar = 1e-3,
    eps_root: Scalar = 0.0,
    initial_accumulator_value: Scalar = 1e-6,
) -> GradientTransformation:
    """Yogi's scaling (Zaheer et al. 2018; optax's ``scale_by_yogi``): Adam's, with an
    additive second-moment update ``nu - (1 - b2) * sign(nu - g**2) * g**2``.

    Example:
        >>> import torch, funcopt as fo
        >>> tx = fo.scale_by_yogi()
        >>> g = [torch.ones(2)]
        >>> tx.init(g).nu[0]
        tensor([1.0000e-06, 1.0000e-06])
    """
    return GradientTransformation(
        functools.partial(_yogi_init, initial_accumulator_value),
        functools.partial(_yogi_update, b1, b2, eps, eps_root),
    )


class ScaleByAmsgradState(NamedTuple):
    """The step count, Adam's moments and the running maximum of the second (optax's names)."""

    count: Tensor  # type: ignore[assignment]  # optax's name, which shadows tuple.count
    mu: Params
    nu: Params
    nu_max: Params


def _amsgrad_init(mu_dtype: torch.dtype | None, params: Params) -> ScaleByAmsgradState:
    return ScaleByAmsgradState(_count(params), zeros(params, mu_dtype), zeros(params), zeros(params))


def _amsgrad_update(
    b1: Scalar, b2: Scalar, eps: Scalar, eps_root: Scalar, mu_dtype: torch.dtype | None, bc_mu: bool, bc_nu: bool,
    updates: Updates, state: State, params: Params | None = None, **extra_args: Any,
) -> tuple[Updates, State]:  # fmt: skip
    """`fo.Adam`'s math with amsgrad (``adam._elementwise``) with a learning rate of -1
    (``transforms/from_algorithm.py``), its coefficients from Adam's schedule (a step size
    of 1 without `bc_mu`, a ``bc2`` of 1 without `bc_nu`), optax's denominator and
    ``nu_max``, the running maximum of ``nu / bc2`` (``max_of_quotient``)."""
    who = "scale_by_amsgrad update"
    _check_state(state, ScaleByAmsgradState, who)
    _, (step_size, bc2_sqrt, bc2, decay) = adam._schedule(
        wide_count(state.count), lr=-1, betas=(b1, b2), weight_decay=0, counter_dtypes=(None,)
    )
    math = BlockMath(
        adam._elementwise, 4, betas_and_eps, weight_decay=0, amsgrad=True, maximize=False,
        decoupled_weight_decay=False, root_of_quotient=True, max_of_quotient=True,
    )  # fmt: skip
    scalars = (step_size if bc_mu else 1, bc2_sqrt, bc2 if bc_nu else 1, decay, b1, b2, eps, eps_root)
    fields, stored = ("mu", "nu", "nu_max"), (mu_dtype, "own", "own")
    out, (mu, nu, nu_max) = step_leaves(who, math, scalars, updates, state, fields, stored)
    return out, ScaleByAmsgradState(_increment(state.count), mu, nu, nu_max)


@accepts_schedules
def scale_by_amsgrad(
    b1: Scalar = 0.9,
    b2: Scalar = 0.999,
    eps: Scalar = 1e-8,
    eps_root: Scalar = 0.0,
    mu_dtype: torch.dtype | None = None,
    bias_correction_mu: bool = True,
    bias_correction_nu: bool = True,
) -> GradientTransformation:
    """AMSGrad's scaling (Reddi et al. 2018; optax's ``scale_by_amsgrad``): Adam's, over
    the running maximum of the (bias-corrected) second moment.

    Example:
        >>> import torch, funcopt as fo
        >>> tx = fo.scale_by_amsgrad()
        >>> g = [torch.tensor([0.5, -2.0])]
        >>> tx.update(g, tx.init(g))[0]
        [tensor([ 1., -1.])]
    """
    return GradientTransformation(
        functools.partial(_amsgrad_init, mu_dtype),
        functools.partial(
            _amsgrad_update, b1, b2, eps, eps_root, mu_dtype, bias_correction_mu, bias_correction_nu
        ),
    )


def _adamax_update(
    b1: Scalar, b2: Scalar, eps: Scalar,
    updates: Updates, state: State, params: Params | None = None, **extra_args: Any,
) -> tuple[Updates, State]:  # fmt: skip
    """`fo.Adamax`'s math (``adamax._elementwise``) with a learning rate of -1
    (``transforms/from_algorithm.py``), its coefficients from its schedule."""
    who = "scale_by_adamax update"
    _check_state(state, ScaleByAdamState, who)
    _, coefficients = ADAMAX.schedule(wide_count(state.count), lr=-1, betas=(b1, b2))
    math = BlockMath(ADAMAX.elementwise, 3, _adamax_hyperparams, weight_decay=0, maximize=False)
    scalars = (*coefficients, b1, b2, eps)
    out, (mu, nu) = step_leaves(who, math, scalars, updates, state, ("mu", "nu"), (None, None))
    return out, ScaleByAdamState(_increment(state.count), mu, nu)


def _adamax_hyperparams(b1: Any, b2: Any, eps: Any) -> dict[str, Any]:
    return {"betas": (b1, b2), "eps": eps}


@accepts_schedules
def scale_by_adamax(b1: Scalar = 0.9, b2: Scalar = 0.999, eps: Scalar = 1e-8) -> GradientTransformation:
    """AdaMax's scaling (Kingma and Ba 2015; optax's ``scale_by_adamax``): the
    bias-corrected first moment over the decayed infinity norm ``max(|g| + eps, b2 * nu)``.

    Example:
        >>> import torch, funcopt as fo
        >>> tx = fo.scale_by_adamax(eps=0.0)
        >>> g = [torch.tensor([0.5, -2.0])]
        >>> tx.update(g, tx.init(g))[0]
        [tensor([ 1., -1.])]
    """
    return GradientTransformation(_adam_init, functools.partial(_adamax_update, b1, b2, eps))


# ---------------------------------------------------------------- Adan


class ScaleByAdanState(NamedTuple):
    """Adan's moments ``m``, ``v``, ``n``, the last gradient ``g`` and the step count ``t``."""

    m: Params
    v: Params
    n: Params
    g: Params
    t: Tensor


def _adan_init(params: Params) -> ScaleByAdanState:
    return ScaleByAdanState(zeros(params), zeros(params), zeros(params), zeros(params), _count(params))


def _adan_update(
    b1: Scalar, b2: Scalar, b3: Scalar, eps: Scalar, eps_root: Scalar,
    updates: Updates, state: State, params: Params | None = None, **extra_args: Any,
) -> tuple[Updates, State]:  # fmt: skip
    """`fo.Adan`'s math (``lamb_adan._adan_step``) with a learning rate of -1
    (``transforms/from_algorithm.py``), its coefficients from its schedule, with optax's
    weight ``1 - b2`` of the gradient difference (``diff_weight``) and its `eps_root`."""
    who = "scale_by_adan update"
    _check_state(state, ScaleByAdanState, who)
    betas = (b1, b2, b3)
    _, coefficients = ADAN.schedule(
        wide_count(state.t), lr=-1, betas=betas, weight_decay=0, diff_weight=1 - b2
    )
    scalars = (*coefficients, *betas, 1 - b2, eps, eps_root)
    fields = ("m", "v", "n", "g")
    out, (m, v, n, g) = step_leaves(who, _adan_math, scalars, updates, state, fields, (None,) * 4)
    return out, ScaleByAdanState(m, v, n, g, _increment(state.t))


def _adan_hyperparams(b1: Any, b2: Any, b3: Any, diff_weight: Any, eps: Any, eps_root: Any) -> dict[str, Any]:
    return {"betas": (b1, b2, b3), "diff_weight": diff_weight, "eps": eps, "eps_root": eps_root}


_ADAN_MATH = BlockMath(ADAN.elementwise, 6, _adan_hyperparams, weight_decay=0)


def _adan_math(o: Any, u: Any, owned: bool, p: Any, buffers: Any, c: Any) -> Any:
    """`_ADAN_MATH` on optax's state, which holds the last gradient where timm's holds its
    negative (``neg_pre_grad``)."""
    m, v, n, g0 = buffers
    out, owned, (m, v, n, _) = _ADAN_MATH(o, u, owned, p, (m, v, n, o.neg(g0)), c)
    return out, owned, (m, v, n, u)


@accepts_schedules
def scale_by_adan(
    b1: Scalar = 0.98, b2: Scalar = 0.92, b3: Scalar = 0.99, eps: Scalar = 1e-8, eps_root: Scalar = 0.0
) -> GradientTransformation:
    """Adan's scaling (Xie et al. 2022, Algorithm 1; optax's ``scale_by_adan``): moments
    of the gradient, of its difference from the last one, and of their Nesterov sum.

    Example:
        >>> import torch, funcopt as fo
        >>> tx = fo.scale_by_adan(eps=0.0)
        >>> g = [torch.tensor([0.5, -2.0])]
        >>> tx.update(g, tx.init(g))[0]
        [tensor([ 1., -1.])]
    """
    return GradientTransformation(_adan_init, functools.partial(_adan_update, b1, b2, b3, eps, eps_root))


# ---------------------------------------------------------------- NovoGrad


class ScaleByNovogradState(NamedTuple):
    """The step count, the first moment and, per param, a 0-d second moment (of the
    gradient's squared norm)."""

    count: Tensor  # type: ignore[assignment]  # optax's name, which shadows tuple.count
    mu: Params
    nu: Params


def _novograd_init(mu_dtype: torch.dtype | None, params: Params) -> ScaleByNovogradState:
    nu = optree.tree_map(lambda p: torch.zeros((), dtype=p.dtype, device=p.device), params)
    return ScaleByNovogradState(_count(params), zeros(params, mu_dtype), nu)


def _novograd_update(
    b1: Scalar, b2: Scalar, eps: Scalar, eps_root: Scalar, weight_decay: Scalar, mu_dtype: torch.dtype | None,
    updates: Updates, state: State, params: Params | None = None, **extra_args: Any,
) -> tuple[Updates, State]:  # fmt: skip
    """`fo.NovoGrad`'s math (``catalogue_more._novograd_math``, timm's NvNovoGrad: its
    weight decay added to the normalized gradient, no grad averaging) with a learning rate
    of -1 (``transforms/from_algorithm.py``); optax's first step is by the count."""
    who = "scale_by_novograd update"
    _check_state(state, ScaleByNovogradState, who)
    check_params(who, params)
    _, coefficients = NOVOGRAD.schedule(wide_count(state.count), lr=-1, weight_decay=0)
    math = BlockMath(NOVOGRAD.elementwise, 5, _novograd_hyperparams, absent=1, first_step=state.count == 0)
    scalars = (*coefficients, b1, b2, eps, eps_root, weight_decay)
    fields, stored = ("mu", "nu"), (mu_dtype, "own")
    out, (mu, nu) = step_leaves(who, math, scalars, updates, state, fields, stored, params)
    if mu_dtype is not None:  # optax's update is the momentum, in mu_dtype
        out = map_updates(lambda u: u.to(mu_dtype), out)
    return out, ScaleByNovogradState(_increment(state.count), mu, nu)


def _novograd_hyperparams(b1: Any, b2: Any, eps: Any, eps_root: Any, weight_decay: Any) -> dict[str, Any]:
    return {"betas": (b1, b2), "eps": eps, "eps_root": eps_root, "weight_decay": weight_decay}


@accepts_schedules
def scale_by_novograd(
    b1: Scalar = 0.9,
    b2: Scalar = 0.25,
    eps: Scalar = 1e-8,
    eps_root: Scalar = 0.0,
    weight_decay: Scalar = 0.0,
    mu_dtype: torch.dtype | None = None,
) -> GradientTransformation:
    """NovoGrad's scaling (Ginsburg et al. 2019; optax's ``scale_by_novograd``): layer-wise
    second moments (of each param's squared gradient norm), weight decay inside the
    momentum. `update` needs the params.

    Example:
        >>> import torch, funcopt as fo
        >>> tx = fo.scale_by_novograd(eps=0.0)
        >>> g, p = [torch.tensor([3.0, 4.0])], [torch.zeros(2)]
        >>> tx.update(g, tx.init(p), p)[0]  # g / |g|
        [tensor([0.6000, 0.8000])]
    """
    return GradientTransformation(
        functools.partial(_novograd_init, mu_dtype),
        functools.partial(_novograd_update, b1, b2, eps, eps_root, weight_decay, mu_dtype),
    )


# ---------------------------------------------------------------- optimistic gradient


class ScaleByOptimisticGradientState(NamedTuple):
    """Whether no step was taken yet, and the last updates (optax's names)."""

    is_initial_step: Tensor
    previous_gradient: Params


def _optimistic_init(params: Params) -> ScaleByOptimisticGradientState:
    return ScaleByOptimisticGradientState(
        torch.ones((), dtype=torch.bool, device=device_of(params)), zeros(params)
    )


def _optimistic_update(
    alpha: Scalar,
    beta: Scalar,
    updates: Updates,
    state: State,
    params: Params | None = None,
    **extra_args: Any,
) -> tuple[Updates, State]:
    who = "scale_by_optimistic_gradient update"
    _check_state(state, ScaleByOptimisticGradientState, who)

    def one(g: Tensor, g0: Tensor) -> tuple[Tensor, ...]:
        prev = torch.where(state.is_initial_step, g, g0)
        a, b = coef(alpha, g), coef(beta, g)
        return (a + b) * g - b * prev, g

    out, prev = leafwise(who, one, updates, state.previous_gradient, n_out=2)
    return out, ScaleByOptimisticGradientState(torch.zeros_like(state.is_initial_step), prev)


@accepts_schedules
def scale_by_optimistic_gradient(alpha: Scalar = 1.0, beta: Scalar = 1.0) -> GradientTransformation:
    """The optimistic gradient (Daskalakis et al. 2017; optax's
    ``scale_by_optimistic_gradient``): ``(alpha + beta) * g - beta * g_prev``, with the
    current gradient as ``g_prev`` at the first step.

    Example:
        >>> import torch, funcopt as fo
        >>> tx = fo.scale_by_optimistic_gradient()
        >>> g = [torch.tensor([1.0])]
        >>> u, s = tx.update(g, tx.init(g))
        >>> tx.update([torch.tensor([3.0])], s)[0]  # 2 * 3 - 1
        [tensor([5.])]
    """
    return GradientTransformation(_optimistic_init, functools.partial(_optimistic_update, alpha, beta))
