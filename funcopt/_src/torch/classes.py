"""The drop-in torch.optim classes: torch's constructors, checks and `state_dict` format,
each stepping its algorithm's math (`algorithms/`) in place through `Optimizer`."""

from __future__ import annotations

from typing import Any

from torch import Tensor
from torch.optim.optimizer import ParamsT

from ..algorithms.adadelta import ADADELTA
from ..algorithms.adafactor import ADAFACTOR
from ..algorithms.adagrad import ADAGRAD
from ..algorithms.adamax import ADAMAX
from ..algorithms.asgd import ASGD_
from ..algorithms.lion import LION
from ..algorithms.muon import DEFAULT_NS_COEFFICIENTS, MUON
from ..algorithms.nadam import NADAM
from ..algorithms.rmsprop import RMSPROP
from ..algorithms.rprop import RPROP
from ..algorithms.sgd import SGD_
from ..engine.bounds import Hyperparams
from .adapter import Optimizer
from .fused import fused_flag
from .torch_kernels import KernelOptimizer


class Adadelta(Optimizer):
    """Drop-in ``torch.optim.Adadelta``: same arguments, state keys and ``state_dict``
    format, running funcopt's `adadelta` math in place."""

    def __init__(
        self,
        params: ParamsT,
        lr: float | Tensor = 1.0,
        rho: float = 0.9,
        eps: float = 1e-6,
        weight_decay: float = 0,
        foreach: bool | None = None,
        *,
        capturable: bool = False,
        maximize: bool = False,
        differentiable: bool = False,
        fused: bool | None = None,
    ) -> None:
        super().__init__(
            params,
            ADADELTA,
            lr=lr,
            rho=rho,
            eps=eps,
            weight_decay=weight_decay,
            maximize=maximize,
            capturable=capturable,
            foreach=foreach,
            differentiable=differentiable,
            **fused_flag(fused),
        )


class Adafactor(Optimizer):
    """Drop-in ``torch.optim.Adafactor``: same arguments, state keys and ``state_dict``
    format, running funcopt's `adafactor` math in place."""

    def __init__(
        self,
        params: ParamsT,
        lr: float | Tensor = 1e-2,
        beta2_decay: float = -0.8,
        eps: tuple[float | None, float] = (None, 1e-3),
        d: float = 1.0,
        weight_decay: float = 0.0,
        *,
        foreach: bool | None = None,
        maximize: bool = False,
        fused: bool | None = None,
    ) -> None:
        super().__init__(
            params,
            ADAFACTOR,
            lr=lr,
            beta2_decay=beta2_decay,
            eps=eps,
            d=d,
            weight_decay=weight_decay,
            foreach=foreach,
            maximize=maximize,
            **fused_flag(fused),
        )


class Adagrad(KernelOptimizer):
    """Drop-in ``torch.optim.Adagrad``: same arguments, state keys and ``state_dict``
    format (its state is created at construction, as torch does), running funcopt's
    `adagrad` math in place."""

    def __init__(
        self,
        params: ParamsT,
        lr: float | Tensor = 1e-2,
        lr_decay: float = 0,
        weight_decay: float = 0,
        initial_accumulator_value: float = 0,
        eps: float = 1e-10,
        foreach: bool | None = None,
        *,
        maximize: bool = False,
        differentiable: bool = False,
        fused: bool | None = None,
    ) -> None:
        super().__init__(
            params,
            ADAGRAD,
            lr=lr,
            lr_decay=lr_decay,
            eps=eps,
            weight_decay=weight_decay,
            initial_accumulator_value=initial_accumulator_value,
            foreach=foreach,
            maximize=maximize,
            differentiable=differentiable,
            fused=fused,
        )

    def share_memory(self) -> None:
        """Move the state sums to shared memory (``Tensor.share_memory_``), as torch's
        Adagrad does, for Hogwild training with ``torch.multiprocessing``: steps write
        into them in place, so every process sees the others' updates."""
        for group in self.param_groups:
            for p in group["params"]:
                self.state[p]["sum"].share_memory_()


