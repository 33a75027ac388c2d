"""Transformations for part of the params: `masked` and `partition`, as in optax.
They are what param groups are to torch.optim: weight decay on the weights only, a
different learning rate for some layers."""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import optree
import torch

from .base import (
    GradientTransformation,
    Params,
    State,
    Updates,
    _structure_error,
    a_kind,
    check_transformation,
)

Mask = Any | Callable[[Params], Any]
"""A pytree of bools with the structure of the params, or a function from the params
(or updates) to one."""


class MaskedState(NamedTuple):
    """The state of `masked`: the inner transformation's state, built from the params
    with the leaves outside the mask as None."""

    inner: State


torch.serialization.add_safe_globals([MaskedState])  # loads with torch.load(weights_only=True)


def _like(tree: Any, given: Any, who: str, what: str, leaves: str, kind: type | None = None) -> Any:
    """`given` (a mask, a labels tree, or a function that makes one from `tree`) for
    `tree`, checked: a tree of `leaves` with `tree`'s structure, of type `kind` if given."""
    if callable(given):
        given = given(tree)

    def check(_: Any, x: Any) -> Any:
        if kind is not None and not isinstance(x, kind):
            raise TypeError(f"{who}: {what} holds {a_kind(x)} where a {kind.__name__} belongs")
        return x

    try:
        return optree.tree_map(check, tree, given, none_is_leaf=True)
    except ValueError as e:
        hint = (
            f"Pass a pytree of {leaves} with the params' structure, or a function that makes one from them."
        )
        raise _structure_error((f"{who}: the params", what), 1, hint, str(e)) from None


def _select(tree: Any, flags: Any) -> Any:
    """`tree` with None for the leaves whose flag is False (a skipped leaf, as a None
    gradient is)."""
    return optree.tree_map(lambda t, f: t if f else None, tree, flags, none_is_leaf=True)


def _init_selected(inner: GradientTransformation, params: Params, flags: Any) -> MaskedState:
    return MaskedState(inner.init(_select(params, flags)))


def _update_selected(
    inner: GradientTransformation, updates: Updates, state: State, params: Params | None, flags: Any, who: str
) -> tuple[Updates, MaskedState]:
    """`inner`'s update of the leaves whose flag is True; the other updates as they are."""
    if not isinstance(state, MaskedState):
        raise TypeError(
            f"{who} got a state of type {type(state).__name__}; pass the MaskedState that init returned"
        )
    new, inner_state = inner.update(
        _select(updates, flags), state.inner, None if params is None else _select(params, flags)
    )
    merged = optree.tree_map(lambda u, n, f: n if f else u, updates, new, flags, none_is_leaf=True)
    return merged, MaskedState(inner_state)


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
    check_transformation(inner, "masked")
    # module-level functions, not closures, so that the transformation pickles
    # (if the mask does: a pytree, or a module-level function)
    return GradientTransformation(
        functools.partial(_masked_init, inner, mask), functools.partial(_masked_update, inner, mask)
    )


def _flags(mask: Mask, tree: Any, who: str) -> Any:
    """The mask for `tree`, checked: a tree of bools with its structure."""
    return _like(tree, mask, who, "the mask", "bools", bool)


def _masked_init(inner: GradientTransformation, mask: Mask, params: Params) -> State:
    return _init_selected(inner, params, _flags(mask, params, "masked init"))


def _masked_update(
    inner: GradientTransformation, mask: Mask, updates: Updates, state: State, params: Params | None = None
) -> tuple[Updates, State]:
    who = "masked update"
    flags = _flags(mask, updates if params is None else params, who)
    return _update_selected(inner, updates, state, params, flags, who)


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
    for label, transform in transforms.items():
        check_transformation(transform, f"partition (label {label!r})")
    # module-level functions, as in `masked`: it pickles if the labels do
    return GradientTransformation(
        functools.partial(_partition_init, transforms, labels),
        functools.partial(_partition_update, transforms, labels),
    )


def _flags_by_label(
    transforms: dict[str, GradientTransformation], labels: Any, tree: Any, who: str
) -> dict[str, Any]:
    """The labels for `tree`, checked once, as one tree of flags per label."""
    tree_labels = _like(tree, labels, who, "the labels tree", "labels")
    unknown = {x for x in optree.tree_leaves(tree_labels, none_is_leaf=True) if x not in transforms}
    if unknown:
        raise ValueError(
            f"partition: labels {sorted(unknown, key=repr)} name no transformation; "
            f"the transformations are {sorted(transforms)}"
        )
    return {
        label: optree.tree_map(functools.partial(operator.eq, label), tree_labels, none_is_leaf=True)
        for label in transforms
    }


def _partition_init(transforms: dict[str, GradientTransformation], labels: Any, params: Params) -> State:
    flags = _flags_by_label(transforms, labels, params, "partition init")
    return {label: _init_selected(tx, params, flags[label]) for label, tx in transforms.items()}


def _partition_update(
    transforms: dict[str, GradientTransformation],
    labels: Any,
    updates: Updates,
    state: State,
    params: Params | None = None,
) -> tuple[Updates, State]:
    if not isinstance(state, dict) or set(state) != set(transforms):
        got = f"keys {sorted(state)}" if isinstance(state, dict) else f"type {type(state).__name__}"
        raise ValueError(
            f"partition update got a state of {got}; pass the state that init returned "
            f"(a dict with keys {sorted(transforms)})"
        )
    flags = _flags_by_label(transforms, labels, updates if params is None else params, "partition update")
    new_state = {}
    for label, tx in transforms.items():
        updates, new_state[label] = _update_selected(
            tx, updates, state[label], params, flags[label], f"partition update ({label!r})"
        )
    return updates, new_state
