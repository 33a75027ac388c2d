"""A param group's state as torch keeps it (a dict per param, with torch's keys) and as a
transformation's pytree: the slots of a state, the entries stored, and their checks."""

from __future__ import annotations

import os
from typing import Any

import optree
import torch
from torch import Tensor

from ..core.base import (
    MaskedNode,
    a_kind,
    dtype_name,
)
from ..engine.algorithm import Algorithm
from ..engine.bounds import Hyperparams
from ..engine.leaves import initial_buffer, torch_counter
from ..transforms.inject import InjectHyperparamsState


def _fields(algorithm: Algorithm, hyperparams: Hyperparams) -> list[tuple[str, bool]]:
    """The algorithm's state keys, each with whether a param's state must have it: the
    counters and buffers must, but for those absent at first (see `Algorithm.optional`)."""
    optional = algorithm.optional(hyperparams)
    return [(name, name not in optional) for name in algorithm.fields]


def _clone(value: Any) -> Any:
    return value.clone() if isinstance(value, Tensor) else value


def _is_per_param(x: Any) -> bool:
    return isinstance(x, dict) and len(x) > 0 and all(isinstance(k, str) and k.isdigit() for k in x)


def _slots(state: Any) -> tuple[list[tuple[str, bool, Any]], optree.PyTreeSpec]:
    """(name, per_param, leaf) for each slot of a state, and the state's structure with
    the slots as leaves. Names join the path's field names, indices and keys with '.',
    so a lone algorithm's slots are torch's state keys.

    Paths, not optree's accessors: torch 2.10's compiler cannot trace the accessors
    (a graph break in a compiled step)."""
    paths, leaves, treedef = optree.tree_flatten_with_path(state, is_leaf=_is_per_param, none_is_leaf=True)
    out = []
    for path, leaf in zip(paths, leaves):
        parts, node = [], state
        for entry in path:
            # a NamedTuple's (or a torch.return_types') path holds indices: name the fields
            fields = getattr(type(node), "__match_args__", None) if isinstance(node, tuple) else None
            parts.append(str(fields[entry] if fields else entry))
            node = node[entry] if isinstance(node, (tuple, list, dict)) else None
        out.append((".".join(parts), _is_per_param(leaf), leaf))
    return out, treedef


def _keys(n: int) -> list[str]:
    """The keys of a group's first `n` params, as the transformation sees them. (Not
    cached: dynamo warns where a compiled step calls an ``lru_cache``-wrapped function.)"""
    return [str(i) for i in range(n)]


