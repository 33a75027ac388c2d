"""Conversion both ways between a torch optimizer's state and a functional state.

A torch-format optimizer keeps its state per param, ``optimizer.state[param]``, a dict of
named tensors. A functional state is the pytree that ``tx.init(params)`` returns: the
same tensors, each field a pytree shaped like ``params``. `functional_state` reads the
one from the other, and `load_functional_state` writes it back, so a run may switch
between the two faces mid-training and go on as if it had not:

- funcopt's classes (``fo.Adam``, ...) and torch.optim's classes of the same algorithms
  (``torch.optim.Adam``, ...): the state of ``fo.adam(...).init(params)``, the
  `AdamState` NamedTuple; a key that torch has not (yet) made for a param
  (``max_exp_avg_sq`` without ``amsgrad``) is a `MaskedNode`, but where ``init`` holds
  it from the start (SGD's ``momentum_buffer``) it is what ``init`` makes; counters are as ``init`` makes them (0-d tensors on the
  param's device, float64 for float64 params) where torch keeps a float32 on the CPU.
- ``fo.Optimizer(params, transform)``, any transformation: the state its ``init`` makes.
- ``fo.Momo``, ``fo.SM3``, ``fo.PolyakSGD``, ``fo.Prodigy``, ``fo.DAdaptAdamW``: the state
  of their functional forms (``fo.momo``, ...), see ``convert_stepped.py``.
"""

from __future__ import annotations

from typing import Any

import optree
import torch
from torch import Tensor

from ..core.base import GradientTransformation, MaskedNode, Params, State, a_kind
from ..core.hyperparams import ScheduledState, _counter
from ..engine.algorithm import REGISTRY, Algorithm
from ..engine.bounds import normalize
from ..engine.leaves import torch_counter
from . import convert_stepped
from .adapter import IMPLEMENTATION_FLAGS, Optimizer
from .knobs import counters_on_device, knobs
from .state import _slots, _stored, torch_state

__all__ = ["functional_state", "load_functional_state"]

_PYTHON_COUNTERS = {"SparseAdam": ("step",)}
"""The counters that a torch.optim class keeps as Python ints, not tensors."""

_NOT_HYPERPARAMETERS = ("params", "param_names", "initial_lr", *IMPLEMENTATION_FLAGS)
"""Keys of a param group that no algorithm reads as a hyperparameter."""


def functional_state(optimizer: torch.optim.Optimizer, params: Params) -> State:
    """The functional state of a torch-format optimizer, for `params`.

    Args:
        optimizer: one of funcopt's classes (``fo.Adam``), ``fo.Optimizer`` running any
            transformation, or a torch.optim class of an algorithm funcopt has
            (``torch.optim.Adam``).
        params: a pytree (dict, list, ...) of the optimizer's params, such as
            ``dict(model.named_parameters())``: matched by identity, or else, if it holds
            as many tensors as the optimizer has, in the optimizer's order (detached
            copies, say).

    Returns:
        The state that the functional transformation's ``init(params)`` would have after
        the same steps (``fo.adam(...)``'s for ``torch.optim.Adam``), its per-param fields
        shaped like `params`. Its tensors are copies: stepping the optimizer on does
        not change them, nor does a functional update change the optimizer. A param
        that has no state yet gets what the optimizer would create at its first step.

    Example:
        >>> import torch, funcopt as fo
        >>> model = torch.nn.Linear(2, 1)
        >>> optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
        >>> model(torch.ones(1, 2)).sum().backward()
        >>> optimizer.step()
        >>> params = dict(model.named_parameters())
        >>> state = fo.functional_state(optimizer, params)
        >>> type(state).__name__, sorted(state.exp_avg), int(state.step["bias"])
        ('AdamState', ['bias', 'weight'], 1)
        >>> state.max_exp_avg_sq["bias"]  # no amsgrad: torch has no such key
        MaskedNode()
    """
    if convert_stepped.converts(optimizer):  # fo.Momo, fo.SM3, fo.PolyakSGD, fo.Prodigy, fo.DAdaptAdamW
        return convert_stepped.functional_state_of(
            optimizer, *_matched(optimizer, params, "functional_state")
        )
    face = _Face(optimizer)
    matched, treedef = _matched(optimizer, params, "functional_state")
    with torch.no_grad():
        (names, spec), columns = _columns(face, optimizer, matched)
    state = spec.unflatten(
        [treedef.unflatten(column) if per_param else column for (_, per_param), column in zip(names, columns)]
    )
    if not face.counts(matched):
        return state
    return ScheduledState(_counter(params, _stepped(face, optimizer, matched)), state)


