"""optax's optimizers that torch.optim lacks, each a `chain` of public blocks as in
optax's ``alias.py``, under optax's names and arguments: `adabelief`, `adamaxw`, `adan`,
`amsgrad`, `fromage`, `lamb`, `lars`, `nadamw`, `novograd`,
`optimistic_gradient_descent`, `optimistic_adam`, `polyak_sgd`, `sign_sgd`, `signum`,
`sm3`, `yogi`; and `lion`, `fo.Lion`'s algorithm (``algorithms/lion.py``, its state
`LionState`) under optax's arguments, its weight-decay mask through `partition`.

`learning_rate` may be a number, a 0-d tensor or a schedule (the state then holds its
count, as optax's ``scale_by_learning_rate``)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import optree
import torch
from torch import Tensor

from ..algorithms.lion import LION
from ..core.base import GradientTransformation, Params, chain
from ..transforms.blocks import add_decayed_weights, identity, scale, scale_by_learning_rate, scale_by_sign
from ..transforms.clipping import Scalar
from ..transforms.masking import masked, partition
from ..transforms.moments import ema, scale_by_adam, trace
from .accumulators import scale_by_sm3
from .blocks import (
    scale_by_adamax,
    scale_by_adan,
    scale_by_amsgrad,
    scale_by_belief,
    scale_by_novograd,
    scale_by_optimistic_gradient,
    scale_by_yogi,
)
from .scaling import scale_by_polyak, scale_by_trust_ratio

__all__ = [
    "adabelief",
    "adamaxw",
    "adan",
    "amsgrad",
    "fromage",
    "lamb",
    "lars",
    "lion",
    "nadamw",
    "novograd",
    "optimistic_adam",
    "optimistic_gradient_descent",
    "polyak_sgd",
    "sign_sgd",
    "signum",
    "sm3",
    "yogi",
]

LearningRate = Any
"""A number, a 0-d tensor, or a schedule (a function of the step count)."""


def adabelief(
    learning_rate: LearningRate,
    b1: Scalar = 0.9,
    b2: Scalar = 0.999,
    eps: Scalar = 1e-16,
    eps_root: Scalar = 1e-16,
    *,
    nesterov: bool = False,
) -> GradientTransformation:
    """AdaBelief (Zhuang et al. 2020): `scale_by_belief`, then the learning rate.

    Example:
        >>> import torch, funcopt as fo
        >>> tx = fo.adabelief(1e-3)
        >>> len(tx.init([torch.zeros(2)]))
        2
    """
    return chain(
        scale_by_belief(b1=b1, b2=b2, eps=eps, eps_root=eps_root, nesterov=nesterov),
        scale_by_learning_rate(learning_rate),
    )


def adamaxw(
    learning_rate: LearningRate,
    b1: Scalar = 0.9,
    b2: Scalar = 0.999,
    eps: Scalar = 1e-8,
    weight_decay: Any = 1e-4,
    mask: Any = None,
) -> GradientTransformation:
    """AdaMax with decoupled weight decay (optax's ``adamaxw``): `scale_by_adamax`,
    `add_decayed_weights`, the learning rate.

    Example:
        >>> import torch, funcopt as fo
        >>> p = [torch.ones(2)]
        >>> fo.adamaxw(0.1, weight_decay=0.0).update([torch.ones(2)], fo.adamaxw(0.1).init(p), p)[0]
        [tensor([-0.1000, -0.1000])]
    """
    return chain(
        scale_by_adamax(b1=b1, b2=b2, eps=eps),
        add_decayed_weights(weight_decay, mask),
        scale_by_learning_rate(learning_rate),
    )


def adan(
    learning_rate: LearningRate,
    b1: Scalar = 0.98,
    b2: Scalar = 0.92,
    b3: Scalar = 0.99,
    eps: Scalar = 1e-8,
    eps_root: Scalar = 1e-8,
    weight_decay: Any = 0.0,
    mask: Any = None,
) -> GradientTransformation:
    """Adan (Xie et al. 2022; optax's ``adan``): `scale_by_adan`, `add_decayed_weights`,
    the learning rate.

    Example:
        >>> import torch, funcopt as fo
        >>> tx = fo.adan(1e-3)
        >>> type(tx.init([torch.zeros(2)])[0]).__name__
        'ScaleByAdanState'
    """
    return chain(
        scale_by_adan(b1=b1, b2=b2, b3=b3, eps=eps, eps_root=eps_root),
        add_decayed_weights(weight_decay, mask),
        scale_by_learning_rate(learning_rate),
    )


def amsgrad(
    learning_rate: LearningRate,
    b1: Scalar = 0.9,
    b2: Scalar = 0.999,
    eps: Scalar = 1e-8,
    eps_root: Scalar = 0.0,
    mu_dtype: torch.dtype | None = None,
    bias_correction_mu: bool = True,
    bias_correction_nu: bool = True,
) -> GradientTransformation:
    """AMSGrad (Reddi et al. 2018; optax's ``amsgrad``): `scale_by_amsgrad`, then the
    learning rate. (torch's ``Adam(amsgrad=True)`` keeps the maximum of the second
    moment before its bias correction: `fo.adam` with ``amsgrad=True`` follows torch.)

    Example:
        >>> import torch, funcopt as fo
        >>> tx = fo.amsgrad(0.1)
        >>> tx.update([torch.tensor([2.0])], tx.init([torch.zeros(1)]))[0]
        [tensor([-0.1000])]
    """
    return chain(
        scale_by_amsgrad(
            b1=b1,
            b2=b2,
            eps=eps,
            eps_root=eps_root,
            mu_dtype=mu_dtype,
            bias_correction_mu=bias_correction_mu,
            bias_correction_nu=bias_correction_nu,
        ),
        scale_by_learning_rate(learning_rate),
    )


def _fromage_mult(learning_rate: Callable[[Any], Any], count: Any) -> Any:
    return 1 / (1 + learning_rate(count) ** 2) ** 0.5


def _fromage_lr(learning_rate: Callable[[Any], Any], count: Any) -> Any:
    return _fromage_mult(learning_rate, count) * learning_rate(count)


def _fromage_decay(learning_rate: Callable[[Any], Any], count: Any) -> Any:
    return _fromage_mult(learning_rate, count) - 1


def fromage(learning_rate: LearningRate, min_norm: Scalar = 1e-6) -> GradientTransformation:
    """Fromage (Bernstein et al. 2020; optax's ``fromage``): the trust ratio, the
    learning rate over ``sqrt(1 + lr**2)``, and a shrinking of the params by that factor.

    Example:
        >>> import torch, funcopt as fo
        >>> tx = fo.fromage(0.1)
        >>> len(tx.init([torch.zeros(2)]))
        3
    """
    if callable(learning_rate):
        return chain(
            scale_by_trust_ratio(min_norm),
            scale_by_learning_rate(functools.partial(_fromage_lr, learning_rate)),
            add_decayed_weights(functools.partial(_fromage_decay, learning_rate)),
        )
    mult = 1 / (1 + learning_rate**2) ** 0.5
    return chain(
        scale_by_trust_ratio(min_norm),
        scale_by_learning_rate(learning_rate * mult),
        _add_decayed_weights_any_sign(mult - 1),
    )


def _add_decayed_weights_any_sign(weight_decay: Any) -> GradientTransformation:
    """`add_decayed_weights` with a negative factor (Fromage's shrinking), which
    `add_decayed_weights` refuses as a number: given as a 0-d tensor."""
    if isinstance(weight_decay, torch.Tensor):
        return add_decayed_weights(weight_decay)
    return add_decayed_weights(torch.tensor(float(weight_decay), dtype=torch.float64))


def lamb(
    learning_rate: LearningRate,
    b1: Scalar = 0.9,
    b2: Scalar = 0.999,
    eps: Scalar = 1e-6,
    eps_root: Scalar = 0.0,
    weight_decay: Any = 0.0,
    mask: Any = None,
) -> GradientTransformation:
    """LAMB (You et al. 2020; optax's ``lamb``): `scale_by_adam`, `add_decayed_weights`,
    `scale_by_trust_ratio`, the learning rate.

    Example:
        >>> import torch, funcopt as fo
        >>> tx = fo.lamb(0.1)
        >>> p = [torch.tensor([3.0, 4.0])]
        >>> tx.update([torch.tensor([1.0, 0.0])], tx.init(p), p)[0]  # trust ratio 5
        [tensor([-0.5000, -0.0000])]
    """
    return chain(
        scale_by_adam(b1=b1, b2=b2, eps=eps, eps_root=eps_root),
        add_decayed_weights(weight_decay=weight_decay, mask=mask),
        scale_by_trust_ratio(),
        scale_by_learning_rate(learning_rate),
    )


def lars(
    learning_rate: LearningRate,
    weight_decay: Any = 0.0,
    weight_decay_mask: Any = True,
    trust_coefficient: Scalar = 0.001,
    eps: Scalar = 0.0,
    trust_ratio_mask: Any = True,
    momentum: Scalar = 0.9,
    nesterov: bool = False,
) -> GradientTransformation:
    """LARS (You et al. 2017; optax's ``lars``): `add_decayed_weights`, the trust ratio
    (where `trust_ratio_mask`), the learning rate, then momentum (`trace`).

    Example:
        >>> import torch, funcopt as fo
        >>> tx = fo.lars(0.1)
        >>> len(tx.init([torch.zeros(2)]))
        4
    """
    return chain(
        add_decayed_weights(weight_decay, mask=weight_decay_mask),
        masked(scale_by_trust_ratio(trust_coefficient=trust_coefficient, eps=eps), trust_ratio_mask),
        scale_by_learning_rate(learning_rate),
        trace(decay=momentum, nesterov=nesterov),
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
    """Lion as a pure transformation, with optax's arguments and defaults: `fo.Lion`'s
    algorithm (``algorithms/lion.py``, whose math ``scale_by_lion`` runs too), one per
    side of the weight-decay `mask` through `partition`.

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


def nadamw(
    learning_rate: LearningRate,
    b1: Scalar = 0.9,
    b2: Scalar = 0.999,
    eps: Scalar = 1e-8,
    eps_root: Scalar = 0.0,
    mu_dtype: torch.dtype | None = None,
    weight_decay: Any = 1e-4,
    mask: Any = None,
) -> GradientTransformation:
    """NAdamW (optax's ``nadamw``: its ``adamw`` with Dozat's Nesterov momentum):
    ``scale_by_adam(nesterov=True)``, `add_decayed_weights`, the learning rate. (torch's
    ``NAdam`` differs: its momentum decay schedule; see `fo.nadam`.)

    Example:
        >>> import torch, funcopt as fo
        >>> tx = fo.nadamw(1e-3)
        >>> len(tx.init([torch.zeros(2)]))
        3
    """
    return chain(
        scale_by_adam(b1=b1, b2=b2, eps=eps, eps_root=eps_root, mu_dtype=mu_dtype, nesterov=True),
        add_decayed_weights(weight_decay, mask),
        scale_by_learning_rate(learning_rate),
    )


def novograd(
    learning_rate: LearningRate,
    b1: Scalar = 0.9,
    b2: Scalar = 0.25,
    eps: Scalar = 1e-6,
    eps_root: Scalar = 0.0,
    weight_decay: Scalar = 0.0,
) -> GradientTransformation:
    """NovoGrad (Ginsburg et al. 2019; optax's ``novograd``): `scale_by_novograd`, then
    the learning rate. `update` needs the params.

    Example:
        >>> import torch, funcopt as fo
        >>> tx = fo.novograd(0.1, eps=0.0)
        >>> p = [torch.zeros(2)]
        >>> tx.update([torch.tensor([3.0, 4.0])], tx.init(p), p)[0]
        [tensor([-0.0600, -0.0800])]
    """
    return chain(
        scale_by_novograd(b1=b1, b2=b2, eps=eps, eps_root=eps_root, weight_decay=weight_decay),
        scale_by_learning_rate(learning_rate),
    )


def optimistic_gradient_descent(
    learning_rate: LearningRate, alpha: Any = 1.0, beta: Any = 1.0
) -> GradientTransformation:
    """Optimistic gradient descent (Mokhtari et al. 2019; optax's
    ``optimistic_gradient_descent``), for min-max games.

    Example:
        >>> import torch, funcopt as fo
        >>> tx = fo.optimistic_gradient_descent(0.1)
        >>> tx.update([torch.ones(1)], tx.init([torch.zeros(1)]))[0]
        [tensor([-0.1000])]
    """
    return chain(scale_by_optimistic_gradient(alpha=alpha, beta=beta), scale_by_learning_rate(learning_rate))


def optimistic_adam(
    learning_rate: Scalar,
    optimism: Scalar | None = None,
    b1: Scalar = 0.9,
    b2: Scalar = 0.999,
    eps: Scalar = 1e-08,
    eps_root: Scalar = 0.0,
    mu_dtype: torch.dtype | None = None,
    *,
    nesterov: bool = True,
) -> GradientTransformation:
    """Optimistic Adam (Daskalakis et al. 2017; optax's ``optimistic_adam``):
    `scale_by_adam`, the optimistic gradient with ``alpha=learning_rate`` and
    ``beta=optimism`` (default: the learning rate), then a sign flip. The learning rate
    may not be a schedule (as in optax).

    Example:
        >>> import torch, funcopt as fo
        >>> tx = fo.optimistic_adam(0.1)
        >>> tx.update([torch.tensor([2.0])], tx.init([torch.zeros(1)]))[0]
        [tensor([-0.1474])]
    """
    if callable(learning_rate):
        raise ValueError("optimistic_adam does not take a learning rate schedule (as optax's); pass a number")
    return chain(
        scale_by_adam(b1=b1, b2=b2, eps=eps, eps_root=eps_root, mu_dtype=mu_dtype, nesterov=nesterov),
        scale_by_optimistic_gradient(
            alpha=learning_rate, beta=learning_rate if optimism is None else optimism
        ),
        scale_by_learning_rate(1.0),
    )


def polyak_sgd(
    max_learning_rate: Scalar = 1.0,
    scaling: LearningRate = 1.0,
    f_min: Scalar = 0.0,
    eps: Scalar = 0.0,
    variant: str = "sps",
) -> GradientTransformation:
    """SGD with the Polyak step size (Loizou et al. 2021; optax's ``polyak_sgd``): optax's
    ``sgd(scaling)``, then `scale_by_polyak`. `update` needs the loss:
    ``update(g, state, params, value=loss)`` (fo.Optimizer's ``step(closure)`` passes it).

    Example:
        >>> import torch, funcopt as fo
        >>> tx = fo.polyak_sgd()
        >>> tx.update([torch.tensor([1.0, 1.0])], tx.init([torch.zeros(2)]), value=torch.tensor(0.5))[0]
        [tensor([-0.2500, -0.2500])]
    """
    return chain(
        chain(identity(), scale_by_learning_rate(scaling)),
        scale_by_polyak(max_learning_rate=max_learning_rate, f_min=f_min, eps=eps, variant=variant),
    )


def sign_sgd(learning_rate: LearningRate) -> GradientTransformation:
    """signSGD (Bernstein et al. 2018): the sign of the gradient, times the learning rate.

    Example:
        >>> import torch, funcopt as fo
        >>> fo.sign_sgd(0.1).update([torch.tensor([3.0, -0.2])], fo.sign_sgd(0.1).init(None))[0]
        [tensor([-0.1000,  0.1000])]
    """
    return chain(scale_by_sign(), scale_by_learning_rate(learning_rate))


def signum(
    learning_rate: LearningRate, beta: Scalar = 0.9, accumulator_dtype: torch.dtype | None = None
) -> GradientTransformation:
    """Signum (Bernstein et al. 2018; optax's ``signum``): the sign of the momentum (an
    EMA without debiasing), times the learning rate.

    Example:
        >>> import torch, funcopt as fo
        >>> tx = fo.signum(0.1)
        >>> tx.update([torch.tensor([3.0, -0.2])], tx.init([torch.zeros(2)]))[0]
        [tensor([-0.1000,  0.1000])]
    """
    return chain(
        ema(beta, debias=False, accumulator_dtype=accumulator_dtype),
        scale_by_sign(),
        scale_by_learning_rate(learning_rate),
    )


def sm3(learning_rate: Scalar, momentum: Scalar = 0.9) -> GradientTransformation:
    """SM3 (Anil et al. 2019; optax's ``sm3``): `scale_by_sm3` with momentum, then
    ``scale(-learning_rate)`` (no schedule, as in optax).

    Example:
        >>> import torch, funcopt as fo
        >>> tx = fo.sm3(0.1, momentum=0.0)
        >>> tx.update([torch.tensor([2.0, -3.0])], tx.init([torch.zeros(2)]))[0]
        [tensor([-0.1000,  0.1000])]
    """
    return chain(scale_by_sm3(momentum), scale(-learning_rate))


def yogi(
    learning_rate: LearningRate, b1: Scalar = 0.9, b2: Scalar = 0.999, eps: Scalar = 1e-3
) -> GradientTransformation:
    """Yogi (Zaheer et al. 2018; optax's ``yogi``): `scale_by_yogi`, then the learning rate.

    Example:
        >>> import torch, funcopt as fo
        >>> tx = fo.yogi(0.1)
        >>> type(tx.init([torch.zeros(2)])[0]).__name__
        'ScaleByAdamState'
    """
    return chain(scale_by_yogi(b1=b1, b2=b2, eps=eps), scale_by_learning_rate(learning_rate))
