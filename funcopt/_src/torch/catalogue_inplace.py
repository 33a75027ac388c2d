"""The drop-in classes of issue 64's catalogue on the engine's in-place path: each is
`fo.Optimizer` running its `Algorithm` in place (those of ``algorithms/lamb_adan.py``,
`Lamb`, `Adan` and `AdaBelief`, are in ``lamb_adan_classes.py``, on this module's
`_RenamesOldKeys`).

`Lars`, `NovoGrad` and `MADGRAD` (``algorithms/catalogue_more.py``) follow timm's classes
of those names (NovoGrad: timm's ``NvNovoGrad``), with timm's arguments, defaults and
options; their functional forms (`fo.lars`, ...) are optax's chains, whose math differs
(see each algorithm's page). Yogi, NAdamW, Signum, Adopt and AdEMAMix follow optax's
chains (`fo.yogi`, ...), to round-off. Lars, NovoGrad and MADGRAD step one param at a time
(a norm or a cube root per param), the others with foreach lists."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torch.optim.optimizer import ParamsT

from ..algorithms.catalogue_more import ADEMAMIX, ADOPT, LARS, NADAMW, NOVOGRAD, SIGNUM, YOGI
from ..algorithms.catalogue_more import MADGRAD as MADGRAD_ALGORITHM
from .adapter import Optimizer
from .fused import fused_flag

__all__ = [
    "MADGRAD",
    "AdEMAMix",
    "Adopt",
    "Lars",
    "NAdamW",
    "NovoGrad",
    "Signum",
    "Yogi",
]


def _switches(
    foreach: bool | None, capturable: bool, differentiable: bool, fused: bool | None
) -> dict[str, Any]:
    """torch's implementation switches, as `fo.Optimizer` takes them."""
    return dict(foreach=foreach, capturable=capturable, differentiable=differentiable, **fused_flag(fused))


def _max_lr(lr: float | Tensor, corrected_weight_decay: bool) -> float:
    """timm's ``max_lr_snapshot``: the constructor's lr, a float, which corrected weight
    decay (``lr**2 / max_lr``) reads; it must then be positive."""
    max_lr = float(lr.detach()) if isinstance(lr, Tensor) else float(lr)
    if corrected_weight_decay and max_lr <= 0:
        raise ValueError(
            f"Corrected weight decay requires a positive max lr, got {max_lr}. Construct the optimizer "
            "with the peak lr."
        )
    return max_lr


class _RenamesOldKeys(Optimizer):
    """Loads a state_dict of the earlier class too: `fo.Optimizer` over optax's chain,
    whose state keys were the chain's (``'0.mu'``); the step count becomes torch's float
    ``step``. A key mapped to ``""`` is dropped (a count the new state does not keep)."""

    old_keys: dict[str, str] = {}
    old_group_keys: dict[str, str] = {}  # hyperparameters renamed since (Lars's trust_coefficient)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        states = state_dict.get("state", {})
        if any(key in self.old_keys for state in states.values() for key in state):
            states = {i: self._renamed(state) for i, state in states.items()}
            state_dict = {**state_dict, "state": states}
        groups = state_dict.get("param_groups", [])
        if any(key in self.old_group_keys for group in groups for key in group):
            state_dict = self._upgraded(state_dict)
        super().load_state_dict(state_dict)

    def _upgraded(self, state_dict: dict[str, Any]) -> dict[str, Any]:
        """A state_dict whose groups have a hyperparameter's old name: the new name."""
        groups = [
            {self.old_group_keys.get(k, k): v for k, v in g.items()} for g in state_dict["param_groups"]
        ]
        return {**state_dict, "param_groups": groups}

    def _renamed(self, state: dict[str, Any]) -> dict[str, Any]:
        new = {}
        for key, value in state.items():
            name = self.old_keys.get(key, key)
            if not name:
                continue
            new[name] = value.to(torch.float32) if name == "step" else value
        return new


