"""Core types: `GradientTransformation`, `apply_updates`, `chain`.

A transformation is a pair of pure functions over pytrees (optree), as in optax:
``init(params) -> state`` and ``update(grads, state, params=None) -> (updates, state)``.
``None`` leaves are allowed in grads (and params): such a leaf is skipped, as
torch.optim skips a param whose ``.grad`` is None.
"""

from __future__ import annotations

import functools
import operator
import re
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple, Protocol

import optree
import torch
from torch import Tensor
from torch.autograd import forward_ad

Params = Any
"""A pytree of tensors (dict, list, tuple, NamedTuple, ... of `torch.Tensor`)."""
Updates = Any
"""A pytree with the structure of the gradients; ``new_params = params + updates``."""
State = Any
"""A pytree of tensors holding a transformation's state."""


class TransformInit(Protocol):
    def __call__(self, params: Params) -> State: ...


class TransformUpdate(Protocol):
    def __call__(
        self, updates: Updates, state: State, params: Params | None = None, **extra_args: Any
    ) -> tuple[Updates, State]: ...


class GradientTransformation(NamedTuple):
    """A pure optimizer: ``init(params) -> state`` and
    ``update(grads, state, params=None) -> (updates, new_state)``.

    ``update`` is differentiable: autograd records it where it reads a tensor that
    requires grad (a module's Parameters, which weight decay reads), and the new state
    then carries that history into the next step. For plain training, call it under
    ``torch.no_grad()`` or pass detached params."""

    init: TransformInit
    update: TransformUpdate


class EmptyState(NamedTuple):
    """The state of a stateless transformation."""


class MaskedNode(NamedTuple):
    """An empty node: a place in a state (or in params) that holds nothing, as optax's
    ``MaskedNode``. It has no leaves, so a state holding it is still a valid input and
    output of ``torch.func.vmap``, ``grad`` and ``torch.compile`` (a None leaf is not).
    `masked` puts it where a param is outside the mask; an algorithm's state holds it
    for a key that torch.optim would not have for that param (Adam's ``max_exp_avg_sq``
    without ``amsgrad``, SGD's ``momentum_buffer`` without momentum)."""


torch.serialization.add_safe_globals([EmptyState, MaskedNode])  # loads with torch.load(weights_only=True)


def empty_init(params: Params) -> EmptyState:
    """The `init` of a stateless transformation."""
    return EmptyState()


def flatten_together(
    tree: Any, *others: Any, names: Sequence[str] = (), hint: str = ""
) -> tuple[list[list[Any]], Callable[[Iterable[Any]], Any]]:
    """The leaves of `tree` and of each of `others` (trees with `tree`'s structure; any
    kind of dict matches any other, as ``PyTreeSpec.flatten_up_to`` takes them), and a
    function that builds a tree of `tree`'s structure from a list of leaves.

    A tree whose structure differs raises a ValueError that says which: `names` names
    `tree` then each of `others` (its first entry may say where, as in ``"Adamax update:
    grads"``), and `hint` says what to pass instead.

    Under torch.compile it goes through ``optree.tree_map``, which Dynamo runs natively;
    Dynamo traces ``tree_flatten`` and ``unflatten`` through a Python emulation of optree
    instead, which cost 2.4 s of the 8.7 s it took to trace Adamax's update on 160 leaves."""
    if not torch.compiler.is_compiling():
        leaves, treedef = optree.tree_flatten(tree, none_is_leaf=True)  # a None gradient keeps its place
        columns = [leaves]
        for j, other in enumerate(others, 1):
            try:
                column = treedef.flatten_up_to(other)
            except ValueError as e:
                raise _structure_error(names, j, hint + _list_or_tuple(tree, other), str(e)) from None
            # `tree` as a mere prefix of `other` (a tensor where `other` has a dict)
            if not set(map(type, column)) <= _UNTRACED:  # (the usual leaves, found at once)
                wrong = next(
                    (x for x in column if x is not None and not isinstance(x, (Tensor, MaskedNode))), None
                )
                if wrong is not None:
                    raise _structure_error(names, j, hint, f"it has {a_kind(wrong)} where a leaf belongs")
            columns.append(column)
        return columns, treedef.unflatten
    rows: list[tuple[Any, ...]] = []
    optree.tree_map(lambda *row: rows.append(row), tree, *others, none_is_leaf=True)

    def unflatten(leaves: Iterable[Any]) -> Any:
        it = iter(leaves)
        return optree.tree_map(lambda _: next(it), tree, none_is_leaf=True)

    return [[row[j] for row in rows] for j in range(1 + len(others))], unflatten


