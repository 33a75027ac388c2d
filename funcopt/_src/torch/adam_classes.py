"""The drop-in classes of the Adam family (`Adam`, `AdamW`, `RAdam`, `SparseAdam`), whose steps
keep torch's capturable and differentiable details; see `classes.py` for the others."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torch.optim.optimizer import ParamsT, _to_scalar

from ..algorithms.adam import ADAM, ADAMW
from ..algorithms.radam import RADAM
from ..algorithms.sparse_adam import DENSE_GRADIENT, SPARSE_ADAM
from ..core.base import IS_SPARSE
from ..engine.bounds import Hyperparams
from ..engine.leaves import scalar_dtype
from .adapter import Optimizer
from .fused import fused_flag, refuse
from .torch_kernels import KernelOptimizer


def user_capturable(optimizer: Optimizer, group: dict[str, Any]) -> bool:
    """Whether a group steps as torch's capturable step: where its user set capturable.
    torch.compile's tracing of a step sets every group's capturable (so torch's compiled
    step computes its scalars from the step tensor); funcopt's compiled step keeps the
    default step's Python doubles there, as the functional update does."""
    if torch.compiler.is_compiling():
        return bool(optimizer.defaults.get("capturable"))
    return bool(group.get("capturable"))


def _check_betas(betas: Any, *, foreach: bool | None, capturable: bool) -> None:
    """torch's checks of the betas that are not range checks, in its order."""
    if not (
        (isinstance(betas[0], float) and isinstance(betas[1], float))
        or (isinstance(betas[0], Tensor) and isinstance(betas[1], Tensor))
    ):
        raise ValueError("betas must be either both floats or both Tensors")
    for i, beta in enumerate(betas):
        if isinstance(beta, Tensor):
            if not capturable and foreach:
                raise ValueError(
                    f"betas[{i}] as a Tensor is not supported for capturable=False and foreach=True"
                )
            if beta.numel() != 1:
                raise ValueError(f"Tensor betas[{i}] must be 1-element")


_TENSOR_LR_FOREACH = "lr as a Tensor is not supported for capturable=False and foreach=True"


class Adam(KernelOptimizer):
    """Drop-in ``torch.optim.Adam``: same arguments, state keys and ``state_dict``
    format, running funcopt's `adam` math in place. ``fused=True`` is accepted where
    torch accepts it: the state's ``step`` is then a float32 tensor on the param's
    device, and a ``torch.amp.GradScaler`` hands the step its scale and inf flag, as
    with torch's fused class, whose kernels it calls (see ``torch_kernels.py``)."""

    _algorithm = ADAM
    _sparse_refused = True  # (by `_check_grads`)

    def __init__(
        self,
        params: ParamsT,
        lr: float | Tensor = 1e-3,
        betas: tuple[float | Tensor, float | Tensor] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0,
        amsgrad: bool = False,
        *,
        foreach: bool | None = None,
        maximize: bool = False,
        capturable: bool = False,
        differentiable: bool = False,
        fused: bool | None = None,
        decoupled_weight_decay: bool = False,
    ) -> None:
        if isinstance(lr, Tensor):
            if foreach and not capturable:
                raise ValueError(_TENSOR_LR_FOREACH)
            if lr.numel() != 1:
                raise ValueError("Tensor lr must be 1-element")
        self._algorithm.check(
            {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay}, tensors=True
        )
        _check_betas(betas, foreach=foreach, capturable=capturable)
        super().__init__(
            params,
            self._algorithm,
            lr=lr,
            betas=tuple(map(_to_scalar, betas)),
            eps=eps,
            weight_decay=weight_decay,
            amsgrad=amsgrad,
            maximize=maximize,
            foreach=foreach,
            capturable=capturable,
            differentiable=differentiable,
            fused=fused,
            decoupled_weight_decay=decoupled_weight_decay,
        )

    def _group_hyperparams(self, group: dict[str, Any]) -> Hyperparams:
        """A group's hyperparameters, with what torch's step does otherwise than the
        functional update: for a differentiable or capturable step, the bias corrections
        from the step tensor, rounded in its dtype (float32 unless that is not the default
        dtype), where the default step computes them in Python doubles; and a tensor
        beta1 rounded to each param's dtype before its ``1 - beta1``."""
        hyperparams = super()._group_hyperparams(group)
        if group.get("differentiable") or user_capturable(self, group):
            hyperparams["step_in_tensor"] = scalar_dtype(bool(group.get("fused")))
        if isinstance(group["betas"][0], Tensor):
            hyperparams["beta1_in_param_dtype"] = True
        return hyperparams

    def _check_grads(self, group: dict[str, Any], grads: list[Tensor]) -> None:
        """torch's checks of each step: no sparse gradients (with torch's message), and
        no tensor lr with foreach and not capturable (a group added or changed later).
        As torch's loop raises at the first param with a gradient that fails one, read
        list-wise (hundreds of tiny params)."""
        if not grads:
            return
        tensor_lr = (
            bool(group.get("foreach")) and isinstance(group["lr"], Tensor) and not group.get("capturable")
        )
        if grads[0].is_sparse if tensor_lr else any(map(IS_SPARSE, grads)):
            raise RuntimeError("Adam does not support sparse gradients, please consider SparseAdam instead")
        if tensor_lr:
            raise RuntimeError(_TENSOR_LR_FOREACH)