def _columns(
    face: _Face, optimizer: torch.optim.Optimizer, matched: list[tuple[Tensor, dict[str, Any]]]
) -> tuple[tuple[list[tuple[str, bool]], Any], list[Any]]:
    """The state's layout (its slots' names, each per param or not, and its structure),
    and each slot's value: a list over the params for a per-param slot, else the one
    value all groups share. Raises where the groups' states differ in structure."""
    layout: tuple[list[tuple[str, bool]], Any] | None = None
    columns: list[Any] = []
    for p, group in matched:
        slots, spec = face.layout(group, p)
        names = [(name, per_param) for name, per_param, _ in slots]
        if layout is None:
            layout = (names, spec)
            columns = [[] if per_param else None for _, per_param in names]
        elif (names, spec) != layout:
            raise ValueError(
                "functional_state: the optimizer's param groups keep states of different "
                f"structures ({_listed(layout[0])} and {_listed(names)}), which one functional "
                "state cannot hold: take the state of each group's params apart"
            )
        values = _values(face, optimizer, p, group, slots)
        for j, ((name, per_param, _), value) in enumerate(zip(slots, values)):
            if per_param:
                columns[j].append(value)
            elif columns[j] is None:
                columns[j] = value
            elif not _same(columns[j], value):
                raise ValueError(
                    f"functional_state: the entry {name!r}, which the transformation keeps once "
                    "for all params, differs between the param groups: one functional state "
                    "cannot hold both; take the state of each group's params apart"
                )
    assert layout is not None  # `_matched` returns at least one param
    return layout, columns


def _values(
    face: _Face,
    optimizer: torch.optim.Optimizer,
    p: Tensor,
    group: dict[str, Any],
    slots: list[tuple[str, bool, Any]],
) -> list[Any]:
    """A param's value of each slot, as a functional state holds it; what the optimizer
    would create at its first step if it has no state yet."""
    names = {name for name, _, _ in slots}
    stored = optimizer.state.get(p) or face.new_state(p, group)
    unknown = [key for key in stored if key not in names]
    if unknown:
        raise ValueError(
            f"functional_state: a param's state has the entries {', '.join(map(repr, unknown))}, "
            f"which {face.what} does not make (it makes {_listed([(n, pp) for n, pp, _ in slots])}): "
            "the state was edited, or loaded from another optimizer"
        )
    fresh = _Fresh(face, group, p)
    values = []
    for j, (name, per_param, leaf) in enumerate(slots):
        value = _functional(stored.get(name), leaf["0"] if per_param else leaf, p)
        if isinstance(value, MaskedNode) and per_param and isinstance(leaf["0"], Tensor):
            value = fresh.slot(j)  # torch makes it at the first step, init already (SGD's)
        values.append(value)
    return values


def _stepped(
    face: _Face, optimizer: torch.optim.Optimizer, matched: list[tuple[Tensor, dict[str, Any]]]
) -> int:
    """1 if every param has taken its first step, 0 if none has (the count of a
    functional state that counts steps torch does not); raises on a mix."""
    stepped = {bool(optimizer.state.get(p)) for p, _ in matched}
    if len(stepped) > 1:
        raise ValueError(
            f"functional_state: some params have taken their first step with {face.what} and some "
            "not; its functional state, with a dampening, counts the steps of all params at once "
            "and cannot hold both: convert the state once every param has stepped"
        )
    return int(stepped.pop())