def a_kind(value: Any) -> str:
    """The type of `value` with its article, for messages: "a dict", "an int"."""
    name = type(value).__name__
    return f"{'an' if name[0].lower() in 'aeiou' else 'a'} {name}"


def dtype_name(t: torch.Tensor) -> str:
    """A tensor's dtype as messages name it: "float32", not "torch.float32"."""
    return str(t.dtype).replace("torch.", "")


def _list_or_tuple(tree: Any, other: Any) -> str:
    """A hint for trees that are a list and a tuple: torch.autograd.grad returns its
    gradients as a tuple, which does not match params kept in a list."""
    if {type(tree), type(other)} != {list, tuple}:
        return ""
    return (
        " One is a list and the other a tuple (torch.autograd.grad returns a tuple): pass "
        "both as the same kind, for example list(grads)."
    )


class StructureError(ValueError):
    """A tree that does not have the structure of another (see `_structure_error`)."""


def _structure_error(names: Sequence[str], j: int, hint: str, detail: str) -> StructureError:
    where, _, first = (names[0] if names else "the first tree").rpartition(": ")
    name = names[j] if j < len(names) else f"tree {j}"
    detail = detail.split("; dict: ")[0].rstrip(".")  # optree goes on to print the dict, tensors and all
    detail = _key_mismatch(detail, first, name)
    if len(detail) > 300:
        detail = detail[:300] + " ..."
    where = f"{where}: " if where else ""
    return StructureError(f"{where}{name} does not have the structure of {first} ({detail}). {hint}".strip())


_KEY_MISMATCH = re.compile(
    r"dictionary key mismatch; expected key\(s\): (?P<expected>\[.*?\]), got key\(s\): (?P<got>\[.*?\])"
    r"(?:, missing key\(s\): (?P<missing>\[.*?\]))?(?:, extra key\(s\): (?P<extra>\[.*?\]))?$"
)


def _key_mismatch(detail: str, first: str, name: str) -> str:
    """optree's message for dicts whose keys differ, said of each tree: its "missing"
    keys are those `name` lacks, its "extra" ones those `first` lacks (optree says
    both from `name`'s side, so that grads short of a key read as a state with one
    extra)."""
    match = _KEY_MISMATCH.match(detail)
    if match is None:
        return detail
    lacks = [
        f"{who} lacks key(s) {keys} that {other} has"
        for who, keys, other in ((name, match["missing"], first), (first, match["extra"], name))
        if keys
    ]
    return "; ".join(lacks) or detail


_PLAIN = (torch.Tensor, torch.nn.Parameter)


_UNTRACED = {type(None), MaskedNode, *_PLAIN}  # the leaves that foreach ops may take
_PLAIN_TYPES = set(_PLAIN)

# a tensor's attributes, mapped over lists of hundreds of tensors (cheaper than a loop)
SHAPE = operator.attrgetter("shape")
DTYPE = operator.attrgetter("dtype")
DEVICE = operator.attrgetter("device")
IS_SPARSE = operator.attrgetter("is_sparse")


def tracer_active() -> bool:
    """Inside a tracer that records ops on tensors (torch.compile, torch.export, make_fx,
    torch.jit.trace) or a fake tensor mode: a value read in Python would become a
    constant of the trace (the first step's schedule, replayed at every step), or cannot
    be read at all."""
    return (
        torch.compiler.is_compiling()
        or torch.jit.is_tracing()
        or torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.PROXY) is not None
        or torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE) is not None
    )


def tracing() -> bool:
    """Inside a tracer (`tracer_active`) or a torch.func transform: values must stay tensors."""
    return tracer_active() or torch._C._functorch.peek_interpreter_stack() is not None