class AdamW(Adam):
    """Drop-in ``torch.optim.AdamW``: `Adam` with decoupled weight decay (and a default
    ``weight_decay`` of 1e-2), as torch's; running funcopt's `adamw` math in place."""

    _algorithm = ADAMW

    def __init__(
        self,
        params: ParamsT,
        lr: float | Tensor = 1e-3,
        betas: tuple[float | Tensor, float | Tensor] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
        amsgrad: bool = False,
        *,
        maximize: bool = False,
        foreach: bool | None = None,
        capturable: bool = False,
        differentiable: bool = False,
        fused: bool | None = None,
    ) -> None:
        super().__init__(
            params,
            lr,
            betas,
            eps,
            weight_decay,
            amsgrad,
            foreach=foreach,
            maximize=maximize,
            capturable=capturable,
            differentiable=differentiable,
            fused=fused,
            decoupled_weight_decay=True,
        )

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        for group in self.param_groups:  # as torch's: a loaded Adam state_dict steps as AdamW
            group["decoupled_weight_decay"] = True


class RAdam(Optimizer):
    """Drop-in ``torch.optim.RAdam``: same arguments, state keys and ``state_dict``
    format, running funcopt's `radam` math in place."""

    def __init__(
        self,
        params: ParamsT,
        lr: float | Tensor = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0,
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
            RADAM,
            lr=lr,
            betas=betas,
            eps=eps,
            weight_decay=weight_decay,
            maximize=maximize,
            foreach=foreach,
            capturable=capturable,
            decoupled_weight_decay=decoupled_weight_decay,
            differentiable=differentiable,
            **fused_flag(fused),
        )

    def _group_hyperparams(self, group: dict[str, Any]) -> Hyperparams:
        """A group's hyperparameters; for a capturable step, with the schedule told to
        compute as torch's capturable step does: from the step tensor, rounded in its
        dtype (float32 unless that is not the default dtype), where the default step (and
        torch's differentiable one) computes in Python doubles."""
        hyperparams = super()._group_hyperparams(group)
        if user_capturable(self, group):
            hyperparams["step_in_tensor"] = scalar_dtype()
        return hyperparams


class SparseAdam(Optimizer):
    """Drop-in ``torch.optim.SparseAdam``: same arguments, errors, state keys and
    ``state_dict`` format (its ``step`` a Python int, as torch keeps it), running
    funcopt's `sparse_adam` math in place. Params must be dense and real, their
    gradients sparse."""

    def __init__(
        self,
        params: ParamsT,
        lr: float | Tensor = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        maximize: bool = False,
        *,
        fused: bool | None = None,
    ) -> None:
        refuse(
            "SparseAdam", "it steps on sparse gradients, which fused steps do not support (as torch's)", fused
        )
        super().__init__(params, SPARSE_ADAM, lr=lr, betas=betas, eps=eps, maximize=maximize)
        # torch's checks of the params, after its construction
        sparse_params, complex_params = [], []
        for index, group in enumerate(self.param_groups):
            for d_index, p in enumerate(group["params"]):
                if p.is_sparse:
                    sparse_params.append([index, d_index])
                if p.is_complex():
                    complex_params.append([index, d_index])
        if sparse_params:
            raise ValueError(
                f"Sparse params at indices {sparse_params}: SparseAdam requires dense parameter tensors"
            )
        if complex_params:
            raise ValueError(
                f"Complex params at indices {complex_params}: SparseAdam does not support complex parameters"
            )

    def _new_state(self, p: Tensor, group: dict[str, Any]) -> dict[str, Any]:
        state = super()._new_state(p, group)
        state["step"] = 0  # torch counts in a Python int
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        # the base class turns counters saved as numbers into tensors, and gives a loaded
        # group the flags it lacks: torch's SparseAdam does neither
        numbers = [
            (s, s["step"]) for s in state["state"].values() if "step" in s and not torch.is_tensor(s["step"])
        ]
        keys = [set(group) for group in state["param_groups"]]
        super().__setstate__(state)
        for s, step in numbers:
            s["step"] = step
        for group, loaded in zip(self.param_groups, keys):
            for key in set(group) - loaded:
                del group[key]

    def _group_hyperparams(self, group: dict[str, Any]) -> dict[str, Any]:
        return super()._group_hyperparams({"maximize": False, **group})  # torch's group.get

    def _step_group(
        self,
        group: dict[str, Any],
        params: list[Tensor],
        grads: list[Tensor],
        states: list[Any] | None = None,
    ) -> None:
        if any(not g.is_sparse for g in grads):  # before any param changes
            raise RuntimeError(DENSE_GRADIENT)
        # the engine steps tensor counters: a Python step goes there and back, its type kept
        states = [self.state[p] for p in params]
        numbers = [(s, type(s["step"])) for s in states if not torch.is_tensor(s.get("step", 0.0))]
        for s, _ in numbers:
            s["step"] = torch.tensor(float(s["step"]), dtype=torch.float64)
        try:
            super()._step_group(group, params, grads, states)
        finally:
            for s, kind in numbers:
                s["step"] = kind(s["step"].item())