def _distinct(states: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    """The states whose tensor at `name` no earlier state holds: a shared slot's tensor
    is written once (the params of a group share it, see `Optimizer._new_state`)."""
    seen: set[int] = set()
    out = []
    for s in states:
        value = s.get(name)
        if isinstance(value, Tensor):
            if id(value) in seen:
                continue
            seen.add(id(value))
        out.append(s)
    return out


def _copyable(old: Any, new: Any) -> bool:
    """Whether a step's new value may be copied into the state's tensor with one
    ``_foreach_copy_`` over all of them (as `_assign` would copy it): plain dense tensors
    (not a DTensor) of one shape. (Type checks first: cheap, per param and slot.)"""
    return type(old) is Tensor and type(new) is Tensor and old.shape == new.shape and not new.is_sparse


def _holds_injected(state: Any) -> bool:
    """Whether a state holds an `inject_hyperparams` state (a walk that torch.compile
    traces, which optree's with `is_leaf` is not)."""
    if isinstance(state, InjectHyperparamsState):
        return True
    if isinstance(state, (tuple, list)):
        return any(_holds_injected(x) for x in state)
    if isinstance(state, dict):
        return any(_holds_injected(x) for x in state.values())
    return False


def _injected_from_group(state: Any, fresh: Any) -> Any:
    """`state` with the hyperparams of each `inject_hyperparams` state in it replaced by
    those of `fresh`, the state that the group's transformation initializes (on an empty
    tensor): the adapter builds the transformation from the group's values at every
    step, so a scheduler or a param group that sets ``lr`` sets the injected ``lr``, and
    the state records it. Values keep the stored tensors' dtypes and devices; a
    schedule's value is evaluated at the state's count by the update itself."""
    if isinstance(state, InjectHyperparamsState) and isinstance(fresh, InjectHyperparamsState):
        hyperparams = {
            key: optree.tree_map(_cast_like, fresh.hyperparams[key], value)
            if key in fresh.hyperparams
            else value
            for key, value in state.hyperparams.items()
        }
        inner = _injected_from_group(state.inner_state, fresh.inner_state)
        return state._replace(hyperparams=hyperparams, inner_state=inner)
    if isinstance(state, (tuple, list)) and type(state) is type(fresh) and len(state) == len(fresh):
        items = [_injected_from_group(s, f) for s, f in zip(state, fresh)]
        return state._make(items) if hasattr(state, "_make") else type(state)(items)
    if isinstance(state, dict) and isinstance(fresh, dict) and state.keys() == fresh.keys():
        return {k: _injected_from_group(v, fresh[k]) for k, v in state.items()}
    return state


def _cast_like(new: Any, old: Any) -> Any:
    if isinstance(new, Tensor) and isinstance(old, Tensor):
        return new.to(dtype=old.dtype, device=old.device)
    return new


def _stored(value: Any) -> Any:
    """A per-param value as a param's state dict holds it: None where the state holds
    `MaskedNode()` (a param outside a `masked` transformation's mask), which torch's
    ``load_state_dict`` cannot rebuild (it calls ``type(value)(...)`` on a tuple) and
    checkpoints saved before `MaskedNode` hold."""
    return None if isinstance(value, MaskedNode) else value


def _node(value: Any) -> Any:
    """A param's stored value as the transformation's state holds it (see `_stored`)."""
    return MaskedNode() if value is None else value


def _what(value: Any) -> str:
    """What load_state_dict got instead of a dict, and what to do."""
    if isinstance(value, (str, os.PathLike)):
        return f"the path {os.fspath(value)!r}: pass the dict saved there, torch.load(path)"
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a functional state
        return (
            f"{a_kind(value)}: write a functional state into the optimizer with "
            "fo.load_functional_state(optimizer, state, params) (see 'The functional state' in "
            "docs/checkpoints.md)"
        )
    return a_kind(value)


def _missing_entry(error: KeyError) -> KeyError:
    """The error for a param's state that lacks an entry the step reads (loads are
    checked, so the state was edited)."""
    return KeyError(
        f"optimizer state has no entry {error}, which this optimizer's step reads: the "
        "state was edited or made for another optimizer. Restore the entry, or clear "
        "`optimizer.state[param]` to start that param afresh."
    )


def _converted(
    algorithm: Algorithm, params: list[Tensor], states: list[dict[str, Any]]
) -> RuntimeError | None:
    """The error for a step where a param's dtype differs from its state's: the model was
    converted after the state was made (``model.double()``). None if no such param. The
    in-place step raises it where its math fails, as torch's Adamax and NAdam do (torch's
    Adadelta and Adagrad step on), the pure step always."""
    for p, state in zip(params, states):
        buffers = {name: state.get(name) for name in algorithm.fields[len(algorithm.counters) :]}
        wrong = [name for name, b in buffers.items() if isinstance(b, Tensor) and b.dtype != p.dtype]
        if wrong:
            return RuntimeError(
                f"{algorithm.name} step: a param of dtype {dtype_name(p)} has {', '.join(wrong)} of dtype "
                f"{dtype_name(state[wrong[0]])}: the model was converted after the optimizer's state was made "
                "(model.double(), model.half(), ...). Cast the state to the params' dtypes with "
                "optimizer.load_state_dict(optimizer.state_dict()), or convert the model before making "
                "the optimizer."
            )
    return None


def _assign(state: dict[str, Any], name: str, value: Any) -> None:
    """Write a new value into a param's state, in place when shapes allow (as torch
    mutates its state tensors), so references to the state stay valid."""
    old = state.get(name)
    if value is old:
        return
    if (
        isinstance(old, Tensor)
        and isinstance(value, Tensor)
        and old.shape == value.shape
        and not value.is_sparse
    ):
        _copy_into(old, value)
    elif isinstance(value, Tensor) and value.requires_grad and torch.is_grad_enabled():
        # a new entry (SGD's momentum_buffer) of a differentiable step: a copy, which the
        # next step may write in place, where autograd may have saved the value itself
        state[name] = value.clone()
    else:
        state[name] = value


def _copy_into(old: Tensor, new: Tensor) -> None:
    """``old.copy_(new)``, also where torch.compile would drop it."""
    if old.dim() == 0:
        # torch 2.13's compiler can drop an in-place write to a 0-d float64 CPU input
        # (counters, the buffers of 0-d params), but not one through a view. The same
        # tensor must be written: a compiled step guards on its identity.
        old, new = old.view(1), new.view(1)
    old.copy_(new)


def torch_state(
    algorithm: Algorithm, p: Tensor, hyperparams: Hyperparams, *, on_device: bool, fused: bool
) -> dict[str, Tensor]:
    """A param's state as torch.optim creates it: counters are 0-d tensors on the CPU (on
    the param's device if capturable or fused), buffers are shaped like `p`."""
    initial = algorithm.initial_values(hyperparams)
    k = len(algorithm.counters)
    state = {
        name: torch_counter(v, p, on_device=on_device, fused=fused)
        for name, v in zip(algorithm.fields[:k], initial[:k])
    }
    for name, v in zip(algorithm.buffer_fields, initial[k:]):
        buffer = initial_buffer(p, v)
        if buffer is not None:  # absent: torch has no such key (yet)
            state[name] = buffer
    return state