def load_functional_state(optimizer: torch.optim.Optimizer, state: State, params: Params) -> None:
    """Write a functional state into a torch-format optimizer (the reverse of
    `functional_state`), for `params`.

    Args:
        optimizer: as for `functional_state`.
        state: a functional state for `params`, such as ``fo.adam(...).init(params)``
            after some updates (for ``fo.Adam`` or ``torch.optim.Adam``), or what
            `functional_state` returned.
        params: the pytree of the optimizer's params that `state` mirrors, matched as
            `functional_state` matches them.

    The optimizer's state tensors are written in place where they have the shape and
    dtype (references to them stay valid), else replaced by copies; the optimizer shares
    no tensor with `state`. An empty node (`MaskedNode`) removes that key from the
    param's state, as torch has none there. Counters take torch's format (a float32 on
    the CPU, where torch keeps them there). The state is checked before anything is
    written: a structure or shape that does not fit raises a ValueError and changes
    nothing. The optimizer's params and hyperparameters are left as they are.

    Example:
        >>> import torch, funcopt as fo
        >>> params = {"w": torch.zeros(2, requires_grad=True)}
        >>> tx = fo.sgd(lr=0.1, momentum=0.9)
        >>> state = tx.init({"w": params["w"].detach()})
        >>> _, state = tx.update({"w": torch.ones(2)}, state, {"w": params["w"].detach()})
        >>> optimizer = torch.optim.SGD(params.values(), lr=0.1, momentum=0.9)
        >>> fo.load_functional_state(optimizer, state, params)
        >>> optimizer.state[params["w"]]["momentum_buffer"]
        tensor([1., 1.])
    """
    if convert_stepped.converts(optimizer):
        matched, treedef = _matched(optimizer, params, "load_functional_state")
        return convert_stepped.load_functional_state_into(optimizer, state, matched, treedef)
    face = _Face(optimizer)
    matched, treedef = _matched(optimizer, params, "load_functional_state")
    if face.counts(matched) and isinstance(state, ScheduledState):
        # torch keeps no count: before the first step, no buffers (torch makes them there)
        inner = state.inner_state
        state = inner if state.count else optree.tree_map(lambda _: MaskedNode(), inner, none_is_leaf=True)
    with torch.no_grad():
        _write(face, optimizer, _writes(face, state, matched, treedef))


def _writes(
    face: _Face, state: State, matched: list[tuple[Tensor, dict[str, Any]]], treedef: Any
) -> list[tuple[Tensor, dict[str, Any], list[tuple[str, bool, Any]]]]:
    """Each param with its group and the (name, per_param, value) entries that `state`
    holds for it, all checked to fit before anything is written."""
    writes: list[tuple[Tensor, dict[str, Any], list[tuple[str, bool, Any]]]] = []
    values_by_group: dict[int, list[Any]] = {}
    for i, (p, group) in enumerate(matched):
        slots, spec = face.layout(group, p)
        if id(group) not in values_by_group:
            values_by_group[id(group)] = _split(spec, slots, state, treedef, face)
        values = [v[i] if per_param else v for (_, per_param, _), v in zip(slots, values_by_group[id(group)])]
        for (name, per_param, leaf), value in zip(slots, values):
            _check_fits(face, name, value, leaf["0"] if per_param else leaf, p)
        writes.append((p, group, [(name, per_param, v) for (name, per_param, _), v in zip(slots, values)]))
    return writes


