"""The drop-in classes `Lamb`, `Adan` and `AdaBelief`, on the engine's in-place path: each is
`fo.Optimizer` running its `Algorithm` (``algorithms/lamb_adan.py``: optax's math per
tensor) in place, with foreach lists for Adan and AdaBelief (per element) and one param at a time for
Lamb (its trust ratio reads each param's norm). The functional forms are optax's chains
(`fo.lamb`, `fo.adan`, `fo.adabelief`), equal to these classes to round-off.

Likewise Yogi, NAdamW, Signum, Adopt and AdEMAMix (foreach lists), Lars, NovoGrad and
MADGRAD (one param at a time), over the Algorithms of ``algorithms/catalogue_more.py``."""

from __future__ import annotations

from typing import Any

import torch
from torch.optim.optimizer import ParamsT

from ..algorithms.catalogue_more import ADEMAMIX, ADOPT, LARS, NADAMW, NOVOGRAD, SIGNUM, YOGI
from ..algorithms.catalogue_more import MADGRAD as MADGRAD_ALGORITHM
from ..algorithms.lamb_adan import ADABELIEF, ADAN, LAMB
from .adapter import Optimizer
from .fused import fused_flag

__all__ = [
    "MADGRAD",
    "AdEMAMix",
    "AdaBelief",
    "Adan",
    "Adopt",
    "Lamb",
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


class _RenamesOldKeys(Optimizer):
    """Loads a state_dict of the earlier class too: `fo.Optimizer` over optax's chain,
    whose state keys were the chain's (``'0.mu'``); the step count becomes torch's float
    ``step``. A key mapped to ``""`` is dropped (a count the new state does not keep)."""

    old_keys: dict[str, str] = {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        states = state_dict.get("state", {})
        if any(key in self.old_keys for state in states.values() for key in state):
            states = {i: self._renamed(state) for i, state in states.items()}
            state_dict = {**state_dict, "state": states}
        super().load_state_dict(state_dict)

    def _renamed(self, state: dict[str, Any]) -> dict[str, Any]:
        new = {}
        for key, value in state.items():
            name = self.old_keys.get(key, key)
            if not name:
                continue
            new[name] = value.to(torch.float32) if name == "step" else value
        return new


class Lamb(_RenamesOldKeys):
    """LAMB (You et al. 2020) as `fo.lamb`: Adam, decoupled weight decay, then the
    layer-wise trust ratio (optax's math; timm's ``Lamb``, which clips the gradients'
    global norm by default, was not compared: timm needs torchvision). State keys:
    ``step``, ``exp_avg``, ``exp_avg_sq``.

    Example:
        >>> import torch, funcopt as fo
        >>> model = torch.nn.Linear(2, 1)
        >>> opt = fo.Lamb(model.parameters(), lr=1e-3, weight_decay=0.01)
        >>> model(torch.ones(1, 2)).sum().backward()
        >>> opt.step()
    """

    old_keys = {"0.count": "step", "0.mu": "exp_avg", "0.nu": "exp_avg_sq"}

    def __init__(
        self,
        params: ParamsT,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0.0,
        *,
        foreach: bool | None = None,
        capturable: bool = False,
        differentiable: bool = False,
        fused: bool | None = None,
    ) -> None:
        super().__init__(
            params,
            LAMB,
            lr=lr,
            betas=tuple(betas),
            eps=eps,
            weight_decay=weight_decay,
            eps_root=0.0,
            **_switches(foreach, capturable, differentiable, fused),
        )


class Adan(_RenamesOldKeys):
    """Adan (Xie et al. 2022) as `fo.adan`, ``betas=(b1, b2, b3)`` as optax's decay
    rates (the paper writes ``1 - beta``: its ``(0.02, 0.08, 0.01)`` is this default).
    optax's math; timm's ``Adan`` was not compared. State keys: ``step``, ``exp_avg``,
    ``exp_avg_diff``, ``exp_avg_sq``, ``prev_grad``.

    Example:
        >>> import torch, funcopt as fo
        >>> opt = fo.Adan(torch.nn.Linear(2, 1).parameters(), lr=1e-3)
    """

    old_keys = {
        "0.t": "step",
        "0.m": "exp_avg",
        "0.v": "exp_avg_diff",
        "0.n": "exp_avg_sq",
        "0.g": "prev_grad",
    }

    def __init__(
        self,
        params: ParamsT,
        lr: float = 1e-3,
        betas: tuple[float, float, float] = (0.98, 0.92, 0.99),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        eps_root: float = 1e-8,
        *,
        foreach: bool | None = None,
        capturable: bool = False,
        differentiable: bool = False,
        fused: bool | None = None,
    ) -> None:
        super().__init__(
            params,
            ADAN,
            lr=lr,
            betas=tuple(betas),
            eps=eps,
            weight_decay=weight_decay,
            eps_root=eps_root,
            **_switches(foreach, capturable, differentiable, fused),
        )


class AdaBelief(_RenamesOldKeys):
    """AdaBelief (Zhuang et al. 2020) as `fo.adabelief` (optax's math: ``eps_root`` is
    added to the second moment at each step, ``eps`` to its root). State keys:
    ``step``, ``exp_avg``, ``exp_avg_var``.

    Example:
        >>> import torch, funcopt as fo
        >>> opt = fo.AdaBelief(torch.nn.Linear(2, 1).parameters(), lr=1e-3)
    """

    old_keys = {"0.count": "step", "0.mu": "exp_avg", "0.nu": "exp_avg_var"}

    def __init__(
        self,
        params: ParamsT,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-16,
        eps_root: float = 1e-16,
        *,
        foreach: bool | None = None,
        capturable: bool = False,
        differentiable: bool = False,
        fused: bool | None = None,
    ) -> None:
        super().__init__(
            params,
            ADABELIEF,
            lr=lr,
            betas=tuple(betas),
            eps=eps,
            eps_root=eps_root,
            **_switches(foreach, capturable, differentiable, fused),
        )


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
    """LARS (You et al. 2017) as `fo.lars`: weight decay, the trust ratio, the learning
    rate, then momentum (optax's math; timm's ``Lars`` was not compared). Steps one
    param at a time (the trust ratio reads each param's norm). State key:
    ``momentum_buffer``.

    Example:
        >>> import torch, funcopt as fo
        >>> opt = fo.Lars(torch.nn.Linear(2, 1).parameters(), lr=0.1)
    """

    old_keys = {"3.trace": "momentum_buffer"}

    def __init__(
        self,
        params: ParamsT,
        lr: float = 1.0,
        momentum: float = 0.9,
        weight_decay: float = 0.0,
        trust_coefficient: float = 0.001,
        eps: float = 0.0,
        nesterov: bool = False,
        *,
        foreach: bool | None = None,
        capturable: bool = False,
        differentiable: bool = False,
        fused: bool | None = None,
    ) -> None:
        super().__init__(
            params, LARS, lr=lr, momentum=momentum, weight_decay=weight_decay,
            trust_coefficient=trust_coefficient, eps=eps, nesterov=nesterov,
            **_switches(foreach, capturable, differentiable, fused),
        )  # fmt: skip


class NovoGrad(_RenamesOldKeys):
    """NovoGrad (Ginsburg et al. 2019) as `fo.novograd` (optax's math: the second
    moment of each gradient's norm, weight decay inside the momentum). Steps one param
    at a time. State keys: ``step``, ``exp_avg``, ``exp_avg_sq`` (a 0-d tensor).

    Example:
        >>> import torch, funcopt as fo
        >>> opt = fo.NovoGrad(torch.nn.Linear(2, 1).parameters(), lr=1e-2)
    """

    old_keys = {"0.count": "step", "0.mu": "exp_avg", "0.nu": "exp_avg_sq"}

    def __init__(
        self,
        params: ParamsT,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.25),
        eps: float = 1e-6,
        weight_decay: float = 0.0,
        *,
        foreach: bool | None = None,
        capturable: bool = False,
        differentiable: bool = False,
        fused: bool | None = None,
    ) -> None:
        super().__init__(
            params, NOVOGRAD, lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay,
            **_switches(foreach, capturable, differentiable, fused),
        )  # fmt: skip


class MADGRAD(_RenamesOldKeys):
    """MADGRAD (Defazio and Jelassi 2021) as optax's `fo.madgrad` (weight decay added
    to the gradient). Steps one param at a time (its cube root). State keys: ``step``,
    ``grad_sum_sq``, ``s``, ``x0``.

    Example:
        >>> import torch, funcopt as fo
        >>> opt = fo.MADGRAD(torch.nn.Linear(2, 1).parameters(), lr=1e-2)
    """

    old_keys = {"1.count": "step", "1.grad_sum_sq": "grad_sum_sq", "1.s": "s", "1.x0": "x0"}

    def __init__(
        self,
        params: ParamsT,
        lr: float = 1e-2,
        momentum: float = 0.9,
        weight_decay: float = 0.0,
        eps: float = 1e-6,
        *,
        foreach: bool | None = None,
        capturable: bool = False,
        differentiable: bool = False,
        fused: bool | None = None,
    ) -> None:
        super().__init__(
            params, MADGRAD_ALGORITHM, lr=lr, momentum=momentum, weight_decay=weight_decay, eps=eps,
            **_switches(foreach, capturable, differentiable, fused),
        )  # fmt: skip