class Adamax(Optimizer):
    """Drop-in ``torch.optim.Adamax``: same arguments, state keys and ``state_dict``
    format, running funcopt's `adamax` math in place."""

    def __init__(
        self,
        params: ParamsT,
        lr: float | Tensor = 2e-3,
        betas: tuple[float | Tensor, float | Tensor] | Tensor = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0,
        foreach: bool | None = None,
        *,
        maximize: bool = False,
        differentiable: bool = False,
        capturable: bool = False,
        fused: bool | None = None,
    ) -> None:
        super().__init__(
            params,
            ADAMAX,
            lr=lr,
            betas=betas,
            eps=eps,
            weight_decay=weight_decay,
            foreach=foreach,
            maximize=maximize,
            differentiable=differentiable,
            capturable=capturable,
            **fused_flag(fused),
        )


class ASGD(Optimizer):
    """Drop-in ``torch.optim.ASGD``: same arguments, state keys and ``state_dict``
    format, running funcopt's `asgd` math in place."""

    def __init__(
        self,
        params: ParamsT,
        lr: float | Tensor = 1e-2,
        lambd: float = 1e-4,
        alpha: float = 0.75,
        t0: float = 1e6,
        weight_decay: float = 0,
        foreach: bool | None = None,
        maximize: bool = False,
        differentiable: bool = False,
        capturable: bool = False,
        *,
        fused: bool | None = None,
    ) -> None:
        super().__init__(
            params,
            ASGD_,
            lr=lr,
            lambd=lambd,
            alpha=alpha,
            t0=t0,
            weight_decay=weight_decay,
            foreach=foreach,
            maximize=maximize,
            differentiable=differentiable,
            capturable=capturable,
            **fused_flag(fused),
        )

    def _group_hyperparams(self, group: dict[str, Any]) -> Hyperparams:
        """A group's hyperparameters, with the schedule told to round the next eta and
        mu to the default dtype, as torch's ``torch.as_tensor`` does before it copies
        them into its counters (of another dtype once loaded for float64 params)."""
        return {**super()._group_hyperparams(group), "as_torch_tensor": True}


class Muon(Optimizer):
    """Drop-in ``torch.optim.Muon``: same arguments, state keys and ``state_dict`` format,
    running funcopt's `muon` math in place. Every param must be 2-D, as torch checks."""

    def __init__(
        self,
        params: ParamsT,
        lr: float = 1e-3,
        weight_decay: float = 0.1,
        momentum: float = 0.95,
        nesterov: bool = True,
        ns_coefficients: tuple[float, float, float] = DEFAULT_NS_COEFFICIENTS,
        eps: float = 1e-7,
        ns_steps: int = 5,
        adjust_lr_fn: str | None = None,
        *,
        fused: bool | None = None,
    ) -> None:
        super().__init__(
            params,
            MUON,
            lr=lr,
            weight_decay=weight_decay,
            momentum=momentum,
            nesterov=nesterov,
            ns_coefficients=ns_coefficients,
            eps=eps,
            ns_steps=ns_steps,
            adjust_lr_fn=adjust_lr_fn,
            **fused_flag(fused),
        )
        for group in self.param_groups:
            for p in group["params"]:
                if p.ndim != 2:
                    raise ValueError(
                        f"Muon only supports 2D parameters whereas we found a parameter with size: {p.size()}"
                    )


class NAdam(Optimizer):
    """Drop-in ``torch.optim.NAdam``: same arguments, state keys and ``state_dict`` format,
    running funcopt's `nadam` math in place."""

    def __init__(
        self,
        params: ParamsT,
        lr: float | Tensor = 2e-3,
        betas: tuple[float | Tensor, float | Tensor] | Tensor = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0,
        momentum_decay: float = 4e-3,
        decoupled_weight_decay: bool = False,
        *,
        foreach: bool | None = None,
        maximize: bool = False,
        capturable: bool = False,
        differentiable: bool = False,
        fused: bool | None = None,
    ) -> None:
        super().__init__(
            params,
            NADAM,
            lr=lr,
            betas=betas,
            eps=eps,
            weight_decay=weight_decay,
            momentum_decay=momentum_decay,
            decoupled_weight_decay=decoupled_weight_decay,
            maximize=maximize,
            foreach=foreach,
            capturable=capturable,
            differentiable=differentiable,
            **fused_flag(fused),
        )