def readable(t: Tensor) -> bool:
    """Whether Python may read the value of `t` (a step counter), outside any tracer
    (`tracer_active`, which the caller checks once): not on the meta device (which holds
    no values), and no autograd graph records `t` and no torch.func transform wraps it.
    Inside a transform, a counter made outside it, or from constants, is not wrapped: a
    `vmap` over learning rates leaves the step count a plain tensor."""
    return not (t.is_meta or t.requires_grad or torch._C._functorch.is_functorch_wrapped_tensor(t))


def untraced(hyperparams: dict[str, Any], *leaf_lists: Sequence[Any]) -> bool:
    """Whether nothing traces this computation but autograd, if it records: no
    torch.compile, no torch.func transform, no tensor hyperparameter, no tensor
    subclass, no forward-mode AD level (``torch.autograd.forward_ad``). Then
    ``torch._foreach_*`` ops may serve (they have no vmap rule, take coefficients as
    numbers, and some have no forward-mode formula): in place, in fresh memory, where
    autograd records nothing as well (see ``inplace.py``), out of place where it records."""
    if tracing() or forward_ad._current_level >= 0:  # dual tensors need neither out= nor foreach ops
        return False
    for value in hyperparams.values():  # (a loop, not any(): this runs at every update)
        if isinstance(value, Tensor):
            return False
        if type(value) is tuple:
            for v in value:
                if isinstance(v, Tensor):
                    return False
    # None: a leaf without a param or gradient; MaskedNode: a buffer absent from the state
    return {type(t) for leaves in leaf_lists for t in leaves} <= _UNTRACED


def records(*leaf_lists: Sequence[Any]) -> bool:
    """Whether autograd records an op on these leaves."""
    return torch.is_grad_enabled() and any(
        [t.requires_grad for leaves in leaf_lists for t in leaves if isinstance(t, Tensor)]
    )


SMALL = 1 << 14
"""Elements in a small tensor, whose step costs its ops' per-call overhead more than its
memory traffic: the functional update steps small tensors in groups, with foreach ops
(see ``inplace.plan``), and so does `apply_updates` (see `grouped_under_autograd`)."""


def grouped_under_autograd(t: Tensor) -> bool:
    """Whether, where autograd records, `t` is stepped in a group by foreach ops (one
    autograd node per op for the group): if small (`SMALL`). Larger tensors take
    per-tensor ops: torch's foreach ops save every input for the backward pass, where
    per-tensor ops save only what they need (about twice the memory)."""
    return t.numel() <= SMALL


def apply_updates(params: Params, updates: Updates) -> Params:
    """Return ``params + updates`` leaf by leaf, as new tensors (nothing is mutated).

    A ``None`` update leaves its param as it is; each result keeps its param's dtype.

    Example:
        >>> import torch, funcopt as fo
        >>> fo.apply_updates({"w": torch.ones(2), "b": torch.ones(1)}, {"w": torch.tensor([0.5, -0.5]), "b": None})
        {'w': tensor([1.5000, 0.5000]), 'b': tensor([1.])}
    """
    (ps, us), unflatten = flatten_together(
        params,
        updates,
        names=("apply_updates: params", "updates"),
        hint="Pass updates with the structure of params (None for a param to leave as it is).",
    )
    if (  # as usual, found list by list: tensors alike, dense, and nothing traces or records
        ps
        and untraced({})  # (first: Dynamo traces no attrgetter)
        and {*map(type, ps), *map(type, us)} <= _PLAIN_TYPES
        and list(map(SHAPE, ps)) == list(map(SHAPE, us))
        and list(map(DTYPE, ps)) == list(map(DTYPE, us))
        and not any(map(IS_SPARSE, us))
        and not records(ps, us)
    ):
        return unflatten(torch._foreach_add(ps, us))
    new = list(ps)  # a None update (or param) leaves the param as it is
    todo = [i for i, (p, u) in enumerate(zip(ps, us)) if p is not None and u is not None]
    for i in todo:  # an update of another shape would broadcast: the param would take its shape
        if ps[i].shape != us[i].shape:
            raise ValueError(
                f"apply_updates: the update of leaf {i} has shape {tuple(us[i].shape)}, its param "
                f"{tuple(ps[i].shape)}. Pass the updates that update(grads, state, params) returned."
            )
    # one foreach call per group of those alike: one kernel on a GPU, one autograd node
    groups: dict[bool, list[int]] = {}  # by whether they record: a foreach op's outputs all do if one does
    if untraced({}, ps, us):
        recording = records(ps, us)
        for i in todo:
            if (
                ps[i].dtype == us[i].dtype
                and not us[i].is_sparse
                and (not recording or grouped_under_autograd(ps[i]))
            ):
                groups.setdefault(recording and records((ps[i], us[i])), []).append(i)
    for group in groups.values():
        for i, s in zip(group, torch._foreach_add([ps[i] for i in group], [us[i] for i in group])):
            new[i] = s
    todo = [i for i in todo if new[i] is ps[i]]
    for i in todo:
        new[i] = (ps[i] + us[i]).to(ps[i].dtype)
    return unflatten(new)


