"""Lion: the sign of an interpolated momentum (Chen et al., 2023, "Symbolic Discovery of
Optimization Algorithms"), as optax's ``lion`` and timm's ``Lion`` compute it.

.. math::
   \\theta_t = \\theta_{t-1} (1 - \\gamma \\lambda)
       - \\gamma \\operatorname{sign}(\\beta_1 m_{t-1} + (1 - \\beta_1) g_t), \\quad
   m_t = \\beta_2 m_{t-1} + (1 - \\beta_2) g_t

Written with funcopt's public API only (`funcopt.Algorithm`, the `funcopt.engine` ops):
it is the example of ``docs/adding-an-algorithm.md``.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import optree
from torch import Tensor

from ..core.base import GradientTransformation, Params
from ..engine.algorithm import Algorithm
from ..engine.bounds import Bound
from ..engine.ops import Coef, Ops, nonzero
from ..transforms.masking import partition


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
    **_: Any,
) -> tuple[Tensor, tuple[Tensor]]:
    neg_lr, decay = coefficients
    beta1, beta2 = betas
    if maximize:
        g = o.neg(g)
    if nonzero(weight_decay):
        out = o.decay_(out, p, decay)
    # timm's operations, in its order (the class is bit for bit timm's Lion): each
    # interpolation in one pass, the update in one new tensor
    update = o.sign_(o.lerp(exp_avg, g, 1 - beta1))
    out = o.add_(out, update, alpha=neg_lr)
    exp_avg = o.lerp_(exp_avg, g, 1 - beta2)
    return out, (exp_avg,)


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


class _DecayLabels:
    """optax's weight-decay `mask` (a tree of bools, or a function making one) as the
    labels of `partition`. A class, not a closure, so that the transformation pickles."""

    def __init__(self, mask: Any) -> None:
        self.mask = mask

    def __call__(self, params: Params) -> Any:
        mask = self.mask(params) if callable(self.mask) else self.mask
        return optree.tree_map(lambda decays: "decay" if decays else "no_decay", mask)


def lion(
    learning_rate: float | Tensor,
    b1: float | Tensor = 0.9,
    b2: float | Tensor = 0.99,
    mu_dtype: Any = None,
    weight_decay: float | Tensor = 1e-3,
    mask: Any = None,
) -> GradientTransformation:
    """Lion as a pure transformation, with optax's arguments and defaults.

    Args:
        learning_rate: the step size (a number, 0-d tensor or schedule).
        b1: the weight of the momentum in the interpolation whose sign is the step.
        b2: the decay rate of the momentum.
        mu_dtype: the momentum's dtype; only None (the param's dtype) is supported.
        weight_decay: decoupled weight decay, applied as ``param * (1 - lr * weight_decay)``.
        mask: where weight decay applies: a pytree of bools like the params, or a
            function that makes one from them (optax's ``mask``); None: everywhere.

    Example:
        >>> import torch, funcopt as fo
        >>> params = {"w": torch.tensor([1.0, -2.0])}
        >>> tx = fo.lion(learning_rate=0.1, weight_decay=0.0)
        >>> state = tx.init(params)
        >>> updates, state = tx.update({"w": torch.tensor([0.5, -0.5])}, state, params)
        >>> fo.apply_updates(params, updates)["w"]
        tensor([ 0.9000, -1.9000])
    """
    if mu_dtype is not None:
        raise ValueError(
            f"lion: mu_dtype={mu_dtype!r} is not supported; the momentum takes each param's dtype "
            "(leave mu_dtype=None, or cast the params)"
        )
    hyperparams = {"lr": learning_rate, "betas": (b1, b2), "maximize": False}
    if mask is None:
        return LION.transform(**hyperparams, weight_decay=weight_decay)
    return partition(
        {
            "decay": LION.transform(**hyperparams, weight_decay=weight_decay),
            "no_decay": LION.transform(**hyperparams, weight_decay=0.0),
        },
        _DecayLabels(mask),
    )