def _write(
    face: _Face,
    optimizer: torch.optim.Optimizer,
    writes: list[tuple[Tensor, dict[str, Any], list[tuple[str, bool, Any]]]],
) -> None:
    """Write the checked entries into the optimizer's per-param state dicts."""
    shared: dict[tuple[int, str], Any] = {}  # a slot kept once per group: one tensor for its params
    for p, group, entries in writes:
        stored = optimizer.state[p] if p in optimizer.state else {}
        for name, per_param, value in entries:
            if per_param:
                face.write(stored, name, value, p, group)
            else:
                key = (id(group), name)
                if key not in shared:
                    face.write(stored, name, value, p, group)
                    shared[key] = stored.get(name)
                else:
                    stored[name] = shared[key]
        if not stored:  # torch keeps no entry for a param with no state
            optimizer.state.pop(p, None)
        elif p not in optimizer.state:
            optimizer.state[p] = stored


class _Face:
    """How an optimizer keeps a functional state: for each param group, the
    transformation whose state it is, and how a param's dict holds each of its slots."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer = optimizer
        self.layouts: dict[Any, tuple[list[tuple[str, bool, Any]], Any]] = {}
        self.algorithm: Algorithm | None
        if isinstance(optimizer, Optimizer):
            transform = optimizer._transform
            self.algorithm = transform if isinstance(transform, Algorithm) else None
            self.what = type(optimizer).__name__ if self.algorithm else "its transformation"
        else:
            self.algorithm = _torch_algorithm(optimizer)
            self.what = f"torch.optim.{self.algorithm.name}"

    def hyperparams(self, source: dict[str, Any]) -> dict[str, Any]:
        assert self.algorithm is not None
        values = {k: v for k, v in source.items() if k not in _NOT_HYPERPARAMETERS}
        return normalize(values, self.algorithm.pairs)

    def transform(self, group: dict[str, Any]) -> GradientTransformation:
        if self.algorithm is not None:  # the algorithm's own state, without a count of steps
            return Algorithm.__call__(self.algorithm, **self.hyperparams(group))
        assert isinstance(self.optimizer, Optimizer)
        return self.optimizer._make_transform(self.optimizer._group_hyperparams(group))

    def counts(self, matched: list[tuple[Tensor, dict[str, Any]]]) -> bool:
        """Whether the functional form counts steps that the torch class does not (SGD's,
        with a dampening: `sgd.DampedFromSecondStep`), in every group; a mix has no one state."""
        if self.algorithm is None:
            return False
        meta = {"0": torch.empty(0, device="meta")}
        kinds = {
            isinstance(self.algorithm(**self.hyperparams(group)).init(meta), ScheduledState)
            for group in {id(g): g for _, g in matched}.values()
        }
        if len(kinds) > 1:
            raise ValueError(
                f"the param groups of {self.what} keep states of different structures (some count "
                "their steps, for a dampening, some not), which one functional state cannot hold: "
                "take the state of each group's params apart"
            )
        return kinds.pop()

    def layout(self, group: dict[str, Any], p: Tensor) -> tuple[list[tuple[str, bool, Any]], Any]:
        """The slots of the state, and its structure with the slots as leaves, from an
        init on one meta tensor like `p` (see ``state._slots``); once per group, shape
        and dtype."""
        key = (id(group), p.shape, p.dtype)
        if key not in self.layouts:
            meta = torch.empty(p.shape, dtype=p.dtype, device="meta")
            self.layouts[key] = _slots(self.transform(group).init({"0": meta}))
        return self.layouts[key]

    def new_state(self, p: Tensor, group: dict[str, Any]) -> dict[str, Any]:
        """A param's state as the optimizer creates it at the param's first step."""
        if isinstance(self.optimizer, Optimizer):
            return self.optimizer._new_state(p, group)
        assert self.algorithm is not None
        source = group if knobs(self.algorithm).initial_from_group else self.optimizer.defaults
        state: dict[str, Any] = torch_state(
            self.algorithm,
            p,
            self.hyperparams(source),
            on_device=self.on_device(group),
            fused=bool(group.get("fused")),
        )
        for name in _PYTHON_COUNTERS.get(self.algorithm.name, ()):
            state[name] = 0
        return state

    def on_device(self, group: dict[str, Any]) -> bool:
        assert self.algorithm is not None
        return counters_on_device(self.algorithm, group)

    def write(self, stored: dict[str, Any], name: str, value: Any, p: Tensor, group: dict[str, Any]) -> None:
        """Write one functional value into a param's state dict, in torch's format."""
        old = stored.get(name)
        if isinstance(value, MaskedNode):
            if self.algorithm is not None:
                stored.pop(name, None)  # torch has no such key
            else:
                stored[name] = _stored(value)
        elif not isinstance(value, Tensor):
            stored[name] = value
        elif self.algorithm is not None and name in self.algorithm.counters:
            # the form a new state gives it: a tensor, or a Python number (SparseAdam's step)
            meta = torch.empty(p.shape, dtype=p.dtype, device="meta")
            form = old if name in stored else self.new_state(meta, group).get(name)
            if isinstance(old, Tensor) and old.dim() == 0:
                old.copy_(value)  # in its own dtype and device: torch's
            elif isinstance(form, (int, float)):
                stored[name] = type(form)(value.item())
            else:
                stored[name] = torch_counter(
                    value, p, on_device=self.on_device(group), fused=bool(group.get("fused"))
                )
        elif isinstance(old, Tensor) and (old.shape, old.dtype, old.device) == (
            value.shape,
            value.dtype,
            value.device,
        ):
            if old is not value:
                old.copy_(value)
        else:
            stored[name] = value.detach().clone()


def _torch_algorithm(optimizer: torch.optim.Optimizer) -> Algorithm:
    """The funcopt algorithm of a torch.optim class (or of a subclass of one)."""
    for cls in type(optimizer).__mro__:
        if getattr(torch.optim, cls.__name__, None) is cls and cls.__name__ in REGISTRY:
            return REGISTRY[cls.__name__]
    raise TypeError(
        f"functional state conversion takes funcopt's optimizers (fo.Adam, fo.Optimizer(params, tx), ...) "
        f"and torch.optim's classes of the algorithms funcopt has, which keep a state per param; got "
        f"{a_kind(optimizer)}. Save and load its state_dict() instead."
    )


def _matched(
    optimizer: torch.optim.Optimizer, params: Params, who: str
) -> tuple[list[tuple[Tensor, dict[str, Any]]], Any]:
    """Each leaf of `params` as the optimizer's param it stands for, with that param's
    group; and the structure of `params`."""
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"{who} takes a torch optimizer first, then the params; got {a_kind(optimizer)}")
    if isinstance(params, torch.nn.Module):
        raise TypeError(
            f"{who}: params must be a pytree of the optimizer's params, such as "
            "dict(model.named_parameters()), not the module"
        )
    leaves, treedef = optree.tree_flatten(params)
    wrong = [a_kind(x) for x in leaves if not isinstance(x, Tensor)]
    if wrong or not leaves:
        raise TypeError(
            f"{who}: params must be a pytree (dict, list, ...) of the optimizer's params, such as "
            f"dict(model.named_parameters()); got {'a leaf that is ' + wrong[0] if wrong else 'no tensor'}"
        )
    owned = [(p, group) for group in optimizer.param_groups for p in group["params"]]
    by_id = {id(p): (p, group) for p, group in owned}
    if all(id(x) in by_id for x in leaves):
        return [by_id[id(x)] for x in leaves], treedef
    if len(leaves) != len(owned) or any(x.shape != p.shape for x, (p, _) in zip(leaves, owned)):
        shapes = lambda ts: ", ".join(str(tuple(t.shape)) for t in ts)  # noqa: E731
        raise ValueError(
            f"{who}: params must hold the optimizer's params themselves, or as many tensors as it has, "
            f"of their shapes, in its order ({len(owned)}: {shapes(p for p, _ in owned)}); got "
            f"{len(leaves)}: {shapes(leaves)}"
        )
    return owned, treedef


def _functional(value: Any, expected: Any, p: Tensor) -> Any:
    """A stored value as a functional state holds it: a copy, of the dtype that init
    gives it (`expected`, made on a meta tensor), on the param's device; an absent one
    is an empty node."""
    if value is None or isinstance(value, MaskedNode):
        return MaskedNode()
    dtype = expected.dtype if isinstance(expected, Tensor) else None
    if isinstance(value, Tensor):
        return value.detach().to(dtype=dtype or value.dtype, device=p.device, copy=True)
    if isinstance(expected, Tensor):  # a counter saved as a Python number (old checkpoints)
        return torch.tensor(value, dtype=dtype, device=p.device)
    return value


class _Fresh:
    """A param's slots as the transformation's init makes them, made once if asked for."""

    def __init__(self, face: _Face, group: dict[str, Any], p: Tensor) -> None:
        self.face, self.group, self.p = face, group, p
        self.slots: list[tuple[str, bool, Any]] | None = None

    def slot(self, j: int) -> Any:
        if self.slots is None:
            self.slots, _ = _slots(self.face.transform(self.group).init({"0": self.p.detach()}))
        return self.slots[j][2]["0"]


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, Tensor) and isinstance(b, Tensor):
        return a.shape == b.shape and bool(torch.equal(a.cpu(), b.cpu().to(a.dtype)))
    return type(a) is type(b) and (isinstance(a, MaskedNode) or a == b)


def _split(
    spec: Any, slots: list[tuple[str, bool, Any]], state: State, treedef: Any, face: _Face
) -> list[Any]:
    """Each slot's value in `state`: a list over the params for a per-param slot."""
    try:
        subtrees = spec.flatten_up_to(state)
    except (ValueError, TypeError) as e:
        expected = spec.unflatten([f"<{name}>" for name, _, _ in slots])
        raise ValueError(
            f"load_functional_state: the state does not have the structure of {face.what}'s state "
            f"({type(expected).__name__} with {_listed([(n, p) for n, p, _ in slots])}): {e}. Pass the state "
            "that its functional transformation's init made (fo.adam(...).init(params) for "
            "torch.optim.Adam), or that functional_state returned."
        ) from None
    out = []
    for (name, per_param, _), subtree in zip(slots, subtrees):
        if not per_param:
            out.append(subtree)
            continue
        try:
            out.append(treedef.flatten_up_to(subtree))
        except (ValueError, TypeError) as e:
            raise ValueError(
                f"load_functional_state: the state's {name!r} does not have the structure of the params "
                f"given: {e}. Pass the params that the state was made for."
            ) from None
    return out