class RMSprop(Optimizer):
    """Drop-in ``torch.optim.RMSprop``: same arguments, state keys and ``state_dict``
    format, running funcopt's `rmsprop` math in place."""

    def __init__(
        self,
        params: ParamsT,
        lr: float | Tensor = 1e-2,
        alpha: float = 0.99,
        eps: float = 1e-8,
        weight_decay: float = 0,
        momentum: float = 0,
        centered: bool = False,
        capturable: bool = False,
        foreach: bool | None = None,
        maximize: bool = False,
        differentiable: bool = False,
        *,
        fused: bool | None = None,
    ) -> None:
        super().__init__(
            params,
            RMSPROP,
            lr=lr,
            momentum=momentum,
            alpha=alpha,
            eps=eps,
            centered=centered,
            weight_decay=weight_decay,
            capturable=capturable,
            foreach=foreach,
            maximize=maximize,
            differentiable=differentiable,
            **fused_flag(fused),
        )


class Rprop(Optimizer):
    """Drop-in ``torch.optim.Rprop``: same arguments, state keys and ``state_dict``
    format, running funcopt's `rprop` math in place."""

    def __init__(
        self,
        params: ParamsT,
        lr: float | Tensor = 1e-2,
        etas: tuple[float, float] = (0.5, 1.2),
        step_sizes: tuple[float, float] = (1e-6, 50),
        *,
        capturable: bool = False,
        foreach: bool | None = None,
        maximize: bool = False,
        differentiable: bool = False,
        fused: bool | None = None,
    ) -> None:
        super().__init__(
            params,
            RPROP,
            lr=lr,
            etas=etas,
            step_sizes=step_sizes,
            foreach=foreach,
            maximize=maximize,
            differentiable=differentiable,
            capturable=capturable,
            **fused_flag(fused),
        )


class SGD(KernelOptimizer):
    """Drop-in ``torch.optim.SGD``: same arguments, state keys and ``state_dict`` format,
    running funcopt's `sgd` math in place."""

    def __init__(
        self,
        params: ParamsT,
        lr: float | Tensor = 1e-3,
        momentum: float = 0,
        dampening: float = 0,
        weight_decay: float | Tensor = 0,
        nesterov: bool = False,
        *,
        maximize: bool = False,
        foreach: bool | None = None,
        differentiable: bool = False,
        fused: bool | None = None,
    ) -> None:
        super().__init__(
            params,
            SGD_,
            lr=lr,
            momentum=momentum,
            dampening=dampening,
            weight_decay=weight_decay,
            nesterov=nesterov,
            maximize=maximize,
            foreach=foreach,
            differentiable=differentiable,
            fused=fused,
        )

    def __setstate__(self, state: dict[str, Any]) -> None:
        for group in state["param_groups"]:  # an older checkpoint gets torch's SGD defaults
            group.setdefault("fused", False)
        super().__setstate__(state)


class Lion(Optimizer):
    """Lion as a torch optimizer, with the constructor of the authors' PyTorch code (and
    timm's): ``lr``, ``betas``, ``weight_decay`` (decoupled). Its state key is
    ``exp_avg``; it runs funcopt's `lion` math in place."""

    def __init__(
        self,
        params: ParamsT,
        lr: float | Tensor = 1e-4,
        betas: tuple[float | Tensor, float | Tensor] = (0.9, 0.99),
        weight_decay: float = 0.0,
        *,
        maximize: bool = False,
        foreach: bool | None = None,
        capturable: bool = False,
        differentiable: bool = False,
        fused: bool | None = None,
    ) -> None:
        super().__init__(
            params,
            LION,
            lr=lr,
            betas=betas,
            weight_decay=weight_decay,
            maximize=maximize,
            foreach=foreach,
            capturable=capturable,
            differentiable=differentiable,
            **fused_flag(fused),
        )
