"""Transformations for part of the params: `masked` and `partition`, as in optax.
They are what param groups are to torch.optim: weight decay on the weights only, a
different learning rate for some layers."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import optree
import torch

from ..core.base import (
    GradientTransformation,
    MaskedNode,
    Params,
    State,
    Updates,
    _structure_error,
    a_kind,
    check_transformation,
)

Mask = Any | Callable[[Params], Any]
"""A pytree of bools with the structure of the params or a prefix of it (one bool for a
whole subtree), or a function from the params (or updates) to one."""


class MaskedState(NamedTuple):
    """The state of `masked`: the inner transformation's state, built from the params
    with `MaskedNode()` in place of those outside the mask (so it holds no state for them)."""

    inner: State


torch.serialization.add_safe_globals([MaskedState])  # loads with torch.load(weights_only=True)


def _prefix_of(tree: Any, given: Any, who: str, what: str, leaves: str, kind: type | None = None) -> Any:
    """`given` (a mask, a labels tree, or a function that makes one from `tree`) for
    `tree`, checked: a tree of `leaves` (of type `kind` if given) whose structure is
    `tree`'s or a prefix of it, as optax takes masks and labels: a leaf of `given` then
    stands for a whole subtree of `tree`."""
    if callable(given):
        given = given(tree)

    def check(x: Any, _: Any) -> None:
        if kind is not None and not isinstance(x, kind):
            raise TypeError(f"{who}: {what} holds {a_kind(x)} where a {kind.__name__} belongs")

    try:
        optree.tree_map(check, given, tree, none_is_leaf=True)
    except ValueError as e:
        hint = (
            f"Pass a pytree of {leaves} with the params' structure (or a prefix of it: one for a "
            "whole subtree), or a function that makes one from them."
        )
        raise _structure_error((f"{who}: the params", what), 1, hint, _mismatch(tree, given, e)) from None
    return given


def _mismatch(tree: Any, given: Any, error: ValueError) -> str:
    """What differs between `tree` and `given`, told from `tree`'s side ("expected
    key(s): ['w', 'b']" names its keys), unless `given` goes deeper than `tree`."""
    try:
        optree.tree_map(lambda *_: None, tree, given, none_is_leaf=True)
    except ValueError as e:
        return str(e)
    return str(error)


def _select(tree: Any, flags: Any, who: str) -> Any:
    """`tree` with `MaskedNode()` for each subtree whose flag is False: what the inner
    transformation sees, which then keeps no state there (optax's ``masked`` does the same)."""
    try:
        return optree.tree_map(lambda f, t: t if f else MaskedNode(), flags, tree, none_is_leaf=True)
    except ValueError as e:
        raise _structure_error(
            (f"{who}: the params", "the updates tree"),
            1,
            "Pass updates with the structure of the params.",
            str(e),
        ) from None


def _init_selected(inner: GradientTransformation, params: Params, flags: Any, who: str) -> MaskedState:
    return MaskedState(inner.init(_select(params, flags, who)))


def _update_selected(
    inner: GradientTransformation,
    updates: Updates,
    state: State,
    params: Params | None,
    flags: Any,
    who: str,
    extra_args: dict[str, Any],
) -> tuple[Updates, MaskedState]:
    """`inner`'s update of the subtrees whose flag is True; the other updates as they are."""
    if not isinstance(state, MaskedState):
        raise TypeError(
            f"{who} got a state of type {type(state).__name__}; pass the MaskedState that init returned"
        )
    selected_params = None if params is None else _select(params, flags, who)
    extra_args = _for_inner(extra_args, params, flags, who)
    # extra_args only when given: an inner update may not take them
    new, inner_state = inner.update(_select(updates, flags, who), state.inner, selected_params, **extra_args)
    merged = optree.tree_map(lambda f, u, n: n if f else u, flags, updates, new, none_is_leaf=True)
    return merged, MaskedState(inner_state)


# The extra arguments that are functions of the params: sam's grad_fn(params, i) -> grads,
# sophia's obj_fn(params), the line searches' and lbfgs's value_fn(params, **data).
_FUNCTIONS_OF_PARAMS = ("grad_fn", "obj_fn", "value_fn")


def _for_inner(extra_args: dict[str, Any], params: Params | None, flags: Any, who: str) -> dict[str, Any]:
    """The extra arguments as the inner transformation sees them: it passes its params,
    `MaskedNode()` outside the mask, to a function of the params, which gets them whole
    (those outside the mask at their values, held fixed); grad_fn's gradients, and a
    ``grad=`` tree (the line searches'), come to it selected."""
    if params is None or not extra_args:
        return extra_args
    out = dict(extra_args)
    for name in _FUNCTIONS_OF_PARAMS:
        if callable(out.get(name)):
            out[name] = _on_whole_params(out[name], params, flags, who, select=name == "grad_fn")
    if out.get("grad") is not None:
        out["grad"] = _select(out["grad"], flags, who)
    return out


def _on_whole_params(fn: Callable[..., Any], params: Params, flags: Any, who: str, select: bool) -> Any:
    @functools.wraps(fn)  # (its signature too: a line search reads which data it takes)
    def whole(selected: Any, *args: Any, **kwargs: Any) -> Any:
        full = optree.tree_map(lambda f, p, s: s if f else p, flags, params, selected, none_is_leaf=True)
        out = fn(full, *args, **kwargs)
        return _select(out, flags, who) if select else out

    return whole


