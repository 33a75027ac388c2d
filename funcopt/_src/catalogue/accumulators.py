"""optax's accumulator blocks, for `chain` (optax's names, arguments and math):
`scale_by_stddev` (centered RMSprop), `scale_by_rss` (Adagrad), `scale_by_sm3`.

Hyperparameters may be numbers, 0-d tensors or schedules (`accepts_schedules`). A None
update passes through, its buffers keeping their values."""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import optree
import torch
from torch import Tensor

from ..algorithms.adagrad import ADAGRAD
from ..core.base import GradientTransformation, Params, State, Updates, flatten_together
from ..core.hyperparams import accepts_schedules
from ..transforms.clipping import Scalar, abs_sq, coef
from ..transforms.from_algorithm import BlockMath, step_leaves
from ._common import _bias_correction, _check_state, _count, _increment, full, leafwise, zeros
from .sm3_math import PURE as SM3_PURE
from .sm3_math import sm3_moments

__all__ = [
    "ScaleByRStdDevState",
    "ScaleByRStdDevWithCountState",
    "ScaleByRssState",
    "ScaleBySM3State",
    "scale_by_rss",
    "scale_by_sm3",
    "scale_by_stddev",
]


def _ema(g: Any, m: Tensor, decay: Any) -> Tensor:
    """``(1 - decay) * g + decay * m`` (optax's ``update_moment``)."""
    return (1 - decay) * g + decay * m


def _bc(t: Tensor, decay: Any, count: Tensor) -> Tensor:
    """`t` divided by ``1 - decay**count`` (optax's ``bias_correction``)."""
    return t / _bias_correction(decay, count).to(t.dtype)


# ---------------------------------------------------------------- stddev, rss, sm3


class ScaleByRStdDevState(NamedTuple):
    """The moving averages of the updates and of their squares."""

    mu: Params
    nu: Params


class ScaleByRStdDevWithCountState(NamedTuple):
    """`ScaleByRStdDevState` with the step count, for bias correction."""

    count: Tensor  # type: ignore[assignment]  # optax's name, which shadows tuple.count
    mu: Params
    nu: Params


def _stddev_init(initial_scale: Scalar, bias_correction: bool, params: Params) -> State:
    mu, nu = zeros(params), full(params, initial_scale)
    return (
        ScaleByRStdDevWithCountState(_count(params), mu, nu)
        if bias_correction
        else ScaleByRStdDevState(mu, nu)
    )


def _stddev_update(
    decay: Scalar, eps: Scalar, eps_in_sqrt: bool, bias_correction: bool,
    updates: Updates, state: State, params: Params | None = None, **extra_args: Any,
) -> tuple[Updates, State]:  # fmt: skip
    who = "scale_by_stddev update"
    _check_state(state, ScaleByRStdDevWithCountState if bias_correction else ScaleByRStdDevState, who)
    count = _increment(state.count) if bias_correction else None

    def one(g: Tensor, m0: Tensor, v0: Tensor) -> tuple[Tensor, ...]:
        d = coef(decay, g)
        mu, nu = _ema(g, m0, d), _ema(abs_sq(g), v0, d)
        mu_hat, nu_hat = (_bc(mu, d, count), _bc(nu, d, count)) if count is not None else (mu, nu)
        if eps_in_sqrt:
            scaling = torch.rsqrt(nu_hat - abs_sq(mu_hat) + coef(eps, g))
        else:
            scaling = 1 / (torch.sqrt(nu_hat - abs_sq(mu_hat)) + coef(eps, g))
        return scaling * g, mu, nu

    out, mu, nu = leafwise(who, one, updates, state.mu, state.nu, n_out=3)
    if count is None:
        return out, ScaleByRStdDevState(mu, nu)
    return out, ScaleByRStdDevWithCountState(count, mu, nu)


@accepts_schedules
def scale_by_stddev(
    decay: Scalar = 0.9,
    eps: Scalar = 1e-8,
    initial_scale: Scalar = 0.0,
    eps_in_sqrt: bool = True,
    bias_correction: bool = False,
) -> GradientTransformation:
    """Divide the updates by their moving standard deviation, ``sqrt(nu - mu**2 + eps)``
    (centered RMSprop's scaling; optax's ``scale_by_stddev``).

    Example:
        >>> import torch, funcopt as fo
        >>> tx = fo.scale_by_stddev(decay=0.75, eps=0.0)
        >>> g = [torch.tensor([4.0])]
        >>> tx.update(g, tx.init(g))[0]  # 4 / sqrt(0.25 * 16 - (0.25 * 4)**2)
        [tensor([2.3094])]
    """
    return GradientTransformation(
        functools.partial(_stddev_init, initial_scale, bias_correction),
        functools.partial(_stddev_update, decay, eps, eps_in_sqrt, bias_correction),
    )


class ScaleByRssState(NamedTuple):
    """The running sum of squared updates (optax's name)."""

    sum_of_squares: Params


def _rss_init(initial_accumulator_value: Scalar, params: Params) -> ScaleByRssState:
    return ScaleByRssState(full(params, initial_accumulator_value))


