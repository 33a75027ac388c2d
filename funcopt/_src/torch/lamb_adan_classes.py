"""The drop-in classes of ``algorithms/lamb_adan.py``'s algorithms, on the engine's
in-place path: each is `fo.Optimizer` running its `Algorithm` in place.

`Lamb`, `Adan` and `AdaBelief` follow timm's classes of those names, with timm's
arguments, defaults and options, and load their state_dicts (`fo.package_state_dict`);
their functional forms (`fo.lamb`, ...) are optax's chains, whose math differs (see each
algorithm's page). Lamb steps one param at a time (a norm per param), Adan too with
``caution``, the others with foreach lists. Like the rest of issue 64's catalogue
(``catalogue_inplace.py``), each loads the state_dict of its earlier class too."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torch.optim.optimizer import ParamsT

from ..algorithms.lamb_adan import ADABELIEF, ADAN, CAUTIOUS_ADAN, LAMB
from .catalogue_inplace import _max_lr, _RenamesOldKeys, _switches
from .package_state import TimmGroupStep

__all__ = ["AdaBelief", "Adan", "Lamb"]


class Lamb(TimmGroupStep, _RenamesOldKeys):
    """LAMB (You et al. 2020) as timm's ``Lamb`` (NVIDIA's FusedLAMB), with its arguments
    and defaults: Adam, then the layer-wise trust ratio ``|p| / |update|`` for params with
    weight decay (all of them with ``always_adapt``), after the gradients are divided by
    ``max(1, global norm / max_grad_norm)``, their norm over all param groups (None: no
    clip). `fo.lamb` is optax's LAMB: no clip, a trust ratio for every param. State keys:
    ``step``, ``exp_avg``, ``exp_avg_sq``; ``state_dict()`` adds timm's group ``step``, so
    each class loads the other's state_dict.

    Example:
        >>> import torch, funcopt as fo
        >>> model = torch.nn.Linear(2, 1)
        >>> opt = fo.Lamb(model.parameters(), lr=1e-3, weight_decay=0.01)
        >>> model(torch.ones(1, 2)).sum().backward()
        >>> opt.step()
    """

    package = "timm"  # the package whose state_dicts it shares (`fo.package_state_dict`)

    old_keys = {"0.count": "step", "0.mu": "exp_avg", "0.nu": "exp_avg_sq"}

    def __init__(
        self,
        params: ParamsT,
        lr: float = 1e-3,
        bias_correction: bool = True,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0.01,
        grad_averaging: bool = True,
        max_grad_norm: float | None = 1.0,
        trust_clip: bool = False,
        always_adapt: bool = False,
        caution: bool = False,
        decoupled_decay: bool = False,
        corrected_weight_decay: bool = False,
        *,
        foreach: bool | None = None,
        capturable: bool = False,
        differentiable: bool = False,
        fused: bool | None = None,
    ) -> None:
        if max_grad_norm is not None and not max_grad_norm > 0:
            raise ValueError(f"Invalid max_grad_norm: {max_grad_norm} (a positive norm, or None for no clip)")
        super().__init__(
            params, LAMB, lr=lr, bias_correction=bias_correction, betas=tuple(betas), eps=eps,
            weight_decay=weight_decay, grad_averaging=grad_averaging, max_grad_norm=max_grad_norm,
            trust_clip=trust_clip, always_adapt=always_adapt, caution=caution, decoupled_decay=decoupled_decay,
            corrected_weight_decay=corrected_weight_decay, max_lr_snapshot=_max_lr(lr, corrected_weight_decay),
            **_switches(foreach, capturable, differentiable, fused),
        )  # fmt: skip

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """torch's ``add_param_group``; a group's own ``max_grad_norm`` is refused (timm
        ignores it): the clip reads the gradients of all groups together."""
        if param_group.get("max_grad_norm", self.defaults["max_grad_norm"]) != self.defaults["max_grad_norm"]:
            raise ValueError(
                f"a param group set max_grad_norm={param_group['max_grad_norm']!r}, but Lamb clips the "
                "gradients of all groups together, by the constructor's max_grad_norm: set it there"
            )
        super().add_param_group(param_group)

    def _unscale_for_amp(self) -> bool:
        """Once per step, after the closure and before any group steps (and after a
        GradScaler's unscaling): the divisor of timm's global-norm clip, over the gradients
        of all groups, which `_group_hyperparams` hands the math (a 0-d tensor: no host
        sync here; the in-place step reads it once per group)."""
        runs = super()._unscale_for_amp()
        self._grad_divisor = self._clip_divisor() if runs else None
        return runs

    def _clip_divisor(self) -> Tensor | None:
        """timm's ``max(1, |all gradients| / max_grad_norm)``, or None (no clip)."""
        max_norm = self.defaults.get("max_grad_norm")  # timm reads the constructor's, not a group's
        grads = [p.grad for group in self.param_groups for p in group["params"] if p.grad is not None]
        if max_norm is None or not grads:
            return None
        if any(g.is_sparse for g in grads):
            raise RuntimeError("Lamb does not support sparse gradients, consider SparseAdam instead.")
        with torch.set_grad_enabled(bool(self.defaults.get("differentiable"))):
            total = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
            return (total / max_norm).clamp(min=1.0)

    def _group_hyperparams(self, group: dict[str, Any]) -> dict[str, Any]:
        hyperparams = super()._group_hyperparams(group)
        divisor = getattr(self, "_grad_divisor", None)
        return hyperparams if divisor is None else {**hyperparams, "grad_divisor": divisor}


class Adan(TimmGroupStep, _RenamesOldKeys):
    """Adan (Xie et al. 2022) as timm's ``Adan``, with its arguments and defaults:
    ``betas=(b1, b2, b3)`` are decay rates (the paper's ``1 - beta``: its
    ``(0.02, 0.08, 0.01)`` is this default), and the weight decay is proximal (the param
    divided by ``1 + lr * weight_decay`` after the step; ``no_prox=True``: multiplied by
    ``1 - lr * weight_decay`` before it). `fo.adan` is optax's Adan, which weights the
    gradient difference by ``1 - b2`` where timm (and the paper) weight it by ``b2``.
    ``caution`` (Cautious Optimizers) masks the first moment's term where its sign is not
    the gradient's, rescaled by the share kept in each tensor; with it, each param steps by
    itself. State keys: timm's (``exp_avg``, ``exp_avg_diff``, ``exp_avg_sq``,
    ``neg_pre_grad``) and ``step``; ``state_dict()`` adds timm's group ``step``, so each
    class loads the other's state_dict.

    Example:
        >>> import torch, funcopt as fo
        >>> opt = fo.Adan(torch.nn.Linear(2, 1).parameters(), lr=1e-3)
    """

    package = "timm"  # the package whose state_dicts it shares (`fo.package_state_dict`)

    old_keys = {
        "0.t": "step",
        "0.m": "exp_avg",
        "0.v": "exp_avg_diff",
        "0.n": "exp_avg_sq",
        "0.g": "neg_pre_grad",  # optax's last gradient: negated in `_renamed`
    }
    group_step_is_int = True  # timm's Adan counts its group's steps in a Python int

    def _renamed(self, state: dict[str, Any]) -> dict[str, Any]:
        new = super()._renamed(state)
        if "0.g" in state:
            new["neg_pre_grad"] = -state["0.g"]
        return new

    def __init__(
        self,
        params: ParamsT,
        lr: float = 1e-3,
        betas: tuple[float, float, float] = (0.98, 0.92, 0.99),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        no_prox: bool = False,
        caution: bool = False,
        *,
        foreach: bool | None = None,
        capturable: bool = False,
        differentiable: bool = False,
        fused: bool | None = None,
    ) -> None:
        super().__init__(
            params, ADAN, lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, no_prox=no_prox,
            caution=caution, **_switches(foreach, capturable, differentiable, fused),
        )  # fmt: skip
        self._pick_algorithm()

    def _pick_algorithm(self) -> None:
        """`CAUTIOUS_ADAN` (each param by itself) where a group has ``caution=True``, else
        `ADAN` (whose per-element math may step small params together)."""
        cautious = any(group.get("caution") for group in self.param_groups)
        self._transform = CAUTIOUS_ADAN if cautious else ADAN

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        super().add_param_group(param_group)
        if hasattr(self, "_transform"):  # (torch's __init__ adds the first groups before it is set)
            self._pick_algorithm()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        self._pick_algorithm()

    def _step_group(
        self,
        group: dict[str, Any],
        params: list[Tensor],
        grads: list[Tensor],
        states: list[Any] | None = None,
    ) -> None:
        if group.get("caution") and self._transform is ADAN:  # set on the group since
            self._pick_algorithm()
        super()._step_group(group, params, grads, states)


class AdaBelief(_RenamesOldKeys):
    """AdaBelief (Zhuang et al. 2020) as timm's ``AdaBelief``, with its arguments and
    defaults: rectified as RAdam (``rectify``; its first steps SGD with momentum,
    ``degenerated_to_sgd``), decoupled weight decay (``decoupled_decay``; ``fixed_decay``:
    not scaled by lr), ``eps`` added to the second moment at each step and to its root.
    `fo.adabelief` is optax's: not rectified, no weight decay, and ``eps_root`` apart.
    State keys: ``step``, ``exp_avg``, ``exp_avg_var`` (``max_exp_avg_var`` with
    ``amsgrad``).

    Example:
        >>> import torch, funcopt as fo
        >>> opt = fo.AdaBelief(torch.nn.Linear(2, 1).parameters(), lr=1e-3)
    """

    package = "timm"  # the package whose state_dicts it shares (`fo.package_state_dict`)

    old_keys = {"0.count": "step", "0.mu": "exp_avg", "0.nu": "exp_avg_var"}

    def __init__(
        self,
        params: ParamsT,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-16,
        weight_decay: float = 0.0,
        amsgrad: bool = False,
        decoupled_decay: bool = True,
        fixed_decay: bool = False,
        rectify: bool = True,
        degenerated_to_sgd: bool = True,
        *,
        foreach: bool | None = None,
        capturable: bool = False,
        differentiable: bool = False,
        fused: bool | None = None,
    ) -> None:
        super().__init__(
            params, ADABELIEF, lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, amsgrad=amsgrad,
            decoupled_decay=decoupled_decay, fixed_decay=fixed_decay, rectify=rectify,
            degenerated_to_sgd=degenerated_to_sgd, **_switches(foreach, capturable, differentiable, fused),
        )  # fmt: skip