def check_transformation(transform: Any, where: str) -> None:
    """Raise a TypeError naming `where` if `transform` has no ``init`` and ``update``: a
    factory passed uncalled (``fo.adamax`` for ``fo.adamax()``), or a torch class."""
    if callable(getattr(transform, "init", None)) and callable(getattr(transform, "update", None)):
        return
    if isinstance(transform, type):
        got = f"the class {transform.__name__}: pass a transformation, such as fo.adamax(lr=1e-3)"
    elif hasattr(transform, "init") and hasattr(transform, "update"):
        which = "update" if callable(transform.init) else "init"
        got = f"one whose {which} is {a_kind(getattr(transform, which))}, not a function"
    elif callable(transform):
        name = getattr(transform, "__name__", "it")
        got = f"the function {name}: call it, {name}(...), to get one"
    else:
        got = f"an object of type {type(transform).__name__}"
    raise TypeError(f"{where}: expected a GradientTransformation (with init and update), got {got}")


def chain(*transforms: GradientTransformation) -> GradientTransformation:
    """Apply transformations one after another; the state is the tuple of their states.

    Its ``update(updates, state, params=None, **extra_args)`` passes extra keyword
    arguments (a loss value, ``value_fn``) on to each transformation, as optax's does.

    Example:
        >>> import torch, funcopt as fo
        >>> tx = fo.chain(fo.clip_by_global_norm(1.0), fo.adamax(lr=0.1))
        >>> params = [torch.zeros(2)]
        >>> state = tx.init(params)
        >>> updates, state = tx.update([torch.tensor([30.0, 40.0])], state, params)
        >>> updates[0]
        tensor([-0.1000, -0.1000])
    """
    for i, transform in enumerate(transforms):
        check_transformation(transform, f"chain (argument {i})")
    # module-level functions, not closures, so that a chain pickles (torch.save of an optimizer)
    return GradientTransformation(
        functools.partial(_chain_init, transforms), functools.partial(_chain_update, transforms)
    )


def _chain_init(transforms: tuple[GradientTransformation, ...], params: Params) -> State:
    return tuple(t.init(params) for t in transforms)


def _chain_update(
    transforms: tuple[GradientTransformation, ...],
    updates: Updates,
    state: State,
    params: Params | None = None,
    **extra_args: Any,
) -> tuple[Updates, State]:
    if len(state) != len(transforms):
        raise ValueError(
            f"chain of {len(transforms)} transformations got a state of length "
            f"{len(state)}: pass the state that this chain's init returned"
        )
    new_state = []
    for transform, s in zip(transforms, state):
        # the algorithms' updates take no extra keyword arguments: pass them only if given
        if extra_args:
            updates, s = transform.update(updates, s, params, **extra_args)
        else:
            updates, s = transform.update(updates, s, params)
        new_state.append(s)
    return updates, tuple(new_state)


def as_real(t: Any) -> Any:
    """A complex tensor as a real view with a trailing dimension of 2, as torch.optim
    steps complex params; a real tensor (or None, an absent buffer) as it is."""
    return torch.view_as_real(t) if t is not None and t.is_complex() else t


def as_complex(t: Any) -> Any:
    """`as_real` undone: a real view with a trailing dimension of 2 as a complex tensor;
    None (an absent buffer) as it is."""
    return None if t is None else torch.view_as_complex(t)


def real_dtype(t: Tensor) -> torch.dtype:
    """float32 for complex64, float64 for complex128, else the tensor's own dtype."""
    return t.real.dtype if t.is_complex() else t.dtype