def masked(inner: GradientTransformation, mask: Mask) -> GradientTransformation:
    """Apply `inner` to the leaves where `mask` is True; the other updates pass through
    unchanged (optax's ``masked``).

    `mask` is a pytree of bools with the structure of the params, or a prefix of it (a
    bool for a whole subtree, ``{"encoder": False, "head": True}``), or a function that
    makes one from them: `init` and `update` call it on the params, an `update` without
    params on the updates. The inner transformation sees `MaskedNode()` in place of
    what is outside the mask, so its state holds nothing there (and no None, which
    ``torch.func.vmap`` refuses). ``update(..., **extra_args)`` passes extra arguments on
    to `inner`; a function of the params among them (sam's ``grad_fn``, sophia's
    ``obj_fn``, a line search's ``value_fn``) gets the whole params, those outside the
    mask held at their values, and ``grad_fn``'s gradients go to `inner` masked.

    Example:
        >>> import torch, funcopt as fo
        >>> params = {"w": torch.ones(2, 2), "b": torch.ones(2)}
        >>> weights = lambda tree: {"w": True, "b": False}
        >>> tx = fo.masked(fo.adamax(lr=0.1, weight_decay=0.5), weights)
        >>> grads = {"w": torch.zeros(2, 2), "b": torch.full((2,), 3.0)}
        >>> state = tx.init(params)
        >>> state.inner.exp_avg["b"]
        MaskedNode()
        >>> updates, state = tx.update(grads, state, params)
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
    """The mask for `tree`, checked: a tree of bools with its structure or a prefix of it."""
    return _prefix_of(tree, mask, who, "the mask", "bools", bool)


def _masked_init(inner: GradientTransformation, mask: Mask, params: Params) -> State:
    who = "masked init"
    return _init_selected(inner, params, _flags(mask, params, who), who)


def _masked_update(
    inner: GradientTransformation,
    mask: Mask,
    updates: Updates,
    state: State,
    params: Params | None = None,
    **extra_args: Any,
) -> tuple[Updates, State]:
    who = "masked update"
    flags = _flags(mask, updates if params is None else params, who)
    return _update_selected(inner, updates, state, params, flags, who, extra_args)


def partition(transforms: Mapping[Any, GradientTransformation], labels: Any) -> GradientTransformation:
    """Apply to each leaf the transformation of its label (optax's ``partition``): the
    functional form of torch.optim's param groups.

    `labels` is a pytree of labels with the structure of the params, or a prefix of it
    (a label for a whole subtree), or a function that makes one from them. A label is
    any key of `transforms` (a string, a number, ...); every label must name one of
    them. The state is a dict of the `masked` states, one per label. ``update(...,
    **extra_args)`` passes extra arguments on to every transformation. (With the
    torch.optim classes and `fo.Optimizer`, param groups do the same.)

    Example:
        >>> import torch, funcopt as fo
        >>> params = {"w": torch.ones(2, 2), "b": torch.ones(2)}
        >>> tx = fo.partition(
        ...     {"decay": fo.nadam(weight_decay=0.01), "no_decay": fo.nadam()},
        ...     lambda tree: {k: "decay" if v.ndim > 1 else "no_decay" for k, v in tree.items()},
        ... )
        >>> state = tx.init(params)
        >>> sorted(state), state["no_decay"].inner.exp_avg["w"]
        (['decay', 'no_decay'], MaskedNode())
    """
    transforms = dict(transforms)
    for label, transform in transforms.items():
        check_transformation(transform, f"partition (label {label!r})")
    # module-level functions, as in `masked`: it pickles if the labels do
    return GradientTransformation(
        functools.partial(_partition_init, transforms, labels),
        functools.partial(_partition_update, transforms, labels),
    )


def _known(label: Any, transforms: dict[Any, GradientTransformation]) -> bool:
    try:
        return label in transforms
    except TypeError:  # unhashable
        return False


def _flags_by_label(
    transforms: dict[Any, GradientTransformation], labels: Any, tree: Any, who: str
) -> dict[Any, Any]:
    """The labels for `tree`, checked once, as one tree of flags per label."""
    tree_labels = _prefix_of(tree, labels, who, "the labels tree", "labels")
    leaves = optree.tree_leaves(tree_labels, none_is_leaf=True)
    unknown = {repr(x) for x in leaves if not _known(x, transforms)}
    if unknown:
        raise ValueError(
            f"partition: labels [{', '.join(sorted(unknown))}] name no transformation; "
            f"the transformations are {sorted(transforms, key=repr)}"
        )
    return {
        label: optree.tree_map(lambda x, label=label: x == label, tree_labels, none_is_leaf=True)
        for label in transforms
    }


def _partition_init(transforms: dict[Any, GradientTransformation], labels: Any, params: Params) -> State:
    who = "partition init"
    flags = _flags_by_label(transforms, labels, params, who)
    return {label: _init_selected(tx, params, flags[label], who) for label, tx in transforms.items()}


def _partition_update(
    transforms: dict[Any, GradientTransformation],
    labels: Any,
    updates: Updates,
    state: State,
    params: Params | None = None,
    **extra_args: Any,
) -> tuple[Updates, State]:
    if not isinstance(state, dict) or set(state) != set(transforms):
        got = f"keys {sorted(state, key=repr)}" if isinstance(state, dict) else f"type {type(state).__name__}"
        raise ValueError(
            f"partition update got a state of {got}; pass the state that init returned "
            f"(a dict with keys {sorted(transforms, key=repr)})"
        )
    flags = _flags_by_label(transforms, labels, updates if params is None else params, "partition update")
    new_state = {}
    for label, tx in transforms.items():
        updates, new_state[label] = _update_selected(
            tx, updates, state[label], params, flags[label], f"partition update ({label!r})", extra_args
        )
    return updates, new_state
