"""`fo.functional_state` and `fo.load_functional_state` for the drop-in classes that step
in place without an `Algorithm` (``catalogue_classes.py``, ``distance_classes.py``):
``fo.Momo``, ``fo.SM3``, ``fo.PolyakSGD``, ``fo.Prodigy`` and ``fo.DAdaptAdamW``.

Each class's state maps to its functional form's (``fo.momo``, ``fo.sm3``,
``fo.polyak_sgd``, ``fo.prodigy``, ``fo.dadapt_adamw``):

- per-param buffers (``exp_avg``, SM3's ``accumulators`` and ``momentum_buffer``, ...)
  are the state's fields shaped like the params (SM3's ``mu`` and ``nu``);
- the scalars that the classes keep in a param group (MoMo's ``barf``, ``gamma``,
  ``lb``, ``count``; Prodigy's and D-Adaptation's ``estim_lr``, ``numerator_weighted``,
  ``count``) are the state's 0-d fields. MoMo keeps them per group, so its params convert
  one whole group at a time; Prodigy and D-Adaptation keep one estimate for all groups,
  which reads every param, so all their params convert at once.

A param that has not stepped yet gets what the functional ``init`` gives it (zeros; the
param itself for Prodigy's ``params0``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import optree
import torch
from torch import Tensor

from ..catalogue.adaptive import dadapt_adamw, momo, prodigy
from ..catalogue.aliases import polyak_sgd, sm3
from ..core.base import GradientTransformation, Params, State, a_kind
from .catalogue_classes import SM3, Momo, PolyakSGD
from .distance_classes import DAdaptAdamW, Prodigy, _Distance

__all__ = ["converts", "functional_state_of", "load_functional_state_into"]

Matched = list[tuple[Tensor, dict[str, Any]]]

_FORMS: dict[type, tuple[Callable[[], GradientTransformation], tuple[str, ...], tuple[str, ...]]] = {
    # class: (its functional form, the per-param buffers, the group's scalars), in the state's order
    Momo: (momo, ("exp_avg",), ("barf", "gamma", "lb", "count")),
    Prodigy: (
        prodigy,
        ("exp_avg", "exp_avg_sq", "grad_sum", "params0"),
        ("estim_lr", "numerator_weighted", "count"),
    ),
    DAdaptAdamW: (
        dadapt_adamw,
        ("exp_avg", "exp_avg_sq", "grad_sum"),
        ("estim_lr", "numerator_weighted", "count"),
    ),
}


def converts(optimizer: Any) -> bool:
    """Whether `optimizer` is one of the classes this module converts."""
    return isinstance(optimizer, (Momo, SM3, PolyakSGD, Prodigy, DAdaptAdamW))


def functional_state_of(optimizer: torch.optim.Optimizer, matched: Matched, treedef: Any) -> State:
    """`fo.functional_state` of `optimizer` for its params `matched` (in `treedef`'s order)."""
    params = treedef.unflatten([p.detach() for p, _ in matched])
    if isinstance(optimizer, PolyakSGD):
        return polyak_sgd().init(params)  # no state
    if isinstance(optimizer, SM3):
        return _sm3_state(optimizer, matched, treedef, params)
    form, buffers, scalars = _FORMS[type(optimizer)]
    group = _scalars_group(optimizer, matched, "functional_state")
    template = form().init(params)
    values = _scalar_values(optimizer, group)
    with torch.no_grad():
        fields: dict[str, Any] = {}
        for name in buffers:
            fresh = treedef.flatten_up_to(getattr(template, name))
            column = [_copy(optimizer.state.get(p, {}).get(name), new) for (p, _), new in zip(matched, fresh)]
            fields[name] = treedef.unflatten(column)
        for name, value in zip(scalars, values):
            like = getattr(template, name)
            fields[name] = torch.tensor(value, dtype=like.dtype, device=like.device)
    return type(template)(**fields)


def load_functional_state_into(
    optimizer: torch.optim.Optimizer, state: State, matched: Matched, treedef: Any
) -> None:
    """`fo.load_functional_state` into `optimizer`: checks everything, then writes."""
    params = treedef.unflatten([p.detach() for p, _ in matched])
    who = f"load_functional_state into {type(optimizer).__name__}"
    if isinstance(optimizer, PolyakSGD):
        _check_structure(who, state, polyak_sgd().init(params))
        return
    if isinstance(optimizer, SM3):
        _load_sm3(optimizer, state, matched, treedef, params, who)
        return
    form, buffers, scalars = _FORMS[type(optimizer)]
    group = _scalars_group(optimizer, matched, "load_functional_state")
    template = form().init(params)
    _check_structure(who, state, template)
    columns = {name: treedef.flatten_up_to(getattr(state, name)) for name in buffers}
    for name, column in columns.items():
        for (p, _), value in zip(matched, column):
            _check_shape(who, name, value, p.shape)
    for name in scalars:
        value = getattr(state, name)
        if not isinstance(value, Tensor) or value.numel() != 1:
            raise ValueError(f"{who}: the state's {name!r} is {a_kind(value)}, where a 0-d tensor belongs")
    with torch.no_grad():
        for i, (p, _) in enumerate(matched):
            stored = optimizer.state[p]
            for name, column in columns.items():
                _write(stored, name, column[i], p)
        numbers = [_number(name, getattr(state, name)) for name in scalars]
        targets = [group] if group is not None else optimizer.param_groups
        for target in targets:
            target.update(zip(scalars, numbers))


def _scalars_group(optimizer: torch.optim.Optimizer, matched: Matched, who: str) -> dict[str, Any] | None:
    """The group whose scalars the state holds (MoMo's: the one group of the params), or
    None where all groups hold them alike (Prodigy, D-Adaptation); raises where the
    params are not all that the scalars are made from."""
    name = type(optimizer).__name__
    given = {id(p) for p, _ in matched}
    if isinstance(optimizer, _Distance):
        if isinstance(optimizer, Prodigy) and any(g.get("slice_p", 1) != 1 for g in optimizer.param_groups):
            raise ValueError(
                f"{who}: a param group of {name} has slice_p != 1, whose sliced grad_sum and params0 "
                "fo.prodigy's state cannot hold: convert with slice_p=1 only"
            )
        if any(id(p) not in given for g in optimizer.param_groups for p in g["params"]):
            raise ValueError(
                f"{who}: {name} keeps one step-size estimate, from the params of all its param groups, "
                "so its functional state holds them all: pass all the optimizer's params"
            )
        return None
    groups = {id(g): g for _, g in matched}
    group = next(iter(groups.values()))
    if len(groups) > 1 or any(id(p) not in given for p in group["params"]):
        raise ValueError(
            f"{who}: {name} keeps its step size's averages per param group, from all of that group's "
            "params, so one functional state holds one whole group: pass exactly one group's params"
        )
    return group


def _scalar_values(optimizer: torch.optim.Optimizer, group: dict[str, Any] | None) -> tuple[Any, ...]:
    """The scalars as the class's next step reads them (moved out of a state_dict of the
    earlier classes first, as the step would)."""
    if isinstance(optimizer, Momo):
        assert group is not None
        return optimizer._group_scalars(group)
    assert isinstance(optimizer, _Distance)
    return optimizer._scalars()


def _sm3_state(optimizer: SM3, matched: Matched, treedef: Any, params: Params) -> State:
    template = sm3(0.0).init(params)  # raises for a 0-d or complex param, as the class's step
    inner = template[0]
    fresh_mu, fresh_nu = treedef.flatten_up_to(inner.mu), treedef.flatten_up_to(inner.nu)
    mu, nu = [], []
    with torch.no_grad():
        for (p, _), new_mu, new_nu in zip(matched, fresh_mu, fresh_nu):
            stored = optimizer.state.get(p, {})
            old = stored.get("accumulators")
            mu.append(new_mu if old is None else [a.detach().clone() for a in old])
            nu.append(_copy(stored.get("momentum_buffer"), new_nu))
    return (inner._replace(mu=treedef.unflatten(mu), nu=treedef.unflatten(nu)), template[1])


def _load_sm3(optimizer: SM3, state: State, matched: Matched, treedef: Any, params: Params, who: str) -> None:
    _check_structure(who, state, sm3(0.0).init(params))
    mu, nu = treedef.flatten_up_to(state[0].mu), treedef.flatten_up_to(state[0].nu)
    for (p, _), accumulators, buffer in zip(matched, mu, nu):
        _check_shape(who, "nu", buffer, p.shape)
        for n, a in zip(p.shape, accumulators):
            _check_shape(who, "mu", a, (n,))
    with torch.no_grad():
        for (p, _), accumulators, buffer in zip(matched, mu, nu):
            stored = optimizer.state[p]
            old = stored.get("accumulators")
            if isinstance(old, list) and len(old) == len(accumulators):
                for o, a in zip(old, accumulators):
                    _write_tensor(o, a)
            else:
                stored["accumulators"] = [a.detach().clone() for a in accumulators]
            _write(stored, "momentum_buffer", buffer, p)


def _number(name: str, value: Tensor) -> int | float:
    """A 0-d tensor as the class keeps it in its groups (the count an int)."""
    return int(value.item()) if name == "count" else float(value.item())


def _copy(value: Any, fresh: Tensor) -> Tensor:
    """A stored buffer as the functional state holds it (a copy), or `fresh` (init's)."""
    return fresh if value is None else value.detach().clone()


def _write(stored: dict[str, Any], name: str, value: Tensor, p: Tensor) -> None:
    """Write `value` into a param's state entry in place where it fits, else a copy."""
    old = stored.get(name)
    if not (isinstance(old, Tensor) and _write_tensor(old, value)):
        stored[name] = value.detach().to(device=p.device, copy=True)


def _write_tensor(old: Tensor, value: Tensor) -> bool:
    if (old.shape, old.dtype, old.device) != (value.shape, value.dtype, value.device):
        return False
    if old is not value:
        old.copy_(value)
    return True


def _check_structure(who: str, state: Any, template: Any) -> None:
    """Raise unless `state` has the structure of the functional form's init (`template`)."""
    got, expected = optree.tree_structure(state), optree.tree_structure(template)
    if got != expected:
        raise ValueError(
            f"{who}: the state does not have the structure of the functional form's state for these "
            f"params ({expected}); got {got}. Pass the state that the functional form's init made "
            "(fo.momo().init(params) for fo.Momo, ...) after its updates, or that functional_state returned."
        )


def _check_shape(who: str, name: str, value: Any, shape: tuple[int, ...] | torch.Size) -> None:
    if not isinstance(value, Tensor) or value.shape != tuple(shape):
        got = tuple(value.shape) if isinstance(value, Tensor) else a_kind(value)
        raise ValueError(
            f"{who}: the state's {name!r} holds {got} where a tensor of shape {tuple(shape)} belongs: "
            "the state was made for other params (matched by identity, or else by order)"
        )
