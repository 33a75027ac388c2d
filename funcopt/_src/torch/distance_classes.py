"""The drop-in classes of the step-size-adaptive methods, `Prodigy` and `DAdaptAdamW`,
with the constructors of the authors' packages (``prodigyopt``, ``dadaptation``).

Each steps its params in place with foreach ops, through the same math as its
functional form (``catalogue/distance_math.py``: the functional runs it with pure ops).
As in the authors' packages, one step size ``d`` serves all param groups: it comes from
sums over the params of every group, read on the host once per part of a group per
step, as the authors' code reads them once per param. A group sets its own ``eps``,
``weight_decay`` (and Prodigy's ``d0``, ``safeguard_warmup`` and ``slice_p``,
D-Adaptation's ``layer_scale``); its ``lr`` is the others' or 0 (a group left out of
the sums), as the packages allow; what the estimate reads (``betas``, ...) must be the
same in all.
The scalars (``estim_lr``, the estimate ``d``; ``numerator_weighted``; ``count``, the
steps taken) are kept in every param group, alike, as the authors' packages keep
theirs; the per-param buffers in ``optimizer.state``. A state_dict of the earlier
classes, which kept one estimate per group (in the group, or in each param's state
before), loads too: the first group's estimate goes on for all.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor
from torch.optim.optimizer import ParamsT

from ..catalogue.distance_math import Group, ScratchLists, dadapt_step, prodigy_step
from . import package_state
from .catalogue_classes import _check

__all__ = ["DAdaptAdamW", "Prodigy"]

_SCALARS = ("estim_lr", "numerator_weighted", "count")
_FSDP = (
    "Prodigy: fsdp_in_use=True (sharded params) is not supported: fo.Prodigy sums over the params of this "
    "process only, and would take each shard's own step size. Use prodigyopt.Prodigy with FSDP, or unsharded "
    "params (DDP) with fo.Prodigy"
)
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


def _same(t: Tensor) -> Tensor:
    return t


class _Distance(torch.optim.Optimizer):
    """What the two classes share: the step over the params with a gradient, their
    buffers made at their first step, and the scalars kept in every group."""

    buffers: tuple[str, ...] = ()
    shared: tuple[str, ...] = ()  # the hyperparameters the estimate reads: alike in all groups
    package = ""

    def _math(self, parts: list[Any], lr: float, scalars: tuple[Any, ...]) -> dict[str, float] | None:
        """The step over `parts`; the new scalars that every group keeps, None where the
        step was skipped."""
        raise NotImplementedError

    def _group(self, group: dict[str, Any], active: bool) -> Group:
        raise NotImplementedError

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """torch's ``load_state_dict``, which takes the authors' package's state_dict too."""
        super().load_state_dict(package_state.from_package(self, state_dict))

    def _new_buffers(self, p: Tensor, group: dict[str, Any]) -> dict[str, Tensor]:
        zeros = lambda: torch.zeros_like(p, memory_format=torch.preserve_format)  # noqa: E731
        return {"exp_avg": zeros(), "exp_avg_sq": zeros(), "grad_sum": zeros()}

    def _check_state(self, group: dict[str, Any], ps: list[Tensor], states: list[dict[str, Any]]) -> None:
        """Raise where a param's state does not fit the group's settings."""

    def _scalars(self) -> tuple[float, float, int]:
        """The scalars: the first group's that has them (taken out of the params' state
        where an earlier version's state_dict put them), started at ``d0``, 0 and 0."""
        for group in self.param_groups:
            # (stepped, or this version's state_dict: no scalars in the params' state)
            if "estim_lr" in group:
                continue
            for p in group["params"]:
                state = self.state.get(p, {})
                if "estim_lr" in state:  # the fo.Optimizer-based classes' state
                    values = [state.pop(k) for k in _SCALARS]
                    group.update(zip(_SCALARS, (float(values[0]), float(values[1]), int(values[2]))))
                    for q in group["params"]:
                        for k in _SCALARS:
                            self.state.get(q, {}).pop(k, None)
                    break
        first = next((g for g in self.param_groups if "estim_lr" in g), None)
        if first is None:
            return float(self._first_d()), 0.0, 0
        return first["estim_lr"], first["numerator_weighted"], first["count"]

    def _first_d(self) -> float:
        """The estimate ``d`` before the first step."""
        return self.defaults["d0"]

    def _checked_lr(self) -> float:
        """The groups' lr (their largest), checked as the authors' packages check it: one
        value, or 0; and the hyperparameters the estimate reads, alike in all groups."""
        lrs = [float(group["lr"]) for group in self.param_groups]
        lr = max(lrs)
        for i, group in enumerate(self.param_groups):
            if lrs[i] not in (lr, 0.0):
                raise RuntimeError(
                    f"{type(self).__name__}: param group {i} has lr {lrs[i]}, another {lr}; all groups share "
                    f"one step-size estimate, so, as in {self.package}, a group's lr is the others' or 0 "
                    "(a group left out). Give the groups one lr" + self.scale_hint
                )
            for key in self.shared:
                if group.get(key) != self.param_groups[0].get(key):
                    raise ValueError(
                        f"{type(self).__name__}: param group {i} has {key}={group.get(key)!r}, the first "
                        f"{self.param_groups[0].get(key)!r}; the step-size estimate that all groups share reads "
                        f"it (from the first group, in {self.package}): set the same {key} in every group"
                    )
        return lr

    scale_hint = "."

    @property
    def _ops(self) -> ScratchLists:
        """The step's list ops, with the buffer of its temporaries (made at the first step,
        and again after pickling: torch's Optimizer pickles its state and groups only)."""
        ops = self.__dict__.get("_scratch")
        if ops is None:
            ops = self.__dict__["_scratch"] = ScratchLists()
        return ops

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """One step of all param groups; `closure` (optional) recomputes the loss,
        which is returned."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        lr = self._checked_lr()
        parts = []
        for group in self.param_groups:
            ps = [p for p in group["params"] if p.grad is not None]
            states = []
            for p in ps:
                if p.grad.is_sparse:
                    raise RuntimeError(f"{type(self).__name__} does not support sparse gradients")
                state = self.state[p]  # (a Python-level hash of the tensor: once)
                if not state:
                    state.update(self._new_buffers(p, group))
                states.append(state)
            if ps:
                self._check_state(group, ps, states)
                real = _real if any(p.is_complex() for p in ps) else _same
                lists = [[real(p) for p in ps], [real(p.grad) for p in ps]]
                lists += [[real(state[k]) for state in states] for k in self.buffers]
                options = self._group(group, float(group["lr"]) > 0)
                parts += [(options, *part) for part in _parts(lists)]
        estim_lr, numerator, count = self._scalars()
        new = self._math(parts, lr, (estim_lr, numerator, count + 1))
        if new is not None:  # (None: no sum yet, no step, as the authors' packages)
            for group in self.param_groups:
                group.update(new, count=count + 1)
        return loss


class Prodigy(_Distance):
    """Prodigy (Mishchenko and Defazio 2023) with the constructor of the authors'
    ``prodigyopt.Prodigy`` (its ``decouple=True``; ``fsdp_in_use=True`` is refused): it
    steps as ``prodigyopt``, bit for bit, one step size for all param groups.
    ``growth_rate`` (default inf) bounds the growth of the estimate ``d`` per step, as
    ``prodigyopt``'s (1.02: a warmup); the largest estimate yet is kept as ``d_max``
    with the other scalars, in every group. A group may set its own ``weight_decay``,
    ``eps``, ``d0`` (which scales its sums, ``d / d0``), ``safeguard_warmup`` and
    ``slice_p`` (its sums over every ``slice_p``-th element of each param: ``grad_sum``
    and ``params0`` hold those, flattened), and ``lr`` 0 (the others' lr else);
    ``betas``, ``beta3``, ``d_coef``, ``use_bias_correction`` and ``growth_rate`` are
    the same in all. With ``use_bias_correction=True`` and one group it is optax's
    ``prodigy``. The functional form is `fo.prodigy` (``bias_correction=False`` for
    this class's default).

    Example:
        >>> import torch, funcopt as fo
        >>> opt = fo.Prodigy(torch.nn.Linear(2, 1).parameters())
    """

    buffers = ("exp_avg", "exp_avg_sq", "grad_sum", "params0")
    shared = ("betas", "beta3", "d_coef", "use_bias_correction", "growth_rate")
    package = "prodigyopt"

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
        growth_rate: float = float("inf"),
        fsdp_in_use: bool = False,
        slice_p: int = 1,
    ) -> None:
        _check(lr, eps, weight_decay, betas)
        if isinstance(slice_p, bool) or not isinstance(slice_p, int) or slice_p < 1:
            raise ValueError(f"Invalid slice_p value: {slice_p!r} (a whole number, 1 or more)")
        if not growth_rate > 0:
            raise ValueError(
                f"Invalid growth_rate value: {growth_rate!r} (the most d grows by a step: above 0)"
            )
        if fsdp_in_use:
            raise ValueError(_FSDP)
        defaults = dict(
            lr=lr, betas=tuple(betas), beta3=beta3, eps=eps, weight_decay=weight_decay,
            use_bias_correction=use_bias_correction, safeguard_warmup=safeguard_warmup, d0=d0, d_coef=d_coef,
            growth_rate=growth_rate, slice_p=slice_p,
        )  # fmt: skip
        super().__init__(params, defaults)

    def _first_d(self) -> float:
        return self.defaults["d0"]  # (prodigyopt's: a group's d0 scales that group's sums only)

    def _new_buffers(self, p: Tensor, group: dict[str, Any]) -> dict[str, Tensor]:
        k = group.get("slice_p", 1)  # (a state_dict of the earlier class has none)
        if k == 1:
            return {
                **super()._new_buffers(p, group),
                "params0": p.detach().clone(memory_format=torch.preserve_format),
            }
        sliced = p.detach().reshape(-1)[::k]
        zeros = lambda: torch.zeros_like(p, memory_format=torch.preserve_format)  # noqa: E731
        return {"exp_avg": zeros(), "exp_avg_sq": zeros(), "grad_sum": torch.zeros_like(sliced),
                "params0": sliced.clone()}  # fmt: skip

    def _check_state(self, group: dict[str, Any], ps: list[Tensor], states: list[dict[str, Any]]) -> None:
        k = group.get("slice_p", 1)
        for p, state in zip(ps, states):
            if hasattr(p, "_fsdp_flattened"):
                raise RuntimeError(_FSDP)
            if state["grad_sum"].numel() != (p.numel() + k - 1) // k:
                raise ValueError(
                    f"Prodigy: a param's grad_sum has {state['grad_sum'].numel()} elements, not those of "
                    f"every {k}-th of its {p.numel()} (its group's slice_p): keep a group's slice_p from its "
                    "first step on"
                )

    def _group(self, group: dict[str, Any], active: bool) -> Group:
        return Group(group["eps"], group["weight_decay"], d0=group["d0"], safeguard_warmup=group["safeguard_warmup"],
                     slice_p=group.get("slice_p", 1), active=active)  # fmt: skip

    def _math(self, parts: list[Any], lr: float, scalars: tuple[Any, ...]) -> dict[str, float] | None:
        first = self.param_groups[0]
        # (prodigyopt compares d with its last group's d0; a state_dict of the earlier
        # class has no growth_rate or d_max: d is then the largest estimate yet)
        growth = (
            first.get("d_max", scalars[0]),
            first.get("growth_rate", float("inf")),
            self.param_groups[-1]["d0"],
        )
        new = prodigy_step(
            self._ops, parts, *scalars, lr=lr, betas=first["betas"], beta3=first["beta3"], d_coef=first["d_coef"],
            bias_correction=first["use_bias_correction"], grad_step_at_beta1_0=True, growth=growth,
        )[1]  # fmt: skip
        return None if new is None else dict(zip(("estim_lr", "numerator_weighted", "d_max"), new))


class DAdaptAdamW(_Distance):
    """D-Adaptation AdamW (Defazio and Mishchenko 2023) with the constructor of the
    authors' ``dadaptation.DAdaptAdam(decouple=True)`` (no ``growth_rate``,
    ``log_every`` or ``fsdp_in_use``): it steps as ``dadaptation``, bit for bit, one
    step size for all param groups. A group may set its own
    ``weight_decay``, ``eps`` and ``layer_scale`` (default 1: the weight of its sums and
    its step, as ``dadaptation``'s), and ``lr`` 0 (the others' lr else); ``betas``,
    ``d0`` and ``use_bias_correction`` are the same in all. With
    ``use_bias_correction=True`` and one group it is optax's ``dadapt_adamw``. The
    functional form is `fo.dadapt_adamw`.

    Example:
        >>> import torch, funcopt as fo
        >>> opt = fo.DAdaptAdamW(torch.nn.Linear(2, 1).parameters())
    """

    buffers = ("exp_avg", "exp_avg_sq", "grad_sum")
    shared = ("betas", "d0", "use_bias_correction")
    package = "dadaptation"
    scale_hint = ", and scale a group's step with its layer_scale."

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
            use_bias_correction=use_bias_correction, d0=d0, layer_scale=1.0,
        )  # fmt: skip
        super().__init__(params, defaults)

    def _first_d(self) -> float:
        return self.param_groups[0]["d0"]  # (alike in all groups: `shared`)

    def _group(self, group: dict[str, Any], active: bool) -> Group:
        # (a state_dict of the earlier class has no layer_scale)
        return Group(
            group["eps"], group["weight_decay"], layer_scale=group.get("layer_scale", 1.0), active=active
        )

    def _math(self, parts: list[Any], lr: float, scalars: tuple[Any, ...]) -> dict[str, float] | None:
        first = self.param_groups[0]
        new = dadapt_step(
            self._ops,
            parts,
            *scalars,
            lr=lr,
            betas=first["betas"],
            bias_correction=first["use_bias_correction"],
        )[1]
        return None if new is None else dict(zip(("estim_lr", "numerator_weighted"), new))
