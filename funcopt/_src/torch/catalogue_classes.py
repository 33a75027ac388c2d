"""Drop-in ``torch.optim.Optimizer`` classes for the catalogue's optimizers that stay on
the functional path (Momo and PolyakSGD read the loss; SM3 keeps per-axis accumulators
unlike its params; the others are in ``catalogue_inplace.py``): thin subclasses of `fo.Optimizer` (which runs any transformation as a torch optimizer) with
torch-style constructors (``params, lr, betas, eps, weight_decay``). Each steps exactly
as its functional form (optax's math); param groups, lr schedulers, ``state_dict`` and
hooks work as for any torch optimizer. Where the method's own torch package differs
from optax's math, the class docstring says how."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ..catalogue.adaptive import momo
from ..catalogue.aliases import polyak_sgd, sm3
from ..core.base import GradientTransformation
from .adapter import Optimizer

__all__ = [
    "Momo",
    "PolyakSGD",
    "SM3",
]

ParamsT = Iterable[Any]


def _check(lr: Any = 0.0, eps: Any = 0.0, weight_decay: Any = 0.0, betas: tuple[Any, ...] = ()) -> None:
    """torch.optim's argument checks, with its messages."""
    if not isinstance(lr, (int, float)) or isinstance(lr, bool):
        if not hasattr(lr, "shape"):
            raise TypeError(f"lr must be a number or a 0-d tensor, got {type(lr).__name__}")
    elif lr < 0.0:
        raise ValueError(f"Invalid learning rate: {lr}")
    if not 0.0 <= eps:
        raise ValueError(f"Invalid epsilon value: {eps}")
    if not 0.0 <= weight_decay:
        raise ValueError(f"Invalid weight_decay value: {weight_decay}")
    for i, beta in enumerate(betas):
        if not 0.0 <= beta < 1.0:
            raise ValueError(f"Invalid beta parameter at index {i}: {beta}")


# module-level factories, so that the optimizers pickle; fo.Optimizer calls each with the
# param group's current values at every step (an lr scheduler's lr included)


def _momo(
    lr: Any, beta: Any, lower_bound: Any, weight_decay: Any, adapt_lower_bound: bool
) -> GradientTransformation:
    return momo(
        lr, beta=beta, lower_bound=lower_bound, weight_decay=weight_decay, adapt_lower_bound=adapt_lower_bound
    )


class Momo(Optimizer):
    """MoMo (Schaipp et al. 2023) as `fo.momo`. ``step(closure)`` is required: MoMo
    reads the loss the closure returns.

    Example:
        >>> import torch, funcopt as fo
        >>> model = torch.nn.Linear(2, 1)
        >>> opt = fo.Momo(model.parameters(), lr=1.0)
        >>> def closure():
        ...     opt.zero_grad()
        ...     loss = model(torch.ones(1, 2)).pow(2).sum()
        ...     loss.backward()
        ...     return loss
        >>> loss = opt.step(closure)
    """

    def __init__(
        self,
        params: ParamsT,
        lr: float = 1.0,
        beta: float = 0.9,
        lower_bound: float = 0.0,
        weight_decay: float = 0.0,
        adapt_lower_bound: bool = False,
    ) -> None:
        _check(lr, 0.0, weight_decay, (beta,))
        super().__init__(
            params, _momo, lr=lr, beta=beta, lower_bound=lower_bound, weight_decay=weight_decay,
            adapt_lower_bound=adapt_lower_bound,
        )  # fmt: skip


def _polyak(lr: Any, max_lr: Any, f_min: Any, eps: Any, variant: str) -> GradientTransformation:
    return polyak_sgd(max_learning_rate=max_lr, scaling=lr, f_min=f_min, eps=eps, variant=variant)


class PolyakSGD(Optimizer):
    """SGD with the Polyak step size as `fo.polyak_sgd` (``lr`` is its ``scaling``,
    ``max_lr`` its ``max_learning_rate``). ``step(closure)`` is required: it reads the loss.

    Example:
        >>> import torch, funcopt as fo
        >>> opt = fo.PolyakSGD(torch.nn.Linear(2, 1).parameters(), max_lr=0.5)
    """

    def __init__(
        self,
        params: ParamsT,
        lr: float = 1.0,
        max_lr: float = 1.0,
        f_min: float = 0.0,
        eps: float = 0.0,
        variant: str = "sps",
    ) -> None:
        _check(lr, eps, 0.0)
        super().__init__(params, _polyak, lr=lr, max_lr=max_lr, f_min=f_min, eps=eps, variant=variant)


def _sm3(lr: Any, momentum: Any) -> GradientTransformation:
    return sm3(lr, momentum=momentum)


class SM3(Optimizer):
    """SM3 (Anil et al. 2019) as `fo.sm3`.

    Example:
        >>> import torch, funcopt as fo
        >>> opt = fo.SM3(torch.nn.Linear(2, 1).parameters(), lr=0.1)
    """

    def __init__(self, params: ParamsT, lr: float = 0.1, momentum: float = 0.9) -> None:
        _check(lr, 0.0, 0.0, (momentum,))
        super().__init__(params, _sm3, lr=lr, momentum=momentum)
