"""state_dicts shared with the packages that funcopt's drop-in classes follow.

- timm (``Lamb``, ``Lars``, ``Adan``, ``AdaBelief``, ``NvNovoGrad``, ``MADGRAD``): the
  per-param keys are timm's. timm's Lamb and Adan count steps per param group (a group
  ``step``), funcopt's per param; `TimmGroupStep` adds the group's count to
  ``state_dict()`` and reads it back as each param's, so each class loads the other's
  state_dict directly.
- ``prodigyopt.Prodigy`` and ``dadaptation.DAdaptAdam``: ``fo.Prodigy`` and
  ``fo.DAdaptAdamW`` load their state_dicts (`from_package`), and `package_state_dict`
  writes theirs (the authors' classes cannot read funcopt's keys: their step then fails
  on the missing group entry ``'k'``).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

__all__ = ["TimmGroupStep", "from_package", "package_state_dict"]


class TimmGroupStep:
    """For a class whose timm twin keeps the step count in each param group: its
    ``state_dict()`` holds it there too (the largest count of the group's params), and
    ``load_state_dict`` takes a timm state_dict, whose params have no ``step``."""

    group_step_is_int = False  # timm's Adan counts in a Python int, its Lamb in a 0-d tensor

    def state_dict(self) -> dict[str, Any]:
        saved: dict[str, Any] = super().state_dict()  # type: ignore[misc]
        for group in saved["param_groups"]:
            steps = [
                float(saved["state"][i]["step"])
                for i in group["params"]
                if "step" in saved["state"].get(i, {})
            ]
            if steps:
                count = max(steps)
                group["step"] = (
                    int(count) if self.group_step_is_int else torch.tensor(count, dtype=torch.float32)
                )
        return saved

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        groups = state_dict.get("param_groups", [])
        if any("step" in group for group in groups):
            states = dict(state_dict.get("state", {}))
            for group in groups:
                if "step" not in group:
                    continue
                count = float(group["step"])
                for i in group["params"]:
                    if states.get(i) and "step" not in states[i]:  # timm's: the group's count
                        states[i] = {**states[i], "step": torch.tensor(count, dtype=torch.float32)}
            groups = [{k: v for k, v in group.items() if k != "step"} for group in groups]
            state_dict = {**state_dict, "state": states, "param_groups": groups}
        super().load_state_dict(state_dict)  # type: ignore[misc]


# ---------------------------------------------------------------- prodigyopt, dadaptation

_SCALARS = {"d": "estim_lr", "k": "count"}  # the packages' group entries: ours
_NUMERATOR = {"prodigyopt": "d_numerator", "dadaptation": "numerator_weighted"}
_DROPPED = {  # the packages' group entries that funcopt's classes have no use for (checked first)
    "prodigyopt": ("d_denom", "d_hat", "decouple", "fsdp_in_use"),
    "dadaptation": ("log_every", "growth_rate", "decouple", "fsdp_in_use"),
}


def from_package(optimizer: torch.optim.Optimizer, state_dict: dict[str, Any]) -> dict[str, Any]:
    """`state_dict` as ``fo.Prodigy`` / ``fo.DAdaptAdamW`` (`optimizer`) keeps it, where it
    is the authors' package's (a param group with ``'k'``); else as given."""
    package: str = getattr(optimizer, "package", "")
    groups = state_dict.get("param_groups", []) if isinstance(state_dict, dict) else []
    if package not in _DROPPED or not any("k" in group for group in groups):
        return state_dict
    name = type(optimizer).__name__
    for group in groups:
        _check_package_group(name, package, group)
    params = [p for group in optimizer.param_groups for p in group["params"]]
    ids = [i for group in groups for i in group["params"]]
    if len(ids) != len(params):
        raise ValueError(
            f"{name}.load_state_dict: the {package} state_dict has {len(ids)} params, this optimizer "
            f"{len(params)}: load it into an optimizer over the same params, in the same param groups"
        )
    by_index = dict(zip(ids, params))
    states = {
        i: _package_param_state(package, s, by_index.get(i), groups, i)
        for i, s in state_dict["state"].items()
    }
    new_groups = []
    for group, current in zip(groups, optimizer.param_groups):
        new = {k: v for k, v in group.items() if k not in _DROPPED[package] and k not in _SCALARS}
        new.pop("d_numerator", None)
        new.update(estim_lr=float(group["d"]), numerator_weighted=float(group[_NUMERATOR[package]]))
        new["count"] = int(group["k"])
        for key, value in current.items():  # what the package's groups lack (dadaptation's d0)
            new.setdefault(key, value)
        new_groups.append(new)
    return {**state_dict, "state": states, "param_groups": new_groups}


def _check_package_group(name: str, package: str, group: dict[str, Any]) -> None:
    """Raise where a group of the package's state_dict asks for what funcopt's class does not do."""
    if package == "dadaptation" and group.get("growth_rate", math.inf) != math.inf:
        raise ValueError(
            f"{name}.load_state_dict: the {package} state_dict has growth_rate={group['growth_rate']}, which "
            f"{name} does not offer (its estimate grows without bound, {package}'s default)"
        )
    if not group.get("decouple", True) and group.get("weight_decay", 0) != 0:
        raise ValueError(
            f"{name}.load_state_dict: the {package} state_dict has decouple=False with weight decay, and "
            f"{name} decays decoupled only (decouple=True)"
        )
    if group.get("fsdp_in_use"):
        raise ValueError(f"{name}.load_state_dict: the {package} state_dict was saved with fsdp_in_use=True")


def _package_param_state(
    package: str, saved: dict[str, Any], p: Tensor | None, groups: list[dict[str, Any]], index: int
) -> dict[str, Any]:
    """One param's state from the package's keys (``s``, ``p0``; a per-param ``step`` that
    nothing reads) to funcopt's (``grad_sum``, ``params0``), shaped as funcopt keeps them."""
    if p is None or "s" not in saved:
        return saved
    group = next(g for g in groups if index in g["params"])
    sliced = group.get("slice_p", 1) != 1  # (prodigyopt: kept flat, as funcopt's)
    shape = (-1,) if sliced else p.shape
    new = {k: v for k, v in saved.items() if k not in ("s", "p0", "step")}
    new["grad_sum"] = saved["s"].reshape(shape)
    if package == "prodigyopt":
        p0 = saved["p0"]
        if p0.dim() == 0:  # prodigyopt keeps a 0-d zero for a param that was all zeros
            p0 = torch.zeros_like(new["grad_sum"])
        new["params0"] = p0.reshape(shape)
        if "exp_avg" not in new:  # none with betas[0] = 0
            new["exp_avg"] = torch.zeros_like(p)
    return {"exp_avg": new.pop("exp_avg"), "exp_avg_sq": new.pop("exp_avg_sq"), **new}


def package_state_dict(optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The state_dict of a drop-in class in the format of the package it follows, for that
    package's class to load: ``prodigyopt.Prodigy``'s for ``fo.Prodigy``,
    ``dadaptation.DAdaptAdam``'s for ``fo.DAdaptAdamW``; timm's classes load the
    ``state_dict()`` of ``fo.Lamb``, ``fo.Adan``, ... as it is (returned here too).

    Example:
        >>> import torch, funcopt as fo
        >>> opt = fo.Prodigy(torch.nn.Linear(2, 1).parameters())
        >>> sorted(fo.package_state_dict(opt)["param_groups"][0])[:4]
        ['beta3', 'betas', 'd', 'd0']
    """
    package = getattr(optimizer, "package", "")
    if package == "timm":  # (the classes that follow timm's: fo.Lamb, fo.Adan, ...)
        return optimizer.state_dict()
    if package not in _DROPPED:
        raise TypeError(
            "package_state_dict takes the drop-in classes that follow another package's class "
            "(fo.Prodigy, fo.DAdaptAdamW, fo.Lamb, fo.Lars, fo.Adan, fo.AdaBelief, fo.NovoGrad, fo.MADGRAD); "
            f"got {type(optimizer).__name__}: save its state_dict()"
        )
    estim_lr, numerator, count = optimizer._scalars()  # type: ignore[attr-defined]
    saved = optimizer.state_dict()
    states = {}
    for i, state in saved["state"].items():
        new = {k: v for k, v in state.items() if k not in ("grad_sum", "params0")}
        new["step"] = count
        new["s"] = state["grad_sum"].reshape(-1) if package == "prodigyopt" else state["grad_sum"]
        if "params0" in state:
            new["p0"] = state["params0"].reshape(-1)
        states[i] = new
    groups = []
    for group in saved["param_groups"]:
        new = {k: v for k, v in group.items() if k not in ("estim_lr", "numerator_weighted", "count")}
        new.update(d=estim_lr, k=count, decouple=True, fsdp_in_use=False)
        new[_NUMERATOR[package]] = numerator
        if package == "prodigyopt":  # (fo.Prodigy keeps growth_rate and d_max, as prodigyopt)
            new.setdefault("growth_rate", math.inf)
            new.setdefault("d_max", estim_lr)
        else:
            new.update(growth_rate=math.inf, log_every=0)
        groups.append(new)
    return {"state": states, "param_groups": groups}
