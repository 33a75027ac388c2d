"""The drop-in classes of the step-size-adaptive methods, `Prodigy` and `DAdaptAdamW`,
with the constructors of the authors' packages (``prodigyopt``, ``dadaptation``).

Each steps a param group in place with foreach ops, through the same math as its
functional form (``catalogue/distance_math.py``: the functional runs it with pure ops).
Their step size ``d`` comes from sums over the group's params, read on the host once
per step, as the authors' code reads them. A group's scalars (``estim_lr``, the
estimate ``d``; ``numerator_weighted``; ``count``, the steps taken) are kept in the
param group, as the authors' packages keep theirs; the per-param buffers in
``optimizer.state``. A state_dict of the earlier `fo.Optimizer`-based classes, which
kept the scalars in each param's state, loads too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor
from torch.optim.optimizer import ParamsT

from ..catalogue.distance_math import IN_PLACE, dadapt_step, prodigy_step
from .catalogue_classes import _check

__all__ = ["DAdaptAdamW", "Prodigy"]

_SCALARS = ("estim_lr", "numerator_weighted", "count")
PART = 1 << 16
"""The most elements of a part of a group that the foreach ops step at once (a larger param
steps alone): a large model's temporaries are then reused from step to step, where
whole-group lists would map them anew from the OS (page faults: 2.5x prodigyopt's step
on 24M float32 elements, on CPU)."""


def _parts(lists: list[list[Tensor]]) -> list[tuple[list[Tensor], ...]]:
    """``(out, params, grads, *buffers)`` for each part of the group's lists (``out`` is
    the params: the step is in place)."""
    bounds, start, size = [], 0, 0
    for i, p in enumerate(lists[0]):
        if size and size + p.numel() > PART:
            bounds.append((start, i))
            start, size = i, 0
        size += p.numel()
    bounds.append((start, len(lists[0])))
    parts = []
    for a, b in bounds:
        ps = lists[0][a:b]
        parts.append((ps, ps, *(column[a:b] for column in lists[1:])))
    return parts


def _real(t: Tensor) -> Tensor:
    return torch.view_as_real(t) if t.is_complex() else t


class _Distance(torch.optim.Optimizer):
    """What the two classes share: the step over each group's params with a gradient,
    their buffers made at their first step, and the group's scalars."""

    buffers: tuple[str, ...] = ()

    def _math(self, group: dict[str, Any], lists: list[list[Tensor]], scalars: tuple[Any, ...]) -> Any:
        raise NotImplementedError

    def _new_buffers(self, p: Tensor) -> dict[str, Tensor]:
        zeros = lambda: torch.zeros_like(p, memory_format=torch.preserve_format)  # noqa: E731
        return {"exp_avg": zeros(), "exp_avg_sq": zeros(), "grad_sum": zeros()}

    def _scalars(self, group: dict[str, Any]) -> tuple[float, float, int]:
        """The group's scalars; taken out of the params' state where an earlier version's
        state_dict put them, and started at ``d0``, 0 and 0 at the first step."""
        for p in group["params"]:
            state = self.state.get(p, {})
            if "estim_lr" in state:  # the fo.Optimizer-based classes' state
                values = [state.pop(k) for k in _SCALARS]
                group.update(zip(_SCALARS, (float(values[0]), float(values[1]), int(values[2]))))
                for q in group["params"]:
                    for k in _SCALARS:
                        self.state.get(q, {}).pop(k, None)
                break
        group.setdefault("estim_lr", float(group["d0"]))
        group.setdefault("numerator_weighted", 0.0)
        group.setdefault("count", 0)
        return group["estim_lr"], group["numerator_weighted"], group["count"]

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """One step of each param group; `closure` (optional) recomputes the loss,
        which is returned."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            ps = [p for p in group["params"] if p.grad is not None]
            if not ps:
                continue
            for p in ps:
                if p.grad.is_sparse:
                    raise RuntimeError(f"{type(self).__name__} does not support sparse gradients")
                if not self.state[p]:
                    self.state[p].update(self._new_buffers(p))
            estim_lr, numerator, count = self._scalars(group)
            lists = [[_real(p) for p in ps], [_real(p.grad) for p in ps]]
            lists += [[_real(self.state[p][k]) for p in ps] for k in self.buffers]
            d, numerator = self._math(group, lists, (estim_lr, numerator, count + 1))
            group.update(estim_lr=d, numerator_weighted=numerator, count=count + 1)
        return loss


class Prodigy(_Distance):
    """Prodigy (Mishchenko and Defazio 2023) with the constructor of the authors'
    ``prodigyopt.Prodigy`` (its ``decouple=True``; no ``growth_rate``, ``slice_p`` or
    ``fsdp_in_use``): for one param group it steps as ``prodigyopt`` to float64
    round-off. With several groups ``prodigyopt`` estimates one step size for all of
    them, this class one per group (each group steps on its own). With
    ``use_bias_correction=True`` it is optax's ``prodigy``. The functional form is
    `fo.prodigy` (``bias_correction=False`` for this class's default).

    Example:
        >>> import torch, funcopt as fo
        >>> opt = fo.Prodigy(torch.nn.Linear(2, 1).parameters())
    """

    buffers = ("exp_avg", "exp_avg_sq", "grad_sum", "params0")

    def __init__(
        self,
        params: ParamsT,
        lr: float = 1.0,
        betas: tuple[float, float] = (0.9, 0.999),
        beta3: float | None = None,
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        use_bias_correction: bool = False,
        safeguard_warmup: bool = False,
        d0: float = 1e-6,
        d_coef: float = 1.0,
    ) -> None:
        _check(lr, eps, weight_decay, betas)
        defaults = dict(
            lr=lr, betas=tuple(betas), beta3=beta3, eps=eps, weight_decay=weight_decay,
            use_bias_correction=use_bias_correction, safeguard_warmup=safeguard_warmup, d0=d0, d_coef=d_coef,
        )  # fmt: skip
        super().__init__(params, defaults)

    def _new_buffers(self, p: Tensor) -> dict[str, Tensor]:
        return {**super()._new_buffers(p), "params0": p.detach().clone(memory_format=torch.preserve_format)}

    def _math(self, group: dict[str, Any], lists: list[list[Tensor]], scalars: tuple[Any, ...]) -> Any:
        _, new = prodigy_step(
            IN_PLACE, _parts(lists), *scalars, lr=float(group["lr"]), betas=group["betas"], beta3=group["beta3"],
            eps=group["eps"], d0=group["d0"], d_coef=group["d_coef"], weight_decay=group["weight_decay"],
            safeguard_warmup=group["safeguard_warmup"], bias_correction=group["use_bias_correction"],
        )  # fmt: skip
        return new


class DAdaptAdamW(_Distance):
    """D-Adaptation AdamW (Defazio and Mishchenko 2023) with the constructor of the
    authors' ``dadaptation.DAdaptAdam(decouple=True)`` (no ``growth_rate``,
    ``log_every`` or ``fsdp_in_use``): for one param group it steps as ``dadaptation``
    to float64 round-off. With several groups ``dadaptation`` estimates one step size
    for all, this class one per group. With ``use_bias_correction=True`` it is optax's
    ``dadapt_adamw``. The functional form is `fo.dadapt_adamw`.

    Example:
        >>> import torch, funcopt as fo
        >>> opt = fo.DAdaptAdamW(torch.nn.Linear(2, 1).parameters())
    """

    buffers = ("exp_avg", "exp_avg_sq", "grad_sum")

    def __init__(
        self,
        params: ParamsT,
        lr: float = 1.0,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        use_bias_correction: bool = False,
        d0: float = 1e-6,
    ) -> None:
        _check(lr, eps, weight_decay, betas)
        defaults = dict(
            lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay,
            use_bias_correction=use_bias_correction, d0=d0,
        )  # fmt: skip
        super().__init__(params, defaults)

    def _math(self, group: dict[str, Any], lists: list[list[Tensor]], scalars: tuple[Any, ...]) -> Any:
        _, new = dadapt_step(
            IN_PLACE, _parts(lists), *scalars, lr=float(group["lr"]), betas=group["betas"], eps=group["eps"],
            weight_decay=group["weight_decay"], bias_correction=group["use_bias_correction"],
        )  # fmt: skip
        return new