# ---------------------------------------------------------------- issue 64: the catalogue's others


class Yogi(_RenamesOldKeys):
    """Yogi (Zaheer et al. 2018) as `fo.yogi` (optax's math: the second moment starts
    at 1e-6). State keys: ``step``, ``exp_avg``, ``exp_avg_sq``.

    Example:
        >>> import torch, funcopt as fo
        >>> opt = fo.Yogi(torch.nn.Linear(2, 1).parameters(), lr=1e-2)
    """

    old_keys = {"0.count": "step", "0.mu": "exp_avg", "0.nu": "exp_avg_sq"}

    def __init__(
        self,
        params: ParamsT,
        lr: float = 1e-2,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-3,
        *,
        foreach: bool | None = None,
        capturable: bool = False,
        differentiable: bool = False,
        fused: bool | None = None,
    ) -> None:
        super().__init__(
            params, YOGI, lr=lr, betas=tuple(betas), eps=eps,
            **_switches(foreach, capturable, differentiable, fused),
        )  # fmt: skip


class NAdamW(_RenamesOldKeys):
    """NAdamW as optax's `fo.nadamw` (Dozat's Nesterov Adam with decoupled weight decay;
    torch's ``NAdam(decoupled_weight_decay=True)`` adds a momentum-decay schedule).
    State keys: ``step``, ``exp_avg``, ``exp_avg_sq``.

    Example:
        >>> import torch, funcopt as fo
        >>> opt = fo.NAdamW(torch.nn.Linear(2, 1).parameters(), lr=1e-3)
    """

    old_keys = {"0.count": "step", "0.mu": "exp_avg", "0.nu": "exp_avg_sq"}

    def __init__(
        self,
        params: ParamsT,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-4,
        *,
        foreach: bool | None = None,
        capturable: bool = False,
        differentiable: bool = False,
        fused: bool | None = None,
    ) -> None:
        super().__init__(
            params, NADAMW, lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay,
            **_switches(foreach, capturable, differentiable, fused),
        )  # fmt: skip


class Signum(_RenamesOldKeys):
    """Signum (Bernstein et al. 2018) as `fo.signum` (``momentum`` is its ``beta``): the
    sign of an EMA of the gradients. State key: ``momentum_buffer``.

    Example:
        >>> import torch, funcopt as fo
        >>> opt = fo.Signum(torch.nn.Linear(2, 1).parameters(), lr=1e-3)
    """

    old_keys = {"0.count": "", "0.ema": "momentum_buffer"}

    def __init__(
        self,
        params: ParamsT,
        lr: float = 1e-3,
        momentum: float = 0.9,
        *,
        foreach: bool | None = None,
        capturable: bool = False,
        differentiable: bool = False,
        fused: bool | None = None,
    ) -> None:
        super().__init__(
            params, SIGNUM, lr=lr, momentum=momentum, **_switches(foreach, capturable, differentiable, fused)
        )


class Adopt(_RenamesOldKeys):
    """ADOPT (Taniguchi et al. 2024) as `fo.adopt` (optax.contrib's math: the gradient
    normalized by the previous second moment, clipped to ``step**0.25``, then momentum;
    the first step only sets the second moment). State keys: ``step``, ``exp_avg``,
    ``exp_avg_sq``.

    Example:
        >>> import torch, funcopt as fo
        >>> opt = fo.Adopt(torch.nn.Linear(2, 1).parameters(), lr=1e-3)
    """

    old_keys = {"0.count": "step", "0.mu": "exp_avg", "0.nu": "exp_avg_sq"}

    def __init__(
        self,
        params: ParamsT,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.9999),
        eps: float = 1e-6,
        *,
        foreach: bool | None = None,
        capturable: bool = False,
        differentiable: bool = False,
        fused: bool | None = None,
    ) -> None:
        super().__init__(
            params, ADOPT, lr=lr, betas=tuple(betas), eps=eps,
            **_switches(foreach, capturable, differentiable, fused),
        )  # fmt: skip


