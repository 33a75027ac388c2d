"""Transformations for part of the params: `masked` and `partition`, as in optax.
They are what param groups are to torch.optim: weight decay on the weights only, a
different learning rate for some layers."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import optree
import torch

from .base import GradientTransformation, Params, State, Updates, _structure_error

Mask = Any | Callable[[Params], Any]
"""A pytree of bools with the structure of the params, or a function from the params
(or updates) to one."""


class MaskedState(NamedTuple):
    """The state of `masked`: the inner transformation's state, built from the params
    with the leaves outside the mask as None."""

    inner: State


torch.serialization.add_safe_globals([MaskedState])  # loads with torch.load(weights_only=True)


def _flags(mask: Mask, tree: Any, who: str) -> Any:
    """The mask for `tree`, checked: a tree of bools of its structure."""
    flags = mask(tree) if callable(mask) else mask

    def check(_: Any, flag: Any) -> bool:
        if not isinstance(flag, bool):
            raise TypeError(f"{who}: the mask holds a {type(flag).__name__} where a bool belongs")
        return flag

    try:
        return optree.tree_map(check, tree, flags, none_is_leaf=True)
    except ValueError as e:
        hint = "Pass a pytree of bools with the params' structure, or a function that makes one from them."
        raise _structure_error((f"{who}: the params", "the mask"), 1, hint, str(e)) from None


def _select(tree: Any, flags: Any) -> Any:
    """`tree` with None for the leaves whose flag is False (a skipped leaf, as a None
    gradient is)."""
    return optree.tree_map(lambda t, f: t if f else None, tree, flags, none_is_leaf=True)


def masked(inner: GradientTransformation, mask: Mask) -> GradientTransformation:
    """Apply `inner` to the leaves where `mask` is True; the other updates pass through
    unchanged (optax's ``masked``).

    `mask` is a pytree of bools with the structure of the params, or a function that
    makes one from them: `init` and `update` call it on the params, an `update` without
    params on the updates. The inner state holds None for the leaves outside the mask.

    Example:
        >>> import torch, funcopt as fo
        >>> params = {"w": torch.ones(2, 2), "b": torch.ones(2)}
        >>> weights = lambda tree: {"w": True, "b": False}
        >>> tx = fo.masked(fo.adamax(lr=0.1, weight_decay=0.5), weights)
        >>> grads = {"w": torch.zeros(2, 2), "b": torch.full((2,), 3.0)}
        >>> updates, state = tx.update(grads, tx.init(params), params)
        >>> updates["w"][0], updates["b"]  # decayed; passed through
        (tensor([-0.1000, -0.1000]), tensor([3., 3.]))
    """

    def init(params: Params) -> State:
        return MaskedState(inner.init(_select(params, _flags(mask, params, "masked init"))))

    def update(updates: Updates, state: State, params: Params | None = None) -> tuple[Updates, State]:
        if not isinstance(state, MaskedState):
            raise TypeError(
                f"masked update got a state of type {type(state).__name__}; pass the MaskedState that init returned"
            )
        flags = _flags(mask, updates if params is None else params, "masked update")
        new, inner_state = inner.update(
            _select(updates, flags), state.inner, None if params is None else _select(params, flags)
        )
        merged = optree.tree_map(lambda u, n, f: n if f else u, updates, new, flags, none_is_leaf=True)
        return merged, MaskedState(inner_state)

    return GradientTransformation(init, update)


def partition(transforms: Mapping[str, GradientTransformation], labels: Any) -> GradientTransformation:
    """Apply to each leaf the transformation of its label (optax's ``partition``): the
    functional form of torch.optim's param groups.

    `labels` is a pytree of strings with the structure of the params, or a function that
    makes one from them. Every label must name one of `transforms`. The state is a dict
    of the `masked` states, one per label. (With the torch.optim classes and
    `fo.Optimizer`, param groups do the same.)

    Example:
        >>> import torch, funcopt as fo
        >>> params = {"w": torch.ones(2, 2), "b": torch.ones(2)}
        >>> tx = fo.partition(
        ...     {"decay": fo.nadam(weight_decay=0.01), "no_decay": fo.nadam()},
        ...     lambda tree: {k: "decay" if v.ndim > 1 else "no_decay" for k, v in tree.items()},
        ... )
        >>> state = tx.init(params)
        >>> sorted(state), state["no_decay"].inner.exp_avg["w"] is None
        (['decay', 'no_decay'], True)
    """
    transforms = dict(transforms)

    def labels_of(tree: Any) -> Any:
        tree_labels = labels(tree) if callable(labels) else labels
        unknown = {x for x in optree.tree_leaves(tree_labels, none_is_leaf=True) if x not in transforms}
        if unknown:
            raise ValueError(
                f"partition: labels {sorted(unknown, key=repr)} name no transformation; "
                f"the transformations are {sorted(transforms)}"
            )
        return tree_labels

    def mask_of(label: str) -> Callable[[Any], Any]:
        return lambda tree: optree.tree_map(lambda x: x == label, labels_of(tree), none_is_leaf=True)

    parts = {label: masked(tx, mask_of(label)) for label, tx in transforms.items()}

    def init(params: Params) -> State:
        return {label: part.init(params) for label, part in parts.items()}

    def update(updates: Updates, state: State, params: Params | None = None) -> tuple[Updates, State]:
        if not isinstance(state, dict) or set(state) != set(parts):
            got = f"keys {sorted(state)}" if isinstance(state, dict) else f"type {type(state).__name__}"
            raise ValueError(
                f"partition update got a state of {got}; pass the state that init returned "
                f"(a dict with keys {sorted(parts)})"
            )
        new_state = {}
        for label, part in parts.items():
            updates, new_state[label] = part.update(updates, state[label], params)
        return updates, new_state

    return GradientTransformation(init, update)
