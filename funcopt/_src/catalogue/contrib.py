"""optax.contrib's optimizers, part 1 (optax's names, arguments and math): `adopt`,
`ademamix`, `simplified_ademamix`, `cocob`, `madgrad`, each with its ``scale_by_*``
block (`dog` and `dowg` are in dog.py). Learning-rate-free methods (`cocob`, `dog`, `dowg`) and those that
read the params need the params in `update`."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from torch import Tensor

from ..algorithms.catalogue_more import ADEMAMIX, ADOPT, MADGRAD
from ..core.base import GradientTransformation, Params, State, Updates, chain
from ..transforms.blocks import add_decayed_weights, scale_by_learning_rate, wide_count
from ..transforms.clipping import Scalar, coef
from ..transforms.from_algorithm import BlockMath, step_leaves
from ..transforms.moments import ScaleByAdamState
from ._common import (
    _bias_correction,
    _check_state,
    _count,
    _increment,
    check_params,
    copy,
    full,
    leafwise,
    zeros,
)

__all__ = [
    "COCOBState",
    "MadgradState",
    "ScaleByAdemamixState",
    "ScaleBySimplifiedAdEMAMixState",
    "ademamix",
    "adopt",
    "cocob",
    "madgrad",
    "scale_by_ademamix",
    "scale_by_adopt",
    "scale_by_cocob",
    "scale_by_madgrad",
    "scale_by_simplified_ademamix",
    "simplified_ademamix",
]


def _bc(t: Tensor, decay: Any, count: Tensor) -> Tensor:
    return t / _bias_correction(decay, count).to(t.dtype)


def _at(value: Any, count: Tensor) -> Any:
    """A hyperparameter that may be a schedule, at `count`."""
    return value(count) if callable(value) else value


# ---------------------------------------------------------------- ADOPT


def _quarter_power(count: Tensor) -> Tensor:
    return count**0.25


def _adopt_init(mu_dtype: torch.dtype | None, params: Params) -> ScaleByAdamState:
    return ScaleByAdamState(_count(params), zeros(params, mu_dtype), zeros(params))


def _adopt_update(
    b1: Scalar, b2: Scalar, eps: Scalar, mu_dtype: torch.dtype | None, nesterov: bool, use_clipping: bool,
    clip_value_fn: Callable[[Tensor], Any], updates: Updates, state: State, params: Params | None = None,
    **extra_args: Any,
) -> tuple[Updates, State]:  # fmt: skip
    """`fo.Adopt`'s math (``catalogue_more._adopt_math``) with a learning rate of -1
    (``transforms/from_algorithm.py``), its coefficients from its schedule; the clip is
    ``clip_value_fn`` of the count, as a float64 tensor."""
    who = "scale_by_adopt update"
    _check_state(state, ScaleByAdamState, who)
    count = state.count.to(torch.float64)
    _, (step_size, weight1, beta2, _) = ADOPT.schedule(count, lr=-1, betas=(b1, b2))
    clip_value = clip_value_fn(count) if use_clipping else None
    math = BlockMath(ADOPT.elementwise, 1, _eps, nesterov=bool(nesterov))
    scalars = (step_size, weight1, beta2, clip_value, eps)
    out, (mu, nu) = step_leaves(who, math, scalars, updates, state, ("mu", "nu"), (mu_dtype, None))
    return out, ScaleByAdamState(_increment(state.count), mu, nu)


def _eps(eps: Any) -> dict[str, Any]:
    return {"eps": eps}


def scale_by_adopt(
    b1: Scalar = 0.9,
    b2: Scalar = 0.9999,
    eps: Scalar = 1e-6,
    mu_dtype: torch.dtype | None = None,
    *,
    nesterov: bool = False,
    use_clipping: bool = True,
    clip_value_fn: Callable[[Tensor], Any] = _quarter_power,
) -> GradientTransformation:
    """ADOPT's scaling (Taniguchi et al. 2024; optax.contrib's ``scale_by_adopt``): the
    gradient normalized by the *previous* second moment, clipped to
    ``clip_value_fn(count)`` (the count as a float64 tensor), then momentum. The first
    step only initializes the second moment (its update is zero).

    Example:
        >>> import torch, funcopt as fo
        >>> tx = fo.scale_by_adopt()
        >>> g = [torch.tensor([2.0])]
        >>> tx.update(g, tx.init(g))[0]
        [tensor([0.])]
    """
    return GradientTransformation(
        functools.partial(_adopt_init, mu_dtype),
        functools.partial(_adopt_update, b1, b2, eps, mu_dtype, nesterov, use_clipping, clip_value_fn),
    )


def adopt(
    learning_rate: Any,
    b1: Scalar = 0.9,
    b2: Scalar = 0.9999,
    eps: Scalar = 1e-6,
    mu_dtype: torch.dtype | None = None,
    *,
    nesterov: bool = False,
    use_clipping: bool = True,
    clip_value_fn: Callable[[Tensor], Any] = _quarter_power,
) -> GradientTransformation:
    """ADOPT (optax.contrib's ``adopt``): `scale_by_adopt`, then the learning rate.

    Example:
        >>> import torch, funcopt as fo
        >>> len(fo.adopt(1e-3).init([torch.zeros(2)]))
        2
    """
    return chain(
        scale_by_adopt(
            b1, b2, eps, mu_dtype, nesterov=nesterov, use_clipping=use_clipping, clip_value_fn=clip_value_fn
        ),
        scale_by_learning_rate(learning_rate),
    )


# ---------------------------------------------------------------- AdEMAMix


class ScaleByAdemamixState(NamedTuple):
    """The step counts, the fast and slow EMAs and the second moment (optax's names)."""

    count: Tensor  # type: ignore[assignment]  # optax's name, which shadows tuple.count
    count_m2: Tensor
    m1: Params
    m2: Params
    nu: Params


def _ademamix_init(mu_dtype: torch.dtype | None, params: Params) -> ScaleByAdemamixState:
    m1, m2, nu = zeros(params, mu_dtype), zeros(params, mu_dtype), zeros(params, mu_dtype)
    return ScaleByAdemamixState(_count(params), _count(params), m1, m2, nu)


def _ademamix_update(
    b1: Scalar, b2: Scalar, b3: Any, alpha: Any, eps: Scalar, eps_root: Scalar,
    updates: Updates, state: State, params: Params | None = None, **extra_args: Any,
) -> tuple[Updates, State]:  # fmt: skip
    """`fo.AdEMAMix`'s math (``catalogue_more._ademamix_math``) with a learning rate of -1
    (``transforms/from_algorithm.py``), its coefficients from its schedule; `b3` and
    `alpha` at ``count_m2``."""
    who = "scale_by_ademamix update"
    _check_state(state, ScaleByAdemamixState, who)
    _, coefficients = ADEMAMIX.schedule(wide_count(state.count), lr=-1, betas=(b1, b2))
    math = BlockMath(ADEMAMIX.elementwise, 6, _ademamix_hyperparams, weight_decay=0)
    c_b3, c_alpha = _at(b3, state.count_m2), _at(alpha, state.count_m2)
    scalars = (*coefficients, b1, b2, c_b3, c_alpha, eps, eps_root)
    fields = ("m1", "m2", "nu")
    out, (m1, m2, nu) = step_leaves(who, math, scalars, updates, state, fields, ("own",) * 3)
    return out, ScaleByAdemamixState(_increment(state.count), _increment(state.count_m2), m1, m2, nu)


def _ademamix_hyperparams(b1: Any, b2: Any, b3: Any, alpha: Any, eps: Any, eps_root: Any) -> dict[str, Any]:
    return {"betas": (b1, b2, b3), "alpha": alpha, "eps": eps, "eps_root": eps_root}


def scale_by_ademamix(
    b1: Scalar = 0.9,
    b2: Scalar = 0.999,
    b3: Any = 0.9999,
    alpha: Any = 6.0,
    eps: Scalar = 1e-8,
    eps_root: Scalar = 0.0,
    mu_dtype: torch.dtype | None = None,
) -> GradientTransformation:
    """AdEMAMix's scaling (Pagliardini et al. 2024; optax.contrib's
    ``scale_by_ademamix``): Adam's, plus `alpha` times a slow EMA (`b3`) of the
    gradients. `b3` and `alpha` may be schedules, read at ``count_m2``.

    Example:
        >>> import torch, funcopt as fo
        >>> tx = fo.scale_by_ademamix(alpha=0.0, eps=0.0)
        >>> g = [torch.tensor([2.0])]
        >>> tx.update(g, tx.init(g))[0]
        [tensor([1.])]
    """
    return GradientTransformation(
        functools.partial(_ademamix_init, mu_dtype),
        functools.partial(_ademamix_update, b1, b2, b3, alpha, eps, eps_root),
    )


def ademamix(
    learning_rate: Any,
    b1: Scalar = 0.9,
    b2: Scalar = 0.999,
    b3: Any = 0.9999,
    alpha: Any = 5.0,
    eps: Scalar = 1e-8,
    eps_root: Scalar = 0.0,
    mu_dtype: torch.dtype | None = None,
    weight_decay: Scalar = 0.0,
    mask: Any = None,
) -> GradientTransformation:
    """AdEMAMix (optax.contrib's ``ademamix``): `scale_by_ademamix`,
    `add_decayed_weights`, the learning rate.

    Example:
        >>> import torch, funcopt as fo
        >>> len(fo.ademamix(1e-3).init([torch.zeros(2)]))
        3
    """
    return chain(
        scale_by_ademamix(b1, b2, b3, alpha, eps, eps_root, mu_dtype),
        add_decayed_weights(weight_decay, mask),
        scale_by_learning_rate(learning_rate),
    )


class ScaleBySimplifiedAdEMAMixState(NamedTuple):
    """The step count, the momentum sum and the second moment (optax's names)."""

    t: Tensor
    m: Params
    n: Params


def _simplified_init(params: Params) -> ScaleBySimplifiedAdEMAMixState:
    return ScaleBySimplifiedAdEMAMixState(_count(params), zeros(params), zeros(params))


def _simplified_update(
    b1: Scalar, b2: Scalar, alpha: Any, eps: Scalar, eps_root: Scalar,
    updates: Updates, state: State, params: Params | None = None, **extra_args: Any,
) -> tuple[Updates, State]:  # fmt: skip
    who = "scale_by_simplified_ademamix update"
    _check_state(state, ScaleBySimplifiedAdEMAMixState, who)
    c_alpha = _at(alpha, state.t)
    t = _increment(state.t)

    def one(g: Tensor, m0: Tensor, n0: Tensor) -> tuple[Tensor, ...]:
        c2 = coef(b2, g)
        m = g + coef(b1, g) * m0
        gg = g * g
        n = gg + c2 * (n0 - gg)
        u = (m + coef(c_alpha, g) * g) / (torch.sqrt(_bc(n, c2, t) + coef(eps_root, g)) + coef(eps, g))
        return u, m, n

    out, m, n = leafwise(who, one, updates, state.m, state.n, n_out=3)
    return out, ScaleBySimplifiedAdEMAMixState(t, m, n)


def scale_by_simplified_ademamix(
    b1: Scalar = 0.99, b2: Scalar = 0.95, alpha: Any = 0.0, eps: Scalar = 1e-8, eps_root: Scalar = 0.0
) -> GradientTransformation:
    """Simplified AdEMAMix's scaling (Morwani et al. 2024; optax.contrib's
    ``scale_by_simplified_ademamix``): ``(m + alpha * g) / sqrt(n_hat)``, with ``m`` a
    theory-style momentum sum ``g + b1 * m``. `alpha` may be a schedule.

    Example:
        >>> import torch, funcopt as fo
        >>> tx = fo.scale_by_simplified_ademamix(eps=0.0)
        >>> g = [torch.tensor([2.0])]
        >>> tx.update(g, tx.init(g))[0]
        [tensor([1.0000])]
    """
    return GradientTransformation(
        _simplified_init, functools.partial(_simplified_update, b1, b2, alpha, eps, eps_root)
    )


def simplified_ademamix(
    learning_rate: Any,
    b1: Scalar = 0.99,
    b2: Scalar = 0.95,
    alpha: Any = 0.0,
    eps: Scalar = 1e-8,
    eps_root: Scalar = 0.0,
    weight_decay: Scalar = 0.0,
    mask: Any = None,
) -> GradientTransformation:
    """Simplified AdEMAMix (optax.contrib's ``simplified_ademamix``).

    Example:
        >>> import torch, funcopt as fo
        >>> len(fo.simplified_ademamix(1e-3).init([torch.zeros(2)]))
        3
    """
    return chain(
        scale_by_simplified_ademamix(b1, b2, alpha, eps, eps_root),
        add_decayed_weights(weight_decay, mask),
        scale_by_learning_rate(learning_rate),
    )


# ---------------------------------------------------------------- COCOB


class COCOBState(NamedTuple):
    """COCOB's per-param buffers (optax's names)."""

    init_particles: Params
    cumulative_gradients: Params
    scale: Params
    subgradients: Params
    reward: Params


def _cocob_init(eps: Scalar, params: Params) -> COCOBState:
    return COCOBState(copy(params), zeros(params), full(params, eps), zeros(params), zeros(params))


def _cocob_update(
    alpha: Scalar, updates: Updates, state: State, params: Params | None = None, **extra_args: Any
) -> tuple[Updates, State]:
    who = "scale_by_cocob update"
    _check_state(state, COCOBState, who)
    check_params(who, params)

    def one(
        c: Tensor, p0: Tensor, cg0: Tensor, s0: Tensor, sg0: Tensor, r0: Tensor, p: Tensor
    ) -> tuple[Tensor, ...]:
        s = torch.maximum(s0, torch.abs(c))
        sg = sg0 + torch.abs(c)
        r = torch.clamp(r0 - c * (p - p0), min=0)
        cg = cg0 - c
        u = -p + (p0 + cg / (s * torch.maximum(sg + s, coef(alpha, c) * s)) * (s + r))
        return u, cg, s, sg, r

    out, cg, s, sg, r = _cocob_columns(who, one, updates, state, params)
    return out, COCOBState(state.init_particles, cg, s, sg, r)


def _cocob_columns(
    who: str, one: Callable[..., Any], updates: Updates, st: COCOBState, params: Params
) -> Any:
    """`one` over the leaves, with the buffers after the initial particles as outputs."""

    def reorder(c: Tensor, cg0: Tensor, s0: Tensor, sg0: Tensor, r0: Tensor, p0: Tensor, p: Tensor) -> Any:
        return one(c, p0, cg0, s0, sg0, r0, p)

    return leafwise(
        who, reorder, updates, st.cumulative_gradients, st.scale, st.subgradients, st.reward, st.init_particles,
        params, n_out=5,
    )  # fmt: skip


def scale_by_cocob(alpha: Scalar = 100.0, eps: Scalar = 1e-8) -> GradientTransformation:
    """COCOB-Backprop (Orabona and Tommasi 2017; optax.contrib's ``scale_by_cocob``): a
    learning-rate-free coin-betting step. Its updates are the whole step (no learning
    rate after it). `update` needs the params.

    Example:
        >>> import torch, funcopt as fo
        >>> tx = fo.scale_by_cocob()
        >>> p = [torch.zeros(1)]
        >>> tx.update([torch.tensor([1.0])], tx.init(p), p)[0]  # -1 / (1 * max(2, 100))
        [tensor([-0.0100])]
    """
    return GradientTransformation(
        functools.partial(_cocob_init, eps), functools.partial(_cocob_update, alpha)
    )


def cocob(
    learning_rate: Any = 1.0,
    alpha: Scalar = 100.0,
    eps: Scalar = 1e-8,
    weight_decay: Scalar = 0.0,
    mask: Any = None,
) -> GradientTransformation:
    """COCOB (optax.contrib's ``cocob``): `add_decayed_weights`, the learning rate
    (without sign flip), `scale_by_cocob`.

    Example:
        >>> import torch, funcopt as fo
        >>> len(fo.cocob().init([torch.zeros(2)]))
        3
    """
    return chain(
        add_decayed_weights(weight_decay, mask),
        scale_by_learning_rate(learning_rate, flip_sign=False),
        scale_by_cocob(alpha, eps),
    )


# ---------------------------------------------------------------- MADGRAD


class MadgradState(NamedTuple):
    """The step count, the weighted sums of squared gradients and of gradients, and the
    initial params (optax's names)."""

    count: Tensor  # type: ignore[assignment]  # optax's name, which shadows tuple.count
    grad_sum_sq: Params
    s: Params
    x0: Params


def _madgrad_init(params: Params) -> MadgradState:
    return MadgradState(_count(params), zeros(params), zeros(params), copy(params))


def _madgrad_update(
    learning_rate: Any, momentum: Scalar, eps: Scalar, updates: Updates, state: State, params: Params | None = None,
    **extra_args: Any,
) -> tuple[Updates, State]:  # fmt: skip
    """`fo.MADGRAD`'s math (``catalogue_more._madgrad_math``, timm's) on optax's state
    (``transforms/from_algorithm.py``), its weight ``(lr + eps) * sqrt(count + 1)`` from
    its schedule in float64 (optax takes the root in float32), x0 the stored one."""
    who = "scale_by_madgrad update"
    _check_state(state, MadgradState, who)
    check_params(who, params)
    count = state.count.to(torch.float64)
    _, coefficients = MADGRAD.schedule(count, lr=_at(learning_rate, state.count), eps=eps, weight_decay=0)
    math = BlockMath(MADGRAD.elementwise, 2, _momentum_and_eps, weight_decay=0, stored_x0=True)
    scalars = (*coefficients, momentum, eps)
    fields = ("grad_sum_sq", "s", "x0")
    out, (gsq, s, _) = step_leaves(who, math, scalars, updates, state, fields, (None, None, None), params)
    return out, MadgradState(_increment(state.count), gsq, s, state.x0)


def _momentum_and_eps(momentum: Any, eps: Any) -> dict[str, Any]:
    return {"momentum": momentum, "eps": eps}


def scale_by_madgrad(
    learning_rate: Any, momentum: Scalar = 0.9, eps: Scalar = 1e-6
) -> GradientTransformation:
    """MADGRAD (Defazio and Jelassi 2021; optax.contrib's ``scale_by_madgrad``): dual
    averaging with a cube-root Adagrad scaling and momentum. Its updates are the whole
    step (the learning rate is inside). `update` needs the params. The weight
    ``lr * sqrt(k + 1)`` is computed in float64 (optax rounds ``sqrt(k + 1)`` to float32,
    so the two differ by float32 round-off in it).

    Example:
        >>> import torch, funcopt as fo
        >>> len(fo.scale_by_madgrad(1e-2).init([torch.zeros(2)]))
        4
    """
    return GradientTransformation(
        _madgrad_init, functools.partial(_madgrad_update, learning_rate, momentum, eps)
    )


def madgrad(
    learning_rate: Any, momentum: Scalar = 0.9, weight_decay: Scalar = 0.0, eps: Scalar = 1e-6
) -> GradientTransformation:
    """MADGRAD (optax.contrib's ``madgrad``): `add_decayed_weights`, `scale_by_madgrad`.

    Example:
        >>> import torch, funcopt as fo
        >>> len(fo.madgrad(1e-2).init([torch.zeros(2)]))
        2
    """
    return chain(add_decayed_weights(weight_decay), scale_by_madgrad(learning_rate, momentum, eps))