class AdEMAMix(_RenamesOldKeys):
    """AdEMAMix (Pagliardini et al. 2024) as `fo.ademamix`, ``betas=(b1, b2, b3)``
    (optax.contrib's math: Adam's step plus ``alpha`` times a slow EMA of rate ``b3``,
    with decoupled weight decay). State keys: ``step``, ``exp_avg_fast``,
    ``exp_avg_slow``, ``exp_avg_sq``.

    Example:
        >>> import torch, funcopt as fo
        >>> opt = fo.AdEMAMix(torch.nn.Linear(2, 1).parameters(), lr=1e-3)
    """

    old_keys = {
        "0.count": "step",
        "0.count_m2": "",  # the count again (b3 and alpha are no schedules here)
        "0.m1": "exp_avg_fast",
        "0.m2": "exp_avg_slow",
        "0.nu": "exp_avg_sq",
    }

    def __init__(
        self,
        params: ParamsT,
        lr: float = 1e-3,
        betas: tuple[float, float, float] = (0.9, 0.999, 0.9999),
        alpha: float = 5.0,
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        *,
        foreach: bool | None = None,
        capturable: bool = False,
        differentiable: bool = False,
        fused: bool | None = None,
    ) -> None:
        super().__init__(
            params, ADEMAMIX, lr=lr, betas=tuple(betas), alpha=alpha, eps=eps, weight_decay=weight_decay,
            **_switches(foreach, capturable, differentiable, fused),
        )  # fmt: skip


class Lars(_RenamesOldKeys):
    """LARS (You et al. 2017) as timm's ``Lars``, with its arguments and defaults: for
    params with weight decay (all of them with ``always_adapt``), the gradient plus weight
    decay scaled by ``trust_coeff * |p| / (|g| + weight_decay * |p| + eps)`` (LARC's clip
    at lr with ``trust_clip``), then torch's SGD momentum (``dampening``, ``nesterov``)
    and the learning rate. `fo.lars` is optax's LARS: the ratio of the param's norm to the
    decayed update's, for every param, and the learning rate before the momentum. Steps one
    param at a time (a norm per param). State key: ``momentum_buffer`` (with momentum).

    Example:
        >>> import torch, funcopt as fo
        >>> opt = fo.Lars(torch.nn.Linear(2, 1).parameters(), lr=0.1, momentum=0.9)
    """

    package = "timm"  # the package whose state_dicts it shares (`fo.package_state_dict`)

    old_keys = {"3.trace": "momentum_buffer"}
    old_group_keys = {"trust_coefficient": "trust_coeff"}

    def __init__(
        self,
        params: ParamsT,
        lr: float = 1.0,
        momentum: float = 0.0,
        dampening: float = 0.0,
        weight_decay: float = 0.0,
        nesterov: bool = False,
        trust_coeff: float = 0.001,
        eps: float = 1e-8,
        trust_clip: bool = False,
        always_adapt: bool = False,
        *,
        foreach: bool | None = None,
        capturable: bool = False,
        differentiable: bool = False,
        fused: bool | None = None,
    ) -> None:
        super().__init__(
            params, LARS, lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay,
            nesterov=nesterov, trust_coeff=trust_coeff, eps=eps, trust_clip=trust_clip, always_adapt=always_adapt,
            **_switches(foreach, capturable, differentiable, fused),
        )  # fmt: skip

    def _upgraded(self, state_dict: dict[str, Any]) -> dict[str, Any]:
        """A state_dict of the earlier class (optax's LARS, with ``trust_coefficient``):
        its momentum held the steps after the learning rate, ``-lr`` times timm's."""
        state_dict = super()._upgraded(state_dict)
        states = dict(state_dict.get("state", {}))
        for group in state_dict["param_groups"]:
            for i in group["params"]:
                if "momentum_buffer" in states.get(i, {}):
                    state = states[i] = dict(states[i])
                    state["momentum_buffer"] = state["momentum_buffer"] / -group["lr"]
        return {**state_dict, "state": states}


