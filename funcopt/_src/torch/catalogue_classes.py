"""Drop-in ``torch.optim.Optimizer`` classes for the catalogue's optimizers whose math is
no per-tensor `fo.Algorithm` (the others are in ``catalogue_inplace.py`` and
``lamb_adan_classes.py``): MoMo and the
Polyak step size read the loss and sums over a param group's params; SM3 keeps its
accumulators as one vector per dimension, unlike its params. Each steps a param group in
place, with foreach ops where the math is per element, through the same math as its
functional form (``catalogue/loss_step_math.py``, ``catalogue/sm3_math.py``; the
functional runs it with pure ops), to float64 round-off of it; the sums are read on the
host once per group and step. Constructors are torch-style (``params, lr, ...``);
param groups, lr schedulers, ``state_dict`` and hooks work as for any torch optimizer.
A state_dict of the earlier `fo.Optimizer`-based classes loads too."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import torch
from torch import Tensor
from torch.optim.optimizer import ParamsT

from ..catalogue.distance_math import IN_PLACE
from ..catalogue.loss_step_math import momo_step, polyak_step_size
from ..catalogue.sm3_math import IN_PLACE as SM3_IN_PLACE
from ..catalogue.sm3_math import sm3_moments

__all__ = [
    "Momo",
    "PolyakSGD",
    "SM3",
]


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


def _real(t: Tensor) -> Tensor:
    return torch.view_as_real(t) if t.is_complex() else t


class _Stepped(torch.optim.Optimizer):
    """The step over each param group's params with a gradient, in place: `_step`."""

    needs_loss = False

    def _step(self, group: dict[str, Any], ps: list[Tensor], gs: list[Tensor], loss: float | None) -> None:
        raise NotImplementedError

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """One step of each param group; `closure` recomputes the loss, which is
        returned (required where the method reads the loss)."""
        name = type(self).__name__
        if closure is None and self.needs_loss:
            raise ValueError(
                f"{name} needs the loss: call step(closure), the closure computing the loss and its gradients"
            )
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        value = None
        if self.needs_loss:
            if loss is None:
                raise ValueError(f"{name} needs the loss: the closure returned None; return the loss")
            value = float(loss)
        for group in self.param_groups:
            ps = [p for p in group["params"] if p.grad is not None]
            for p in ps:
                if p.grad.is_sparse:
                    raise RuntimeError(f"{name} does not support sparse gradients")
            if ps:
                self._step(group, ps, [cast(Tensor, p.grad) for p in ps], value)
        return loss


