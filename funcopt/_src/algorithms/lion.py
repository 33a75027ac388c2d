"""Lion: the sign of an interpolated momentum (Chen et al., 2023, "Symbolic Discovery of
Optimization Algorithms"), as optax's ``lion`` and timm's ``Lion`` compute it.

.. math::
   \\theta_t = \\theta_{t-1} (1 - \\gamma \\lambda)
       - \\gamma \\operatorname{sign}(\\beta_1 m_{t-1} + (1 - \\beta_1) g_t), \\quad
   m_t = \\beta_2 m_{t-1} + (1 - \\beta_2) g_t

The algorithm (`LION`, `fo.Lion`'s) is written with names that funcopt exports only
(`funcopt.Algorithm`, `funcopt.Bound`, `funcopt.Params`, the `funcopt.engine` ops): it is
the example of ``docs/adding-an-algorithm.md``. Its math is also optax's
``scale_by_lion`` block's (``catalogue/blocks.py``), whose `mode` it takes. The pure
factory `fo.lion` takes optax's weight-decay `mask` through `fo.partition`, a transform
above this layer: it is in ``catalogue/aliases.py``.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from torch import Tensor

from ..core.base import Params
from ..engine.algorithm import Algorithm
from ..engine.bounds import Bound
from ..engine.ops import Coef, Ops, nonzero


class LionState(NamedTuple):
    """Per-param state: the momentum (``exp_avg``, the key of the authors' PyTorch code)."""

    exp_avg: Params


def _initial(**_: Any) -> LionState:
    return LionState(exp_avg=0.0)  # zeros like each param


def _schedule(*, lr: Coef, weight_decay: Coef, **_: Any) -> tuple[tuple[()], tuple[Coef, Coef]]:
    return (), (-lr, 1 - lr * weight_decay)  # no counters; the step and the decoupled decay


def _math(
    o: Ops,
    out: Tensor | None,
    p: Tensor,
    g: Tensor,
    exp_avg: Tensor,
    coefficients: tuple[Coef, Coef],
    *,
    betas: tuple[Coef, Coef],
    weight_decay: Coef,
    maximize: bool = False,
    mode: str = "hard",
    smooth_beta: Coef = 1.0,
    **_: Any,
) -> tuple[Tensor, tuple[Tensor]]:
    """Lion's step, also ``scale_by_lion``'s (with a learning rate of -1): `mode` is that
    block's (optax's), see `_direction`."""
    neg_lr, decay = coefficients
    beta1, beta2 = betas
    if maximize:
        g = o.neg(g)
    if nonzero(weight_decay):
        out = o.decay_(out, p, decay)
    # timm's operations, in its order (the class is bit for bit timm's Lion): each
    # interpolation in one pass, the update in one new tensor
    update = _direction(o, o.lerp(exp_avg, g, 1 - beta1), mode, smooth_beta)
    out = o.add_(out, update, alpha=neg_lr)
    exp_avg = o.lerp_(exp_avg, g, 1 - beta2)
    return out, (exp_avg,)


def _direction(o: Ops, x: Tensor, mode: str, smooth_beta: Coef) -> Tensor:
    """The step's direction from the interpolation `x` (a new tensor): its sign, Lion's
    ("hard"); optax's ``scale_by_lion`` also takes ``tanh(smooth_beta * x)`` ("smooth")
    or `x` where ``|x| < 1`` and its sign beyond ("refined")."""
    if mode == "hard":
        return o.sign_(x)
    if mode == "smooth":
        return o.tanh(o.mul(x, smooth_beta))
    return o.where(o.lt(o.abs(x), 1.0), x, o.sign(x))


LION = Algorithm(
    name="Lion",
    state=LionState,
    counters=(),
    initial=_initial,
    schedule=_schedule,
    elementwise=_math,
    bounds=(
        Bound("lr", "Invalid learning rate: {}"),
        Bound("betas", "Invalid beta parameter at index 0: {}", 0, high=1.0, inclusive=False),
        Bound("betas", "Invalid beta parameter at index 1: {}", 1, high=1.0, inclusive=False),
        Bound("weight_decay", "Invalid weight_decay value: {}"),
    ),
)
