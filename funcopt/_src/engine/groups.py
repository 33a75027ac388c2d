"""Which leaves of a functional update step together, and how (`Algorithm.update_leaves`).

The usual eager update (every leaf alike, sharing its counters) is found column by
column (`usual`); any other is checked leaf by leaf (`group_leaves`), which also raises
the errors. Leaves whose math shares its coefficients form a group, and `run` steps each
group the way `inplace.plan` routes it (the one planner, which the torch face's in-place,
fused and chained steps use too).
"""

from __future__ import annotations

import functools
import itertools
import operator
from collections.abc import Callable, Sequence
from typing import Any, cast

from torch import Tensor

from ..core.base import DEVICE, DTYPE, IS_SPARSE, SHAPE, MaskedNode, a_kind, records
from . import inplace
from .bounds import Hyperparams
from .leaves import _keep, group_by, mismatch_error, rows, same_batched

# (`algorithm` below is the engine `Algorithm` that steps, typed Any as in inplace.py:
# its module imports this one)

Groups = list[tuple[Any, list[int]]]
"""Coefficients and the leaves (their indices) that step with them."""


def usual(
    algorithm: Any,
    hyperparams: Hyperparams,
    p_leaves: Sequence[Tensor | None],
    g_leaves: Sequence[Tensor | None],
    counters: Sequence[Sequence[Tensor]],
    buffer_columns: Sequence[Sequence[Tensor | None]],
    creating: Callable[[Sequence[Tensor | None]], bool],
) -> tuple[tuple[Any, ...], tuple[Any, ...]] | None:
    """The usual eager update, found column by column (a per-leaf loop costs about
    as much as the math on a small model): every leaf has a gradient, dense, and a
    param (or none has), all share their counters, dtype and device and have their
    param's shape, and each buffer is present for all or for none, with none to
    create; the math is per element and its coefficients are numbers. Returns the new
    counters and the coefficients, or None where `group_leaves` must look at each
    leaf (which also raises the errors)."""
    # (maps, not comprehensions: this runs at every update, and costs per call)
    n = len(g_leaves)
    if not algorithm.per_element or not n or any(map(_IS_NONE, g_leaves)):
        return None
    gs = cast(list[Tensor], g_leaves)
    firsts = tuple(map(_FIRST, counters))
    for shared, first in zip(counters, firsts):
        if not all(map(operator.is_, shared, itertools.repeat(first, n))):
            return None
    shapes, dtypes = list(map(SHAPE, gs)), list(map(DTYPE, gs))
    with_params = p_leaves[0] is not None
    if _mixed(p_leaves, with_params):
        return None
    same = [cast(Sequence[Tensor], p_leaves)] if with_params else []  # what has the gradient's shape
    for column in buffer_columns:
        present = column[0] is not None
        if _mixed(column, present):
            return None
        if present and algorithm.buffers_like_param:
            same.append(cast(Sequence[Tensor], column))
    if any(map(IS_SPARSE, gs)) or dtypes.count(dtypes[0]) != n:
        return None
    devices = list(map(DEVICE, same[0] if with_params else gs))
    if devices.count(devices[0]) != n:
        return None
    for alike in same:
        if list(map(SHAPE, alike)) != shapes or list(map(DTYPE, alike)) != dtypes:
            return None
    if creating(list(map(_FIRST, buffer_columns))):
        return None
    new, coefficients = algorithm._schedule(firsts, hyperparams, False, {})
    if any([isinstance(c, Tensor) for c in coefficients]):
        return None
    return new, coefficients


def group_leaves(
    algorithm: Any,
    hyperparams: Hyperparams,
    p_leaves: Sequence[Tensor | None],
    g_leaves: Sequence[Tensor | None],
    columns: Sequence[Sequence[Any]],
    buffer_columns: Sequence[Sequence[Tensor | None]],
    new_columns: list[list[Any]],
    updates: list[Tensor | None],
    groups: Groups,
    lists_ok: bool,
    eager: bool,
    traceable: bool,
    creating: Callable[[Sequence[Tensor | None]], bool],
) -> None:
    """`update_leaves`' grouping, leaf by leaf: it checks each leaf, writes its new
    counters into `new_columns`, steps a leaf that must step by itself (into
    `updates` and `new_columns`), and adds the others to `groups`, by what their math
    shares."""
    k = len(algorithm.counters)
    n = len(g_leaves)
    # per leaf: its counters, its buffers (None where absent), which are absent
    counter_rows = rows(columns[:k], n)
    buffer_rows = rows(buffer_columns, n)
    absent_rows = rows([[b is None for b in column] for column in buffer_columns], n)
    # the previous leaf's counters, their schedule, and whether its coefficients are numbers
    last: tuple[tuple[Any, ...], Any, bool] | None = None
    by_value: dict[Any, Any] = {}  # readable counters' values -> their schedule
    keep = functools.partial(_keep, updates, new_columns[k:])
    members: list[int] = []  # the leaves that step in groups, their keys, their coefficients
    keys: list[tuple[Any, ...]] = []
    by_id: dict[int, Any] = {}
    for i, (p, g, counters, buffers, absent) in enumerate(
        zip(p_leaves, g_leaves, counter_rows, buffer_rows, absent_rows)
    ):
        if g is None:  # skipped, as torch skips a param without .grad
            continue
        sparse = check_leaf(algorithm, i, p, g, buffers, hyperparams)
        last = run_schedule(algorithm, last, counters, hyperparams, traceable, by_value)
        _, (new, coefficients), numeric = last
        for column, value in zip(new_columns, new):
            column[i] = value
        # a param with a buffer to create, or whose math looks across elements, steps by
        # itself with the `Pure` ops; so does any param where lists cannot serve
        if not lists_ok or not numeric or sparse or not algorithm.per_element or creating(buffers):
            keep(i, *algorithm._pure_step(p, g, buffers, coefficients, hyperparams))
            continue
        # Without params the math never reads p: only weight decay does, and `update`
        # refuses it without params. The in-place paths then take p as None.
        like = g if p is None else p  # what the update is shaped and typed like
        # the others in groups that `inplace.plan` runs, by what their math shares (and
        # those that record apart: all a foreach op's outputs record if one does)
        keys.append((id(coefficients), like.dtype, like.device, p is None, absent,
                     not eager and records((p, g), buffers)))  # fmt: skip
        members.append(i)
        by_id[id(coefficients)] = coefficients  # (also keeps them, and so their id, alive)
    for key, positions in group_by([keys]).items():
        groups.append((by_id[key[0][0]], [members[j] for j in positions]))