class Momo(_Stepped):
    """MoMo (Schaipp et al. 2023) as `fo.momo`. ``step(closure)`` is required: MoMo
    reads the loss the closure returns. Each param group has its own step size and
    averages (``barf``, ``gamma``, ``lb``, ``count``, kept in the group); the momentum
    ``exp_avg`` in each param's state.

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

    needs_loss = True
    _scalars = ("barf", "gamma", "lb", "count")

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
        defaults = dict(
            lr=lr,
            beta=beta,
            lower_bound=lower_bound,
            weight_decay=weight_decay,
            adapt_lower_bound=adapt_lower_bound,
        )
        super().__init__(params, defaults)

    def _group_scalars(self, group: dict[str, Any]) -> tuple[float, float, float, int]:
        """The group's averages and count: taken out of the params' state where the
        earlier class's state_dict put them (0-d tensors), else started."""
        for p in group["params"]:
            old = self.state.get(p, {})
            if "barf" in old:
                group.update((k, float(old[k]) if k != "count" else int(old[k])) for k in self._scalars)
                for q in group["params"]:
                    for k in self._scalars:
                        self.state.get(q, {}).pop(k, None)
                break
        group.setdefault("barf", 0.0)
        group.setdefault("gamma", 0.0)
        group.setdefault("lb", float(group["lower_bound"]))
        group.setdefault("count", 0)
        return group["barf"], group["gamma"], group["lb"], group["count"]

    def _step(self, group: dict[str, Any], ps: list[Tensor], gs: list[Tensor], loss: float | None) -> None:
        barf, gamma, lb, count = self._group_scalars(group)
        for p in ps:
            if "exp_avg" not in self.state[p]:
                self.state[p]["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        reals = [_real(p) for p in ps]
        _, _, (barf, gamma, lb) = momo_step(
            IN_PLACE, reals, reals, [_real(g) for g in gs], [_real(self.state[p]["exp_avg"]) for p in ps],
            (barf, gamma, lb), count == 0, loss, lr=float(group["lr"]), beta=group["beta"],
            lower_bound=group["lower_bound"], weight_decay=group["weight_decay"],
            adapt_lower_bound=group["adapt_lower_bound"],
        )  # fmt: skip
        group.update(barf=barf, gamma=gamma, lb=lb, count=count + 1)


class PolyakSGD(_Stepped):
    """SGD with the Polyak step size as `fo.polyak_sgd` (``lr`` is its ``scaling``,
    ``max_lr`` its ``max_learning_rate``), the step size from each param group's
    gradients. ``step(closure)`` is required: it reads the loss. No state.

    Example:
        >>> import torch, funcopt as fo
        >>> opt = fo.PolyakSGD(torch.nn.Linear(2, 1).parameters(), max_lr=0.5)
    """

    needs_loss = True

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
        if variant not in ("sps", "sps+"):
            raise ValueError(f"PolyakSGD: variant must be 'sps' or 'sps+', got {variant!r}")
        super().__init__(params, dict(lr=lr, max_lr=max_lr, f_min=f_min, eps=eps, variant=variant))

    def _step(self, group: dict[str, Any], ps: list[Tensor], gs: list[Tensor], loss: float | None) -> None:
        gs = [_real(g) for g in gs]
        lr = float(group["lr"])
        (sq_norm,) = IN_PLACE.dots([(gs, gs)])
        step = polyak_step_size(
            loss, lr * lr * sq_norm, f_min=group["f_min"], max_lr=group["max_lr"], eps=group["eps"],
            variant=group["variant"],
        )  # fmt: skip
        torch._foreach_add_([_real(p) for p in ps], gs, alpha=-lr * step)


class SM3(_Stepped):
    """SM3 (Anil et al. 2019) as `fo.sm3`: per param, its accumulator as one vector per
    dimension (``accumulators``) and the momentum of the scaled gradient
    (``momentum_buffer``), in its state.

    Example:
        >>> import torch, funcopt as fo
        >>> opt = fo.SM3(torch.nn.Linear(2, 1).parameters(), lr=0.1)
    """

    _old_keys = {"0.mu": "accumulators", "0.nu": "momentum_buffer"}  # the earlier class's (optax's chain)

    def __init__(self, params: ParamsT, lr: float = 0.1, momentum: float = 0.9) -> None:
        _check(lr, 0.0, 0.0, (momentum,))
        super().__init__(params, dict(lr=lr, momentum=momentum))

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        states = state_dict.get("state", {})
        if any(key in self._old_keys for state in states.values() for key in state):
            renamed = {i: {self._old_keys.get(k, k): v for k, v in s.items()} for i, s in states.items()}
            state_dict = {**state_dict, "state": renamed}
        super().load_state_dict(state_dict)

    def _step(self, group: dict[str, Any], ps: list[Tensor], gs: list[Tensor], loss: float | None) -> None:
        nus = []
        for p, g in zip(ps, gs):
            state = self.state[p]
            if not state:
                if p.ndim == 0 or p.is_complex():
                    raise ValueError(
                        "SM3 takes real params of one or more dimensions (as optax's); reshape a 0-d param to "
                        "shape (1,), or leave it out of the optimizer"
                    )
                state["accumulators"] = [torch.zeros(n, dtype=p.dtype, device=p.device) for n in p.shape]
                state["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            sm3_moments(
                SM3_IN_PLACE, g, state["accumulators"], state["momentum_buffer"], c0=1.0, c2=1.0,
                b1=group["momentum"], eps=1e-8,
            )  # fmt: skip
            nus.append(state["momentum_buffer"])
        torch._foreach_add_(ps, nus, alpha=-float(group["lr"]))