class NovoGrad(_RenamesOldKeys):
    """NovoGrad (Ginsburg et al. 2019) as timm's ``NvNovoGrad``, with its arguments and
    defaults: the gradient over the root of an EMA of its squared norm (which starts at
    the first squared norm), plus weight decay (``decoupled_decay``: the param decayed
    apart), times ``1 - b1`` with ``grad_averaging``, into the momentum. `fo.novograd` is
    optax's, the same math with optax's defaults (betas ``(0.9, 0.25)``, eps 1e-6). Steps
    one param at a time. State keys: ``step``, ``exp_avg``, ``exp_avg_sq`` (a 0-d tensor
    in the param's dtype; timm's is in the default dtype), ``max_exp_avg_sq`` with
    ``amsgrad``.

    Example:
        >>> import torch, funcopt as fo
        >>> opt = fo.NovoGrad(torch.nn.Linear(2, 1).parameters(), lr=1e-2)
    """

    package = "timm"  # the package whose state_dicts it shares (`fo.package_state_dict`)

    old_keys = {"0.count": "step", "0.mu": "exp_avg", "0.nu": "exp_avg_sq"}

    def __init__(
        self,
        params: ParamsT,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.95, 0.98),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        grad_averaging: bool = False,
        amsgrad: bool = False,
        decoupled_decay: bool = False,
        corrected_weight_decay: bool = False,
        *,
        foreach: bool | None = None,
        capturable: bool = False,
        differentiable: bool = False,
        fused: bool | None = None,
    ) -> None:
        super().__init__(
            params, NOVOGRAD, lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay,
            grad_averaging=grad_averaging, amsgrad=amsgrad, decoupled_decay=decoupled_decay,
            corrected_weight_decay=corrected_weight_decay, max_lr_snapshot=_max_lr(lr, corrected_weight_decay),
            **_switches(foreach, capturable, differentiable, fused),
        )  # fmt: skip


class MADGRAD(_RenamesOldKeys):
    """MADGRAD (Defazio and Jelassi 2021) as timm's ``MADGRAD`` (the authors' code), with
    its arguments and defaults: weight decay added to the gradient, or with
    ``decoupled_decay`` the param decayed by ``1 - lr * weight_decay``; without momentum
    no ``x0`` is kept (it is the param plus ``s`` over the cube root). `fo.madgrad` is
    optax's, the same math but for ``sqrt(k + 1)``, which optax rounds to float32. Steps
    one param at a time (its cube root). State keys: ``step``, ``grad_sum_sq``, ``s``,
    ``x0``.

    Example:
        >>> import torch, funcopt as fo
        >>> opt = fo.MADGRAD(torch.nn.Linear(2, 1).parameters(), lr=1e-2)
    """

    package = "timm"  # the package whose state_dicts it shares (`fo.package_state_dict`)

    old_keys = {"1.count": "step", "1.grad_sum_sq": "grad_sum_sq", "1.s": "s", "1.x0": "x0"}

    def __init__(
        self,
        params: ParamsT,
        lr: float = 1e-2,
        momentum: float = 0.9,
        weight_decay: float = 0.0,
        eps: float = 1e-6,
        decoupled_decay: bool = False,
        *,
        foreach: bool | None = None,
        capturable: bool = False,
        differentiable: bool = False,
        fused: bool | None = None,
    ) -> None:
        super().__init__(
            params, MADGRAD_ALGORITHM, lr=lr, momentum=momentum, weight_decay=weight_decay, eps=eps,
            decoupled_decay=decoupled_decay, **_switches(foreach, capturable, differentiable, fused),
        )  # fmt: skip