def check_leaf(
    algorithm: Any,
    i: int,
    p: Tensor | None,
    g: Any,
    buffers: Sequence[Tensor | None],
    hyperparams: Hyperparams,
) -> bool:
    """Raise if leaf i's gradient is no tensor, or its param or buffers are shaped or
    typed unlike it, or it is sparse where the algorithm takes no sparse gradient.
    Returns whether it is sparse."""
    if not isinstance(g, Tensor):
        raise TypeError(
            f"{algorithm.name} update: the gradient of leaf {i} is {a_kind(g)}; "
            "grads must be a pytree of tensors (None for a param to skip)"
        )
    if g.is_sparse:
        algorithm.check_sparse_grad(hyperparams)
    shape, dtype = g.shape, g.dtype
    for t in (p, *(buffers if algorithm.buffers_like_param else ())):
        if t is not None and (t.shape != shape or t.dtype != dtype):
            raise mismatch_error(algorithm.name, algorithm.buffer_fields, i, p, g, buffers)
    return g.is_sparse


def run_schedule(
    algorithm: Any,
    last: tuple[tuple[Any, ...], Any, bool] | None,
    counters: tuple[Any, ...],
    hyperparams: Hyperparams,
    traceable: bool,
    by_value: dict[Any, Any],
) -> tuple[tuple[Any, ...], Any, bool]:
    """A leaf's counters, their schedule, and whether its coefficients are numbers:
    those of the `last` leaf where it has the same counters. Leaves share their
    counter tensors (see init): the schedule is computed once per run of leaves with
    the same counters. Compared by identity, not id() (torch.compile would guard on
    id values), or as views of one batched counter (`same_batched`), and with the last
    run only (a search of all would make tracing quadratic in the number of leaves)."""
    if last is not None and (
        not any(map(operator.is_not, last[0], counters))
        or all(a is b or same_batched(a, b) for a, b in zip(last[0], counters))
    ):
        return last
    schedule = algorithm._schedule(counters, hyperparams, traceable, by_value)
    # coefficients in tensors (from a tensor hyperparameter, or counters not read:
    # traced, or on the meta device) take the `Pure` ops one leaf at a time; the
    # foreach and in-place ops take numbers
    return counters, schedule, not any(isinstance(c, Tensor) for c in schedule[1])


_IS_NONE = functools.partial(operator.is_, None)
_FIRST = operator.itemgetter(0)


def _mixed(leaves: Sequence[Any], present: bool) -> bool:
    """Whether some of `leaves` are None and some not, where the first is `present`."""
    return any(map(_IS_NONE, leaves)) if present else not all(map(_IS_NONE, leaves))


def run(
    algorithm: Any,
    hyperparams: Hyperparams,
    groups: Groups,
    p_leaves: Sequence[Tensor | None],
    gs: Sequence[Tensor],
    buffer_columns: Sequence[Sequence[Any]],
    updates: list[Tensor | None],
    new_buffers: Sequence[list[Any]],
    face: str,
) -> None:
    """Step each group the way `inplace.plan` routes its leaves, into `updates` and
    `new_buffers` (one column per buffer): in lists (fresh memory and foreach ops in
    plain eager mode, else `PureForEach` ops), or leaf by leaf (block by block in fresh
    memory, or with `Pure` ops)."""
    keep = functools.partial(_keep, updates, new_buffers)
    for coefficients, indices in groups:
        likes = [gs[i] if (p := p_leaves[i]) is None else p for i in indices]
        members = inplace.pick(buffer_columns, indices)
        for route, chosen in inplace.plan(likes, members, face).items():
            picked = indices if len(chosen) == len(indices) else [indices[c] for c in chosen]
            if route == inplace.LISTS:
                group = inplace.pick((p_leaves, gs, *buffer_columns), picked)
                if face == inplace.FRESH:
                    outs, news = inplace.fresh_lists(algorithm, coefficients, hyperparams, group)
                else:
                    outs, news = algorithm._pure_lists(coefficients, hyperparams, group)
                for j, i in enumerate(picked):  # (`keep`, inline: a call per leaf counts)
                    updates[i] = outs[j]
                    for column, values in zip(new_buffers, news):
                        column[i] = MaskedNode() if values is None else values[j]
                continue
            for i in picked:
                p, g, buffers = p_leaves[i], gs[i], [column[i] for column in buffer_columns]
                if route == inplace.BLOCKS:
                    keep(i, *inplace.fresh_step(algorithm, coefficients, hyperparams, p, g, buffers))
                else:
                    keep(i, *algorithm._pure_step(p, g, buffers, coefficients, hyperparams))