def _rss_update(
    eps: Scalar, updates: Updates, state: State, params: Params | None = None, **extra_args: Any
) -> tuple[Updates, State]:
    """`fo.adagrad`'s math (``algorithms/adagrad.py``) with a learning rate of -1
    (``transforms/from_algorithm.py``): ``updates / sqrt(sum_of_squares + eps)``, 0 where
    the sum is not positive, as optax's."""
    who = "scale_by_rss update"
    _check_state(state, ScaleByRssState, who)
    _, coefficients = ADAGRAD.schedule(0, lr=-1, lr_decay=0)
    out, (s,) = step_leaves(
        who, _RSS_MATH, (*coefficients, eps), updates, state, ("sum_of_squares",), (None,)
    )
    return out, ScaleByRssState(s)


def _eps_root(eps: Any) -> dict[str, Any]:
    return {"eps_root": eps}


# optax's eps is inside the root: Adagrad's eps_root, its eps (outside) 0
_RSS_MATH = BlockMath(
    ADAGRAD.elementwise, 1, _eps_root, eps=0, weight_decay=0, maximize=False, zero_where_no_sum=True
)


@accepts_schedules
def scale_by_rss(initial_accumulator_value: Scalar = 0.1, eps: Scalar = 1e-7) -> GradientTransformation:
    """Divide the updates by the root of the running sum of their squares (Adagrad's
    scaling; optax's ``scale_by_rss``).

    Example:
        >>> import torch, funcopt as fo
        >>> tx = fo.scale_by_rss(initial_accumulator_value=0.0, eps=0.0)
        >>> g = [torch.tensor([2.0, -3.0])]
        >>> tx.update(g, tx.init(g))[0]
        [tensor([ 1., -1.])]
    """
    return GradientTransformation(
        functools.partial(_rss_init, initial_accumulator_value), functools.partial(_rss_update, eps)
    )


class ScaleBySM3State(NamedTuple):
    """SM3's per-dimension accumulators (a list of vectors per param) and its momentum."""

    mu: Params
    nu: Params


def _sm3_init(params: Params) -> ScaleBySM3State:
    def per_dim(p: Tensor) -> list[Tensor]:
        if p.ndim == 0 or p.is_complex():
            raise ValueError(
                "scale_by_sm3 takes real params of one or more dimensions (as optax's); reshape a 0-d "
                "param to shape (1,), or leave it out with fo.masked"
            )
        return [torch.zeros(n, dtype=p.dtype, device=p.device) for n in p.shape]

    return ScaleBySM3State(optree.tree_map(per_dim, params), zeros(params))


def _sm3_update(
    b1: Scalar, b2: Scalar, eps: Scalar, updates: Updates, state: State, params: Params | None = None,
    **extra_args: Any,
) -> tuple[Updates, State]:  # fmt: skip
    who = "scale_by_sm3 update"
    _check_state(state, ScaleBySM3State, who)
    (gs, nus), unflatten = flatten_together(updates, state.nu, names=(f"{who}: updates", "state.nu"))
    mu_lists: list[Any] = []
    try:  # a list of per-dimension vectors where the updates have a leaf, in the order of `gs`:
        # by optree.tree_map, as flatten_together (whose order under torch.compile, a dict's
        # insertion order, is not that of PyTreeSpec.flatten_up_to, sorted keys)
        optree.tree_map(lambda _, m: mu_lists.append(m), updates, state.mu, none_is_leaf=True)
    except ValueError as e:
        raise ValueError(f"{who}: state.mu does not have the structure of the updates ({e})") from None
    new_mu: list[Any] = list(mu_lists)  # (a list[Any] call would stop torch.compile)
    out, new_nu = list(gs), list(nus)
    for i, g in enumerate(gs):
        if g is None:
            continue
        c2 = coef(b2, g)
        c0: Any = torch.where(c2 != 1.0, 1 - c2, torch.ones_like(c2)) if isinstance(c2, Tensor) else None
        if c0 is None:
            c0 = (1 - c2) if c2 != 1.0 else 1.0
        new_mu[i], new_nu[i] = sm3_moments(
            SM3_PURE, g, list(mu_lists[i]), nus[i], c0=c0, c2=c2, b1=coef(b1, g), eps=coef(eps, g)
        )
        out[i] = new_nu[i]
    return unflatten(out), ScaleBySM3State(unflatten(new_mu), unflatten(new_nu))


@accepts_schedules
def scale_by_sm3(b1: Scalar = 0.9, b2: Scalar = 1.0, eps: Scalar = 1e-8) -> GradientTransformation:
    """SM3's scaling (Anil et al. 2019; optax's ``scale_by_sm3``): Adagrad's, with the
    accumulator of each tensor kept as one vector per dimension (memory-efficient),
    then momentum `b1`.

    Example:
        >>> import torch, funcopt as fo
        >>> tx = fo.scale_by_sm3(b1=0.0, eps=0.0)
        >>> g = [torch.tensor([2.0, -3.0])]
        >>> tx.update(g, tx.init(g))[0]
        [tensor([ 1., -1.])]
    """
    return GradientTransformation(_sm3_init, functools.partial(_sm3_update, b1, b2, eps))