def _check_fits(face: _Face, name: str, value: Any, expected: Any, p: Tensor) -> None:
    """Raise if a value cannot be a param's state entry: a tensor shaped unlike the one
    a new state has there (or unlike its param, for an algorithm's buffer created at
    the first step), or a value where the state holds a tensor."""
    if isinstance(value, MaskedNode):
        return
    if isinstance(expected, Tensor) and not isinstance(value, Tensor):
        raise ValueError(
            f"load_functional_state: the state's {name!r} for a param of shape {tuple(p.shape)} is "
            f"{a_kind(value)}, where a tensor belongs"
        )
    shape = expected.shape if isinstance(expected, Tensor) else None
    algorithm = face.algorithm
    if (
        shape is None
        and algorithm is not None
        and algorithm.buffers_like_param
        and name in algorithm.buffer_fields
    ):
        shape = p.shape
    if shape is not None and isinstance(value, Tensor) and value.shape != shape:
        raise ValueError(
            f"load_functional_state: the state's {name!r} for a param of shape {tuple(p.shape)} has shape "
            f"{tuple(value.shape)}, where {tuple(shape)} belongs: the state was made for other params "
            "(params are matched by identity, or else by order)"
        )


def _listed(names: list[tuple[str, bool]]) -> str:
    return ", ".join(repr(name) for name, _ in names) or "no entries"
