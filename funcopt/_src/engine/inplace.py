"""Running an algorithm's elementwise math fast: on segments on the CPU, on lists of
tensors elsewhere. One planner (`plan`) says how each param of a group runs, for each
face: the torch.optim adapters (which update params and state in place), the functional
update in plain eager mode (which computes its new tensors in place, in fresh memory, so
that its inputs are only read), and the functional update where autograd records. The
executors below serve them all.

On the CPU the math runs on segments: several tiny tensors concatenated (`Chunks` of
`CHUNK` elements: per-tensor Python overhead dominates tiny tensors), or flat blocks of
`SEGMENT` elements of a large one (the intermediate passes over a block stay in the CPU
cache, where a whole large tensor would stream from memory at every op). The math is
per-element (`Algorithm.per_element`), so this changes no float32 or float64 result.
In bfloat16 and float16, torch's CPU kernels round some ops (``add`` with ``alpha``)
differently in a run's vectorized body and in its scalar tail, so moving those
boundaries can change an element by one unit in the last place; torch's own results
move the same way with the number of threads, which sets where each thread's run ends.

On a GPU the cost is kernel launches, not memory traffic through a cache: there the
adapters run the math once per group of params with `ForEach` ops (`run_lists`), as
torch's foreach path does.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any, cast

import torch
from torch import Tensor

from ..core.base import SMALL, as_complex, as_real
from .ops import Borrowed, ForEach, Fresh, InPlace, TensorList

SEGMENT = 1 << 19
"""Elements in a block of a large tensor; a tensor up to this size is one block."""
TINY = 1 << 12
"""The adapters step CPU params up to this size in chunks (`Chunks`)."""
CHUNK = 1 << 15
"""Elements in a chunk. A chunk's concatenations and temporaries are fresh memory at
every step: at 128 KiB a tensor they stay in the CPU cache, and under the sizes at
which glibc's malloc, by default, maps memory from the OS or gives it back (chunks of
512K elements page-faulted 600-2,900 times a step in some processes, up to 5x slower)."""


_CPU = torch.device("cpu")


def use_lists(device: torch.device) -> bool:
    """Whether params on `device` step in groups through `ForEach` ops (`run_lists`): off
    the CPU, where what counts is the number of kernel launches, not cache reuse."""
    return device != _CPU  # faster than reading device.type, per param


# How a param's math runs (`plan`), and the faces that run it
LISTS = "lists"
"""With its group, one ``torch._foreach_*`` call per op (`run_lists`, `fresh_lists`, or
the `PureForEach` ops where autograd records)."""
VECTORS = "vectors"
"""In place, a 1-d CPU param of at most `TINY` elements, with the others in bulk, in
chunks of their concatenation (`Chunks.add_vectors`)."""
CHUNKS = "chunks"
"""In place, another CPU param of at most `TINY` elements, in a chunk of params of its
trailing shape (`Chunks.add`)."""
BLOCKS = "blocks"
"""By itself, in blocks of `SEGMENT` elements of its flat views (`run_blocks`; in fresh
memory, `fresh_step`)."""
WHOLE = "whole"
"""By itself, whole: in place (`run`), else with the `Pure` ops (new tensors)."""
KERNEL = "kernel"
"""In place, by itself, by a compiled kernel of its math (``fused=True``: torch/fused.py),
where it is dense (else as `IN_PLACE` would run it)."""

IN_PLACE = "in place"
"""The adapters' step: params and buffers updated in place."""
FRESH = "fresh"
"""The functional update in plain eager mode: new tensors, computed in place in fresh memory."""
RECORDED = "recorded"
"""The functional update where autograd records (a MAML inner loop): out-of-place ops."""
FUSED = "fused"
"""`IN_PLACE` with compiled kernels (``fused=True``): a CPU param of more than `TINY`
elements takes its `KERNEL`."""
WRITTEN_BACK = "written back"
"""`RECORDED`, its results then written into the params and state (the adapters' pure
step): no foreach op, whose saved inputs the writes would overwrite (torch's
differentiable optimizers take none either)."""


def plan(likes: Sequence[Tensor], buffers: Sequence[Sequence[Any]], face: str) -> dict[str, list[int]]:
    """How each param of a group runs its math, for each face the same rules: the
    indices of the params that take each way (`LISTS`, `VECTORS`, `CHUNKS`, `BLOCKS`,
    `WHOLE`, `KERNEL`). The params share their schedule, their dtype, which buffers they have,
    and, but in place, their device; `likes` are the params (the gradients, for an
    update without params), `buffers` each buffer's column (Nones where absent).

    - Off the CPU, what counts is the number of kernel launches: `LISTS` (but where
      autograd records, as on the CPU).
    - In place without buffers (SGD without momentum) the math is an op or two, with
      nothing to keep in the cache: `LISTS`, as torch's foreach step.
    - Small CPU tensors cost their ops' per-call overhead more than their memory
      traffic: in place, up to `TINY` elements, concatenated into cache-sized chunks
      (`VECTORS`, `CHUNKS`), whose results are copied back; fresh or recorded, up to
      `SMALL` elements, with foreach ops (`LISTS`), which make the new tensors anyway.
    - Larger contiguous tensors, in place or fresh: `BLOCKS`, whose passes stay in the
      CPU cache (fresh without buffers, the math is a pass or two: `WHOLE`). Where
      autograd records, per-tensor ops (`WHOLE`): torch's foreach ops save every input
      for the backward pass, per-tensor ops only what they need.
    - Anything else: `WHOLE`.
    - With ``fused=True`` (`FUSED`), a CPU param of more than `TINY` elements: its
      compiled kernel (`KERNEL`), one pass over its memory.
    """
    every = list(range(len(likes)))
    if not every or face == WRITTEN_BACK:
        return {WHOLE: every}
    if face == FUSED:  # the larger CPU params by their kernels, the others as in place
        large = [t.is_cpu and t.numel() > TINY for t in likes]
        others = [i for i in every if not large[i]]
        fused = {KERNEL: [i for i in every if large[i]]} if any(large) else {}
        if others:
            likes_left, *buffers_left = pick((likes, *buffers), others)
            for route, chosen in plan(likes_left, buffers_left, IN_PLACE).items():
                fused[route] = chosen if len(others) == len(every) else [others[j] for j in chosen]
        return fused
    routes: dict[str, list[int]] = {}
    if face == RECORDED:
        for i, t in enumerate(likes):
            routes.setdefault(LISTS if t.numel() <= SMALL else WHOLE, []).append(i)
        return routes
    if face == IN_PLACE and all(column[0] is None for column in buffers):
        return {LISTS: every}
    if face == FRESH:  # (a group on one device)
        if all_lists(likes):
            return {LISTS: every}
        # without buffers (SGD without momentum) the math is a pass or two: blocks buy nothing
        buffered = not all(column[0] is None for column in buffers)
        for i, t in enumerate(likes):
            if t.numel() <= SMALL:
                route = LISTS
            else:
                route = BLOCKS if buffered and blockable(t, *(column[i] for column in buffers)) else WHOLE
            routes.setdefault(route, []).append(i)
        return routes
    # in place (a group may span devices): the tiny 1-d CPU params found at once (there
    # may be hundreds of biases and norms)
    vector = [t.dim() == 1 and t.is_cpu and t.numel() <= TINY for t in likes]
    if all(vector):
        return {VECTORS: every}
    for i, t in enumerate(likes):
        if vector[i]:
            route = VECTORS
        elif use_lists(t.device):
            route = LISTS
        elif (numel := t.numel()) <= TINY:
            route = CHUNKS
        elif numel > SEGMENT and blockable(t, *(column[i] for column in buffers)):
            route = BLOCKS
        else:  # one segment: the whole param at once
            route = WHOLE
        routes.setdefault(route, []).append(i)
    return routes


def all_lists(likes: Sequence[Tensor]) -> bool:
    """Whether a fresh group (on one device) runs all in `LISTS`: off the CPU, or small."""
    return use_lists(likes[0].device) or all([t.numel() <= SMALL for t in likes])


def run(algorithm: Any, coefficients: Any, hyperparams: Any, out: Any, p: Any, g: Any,
        buffers: Sequence[Any], ops: Any = InPlace) -> list[Any]:  # fmt: skip
    """The math on one set of (real) tensors, or with `ForEach` on lists of them: `out`
    and `buffers` are updated in place. Returns the buffers: a buffer the math created
    where it was absent (None) is new, for the caller to keep."""
    result, new = algorithm.elementwise(ops, out, p, g, *buffers, coefficients, **hyperparams)
    if isinstance(result, Fresh):  # the math never wrote the update: it is zero
        result.memory.zero_()
    for old, value in zip(buffers, new):
        if value is not old and old is not None:
            ops.copy_(old, value)
    return list(new)


def run_lists(algorithm: Any, coefficients: Any, hyperparams: Any,
              columns: Sequence[list[Tensor]]) -> None:  # fmt: skip
    """Step a group of params in place with `ForEach`: one kernel per op for the whole
    group, as torch's foreach path (on a GPU, per-tensor ops are bound by launches).
    `columns` holds the params, their gradients, then each buffer."""
    p, g, *buffers = (None if column[0] is None else TensorList(column) for column in columns)
    run(algorithm, coefficients, hyperparams, p, p, g, buffers, ForEach)


def blockable(*tensors: Tensor | None) -> bool:
    """Whether flat views of these tensors exist (the param, `out` and the buffers)."""
    return all(t is None or t.is_contiguous() for t in tensors)


def run_blocks(algorithm: Any, coefficients: Any, hyperparams: Any, out: Tensor, p: Tensor | None,
               g: Tensor, buffers: Sequence[Tensor],
               sources: Sequence[Tensor] | None = None) -> None:  # fmt: skip
    """`run`, block by block over flat views of contiguous tensors (a tensor of at most
    `SEGMENT` elements is one block, and needs no views).

    With `sources` the buffers and `out` are fresh memory: each block of a buffer first
    receives the block of its source, and the block of `out` is passed as `Fresh`.
    `p` is None for an update without params (the math then never reads it).
    """
    for block_out, block_p, block_g, block_buffers, block_sources in _blocks(out, p, g, buffers, sources):
        if block_sources is not None:
            for b, s in zip(block_buffers, block_sources):
                if b is not None:
                    b.copy_(s)
        run(algorithm, coefficients, hyperparams, block_out if block_sources is None else Fresh(block_out),
            block_p, block_g, block_buffers)  # fmt: skip


def _blocks(out: Tensor, p: Tensor | None, g: Tensor, buffers: Sequence[Tensor],
            sources: Sequence[Tensor] | None) -> Iterator[tuple[Any, ...]]:  # fmt: skip
    """The arguments of `run_blocks`, block by block. Where `out` is `p`, so is each
    block of it (the math tests that identity)."""
    n = g.numel()
    if n <= SEGMENT:
        yield out, p, g, buffers, sources
        return
    flat_p = None if p is None else p.view(-1)
    flat_out, flat_g = out.view(-1), g.reshape(-1)
    flat_buffers = [None if b is None else b.view(-1) for b in buffers]
    flat_sources = None if sources is None else [None if s is None else s.reshape(-1) for s in sources]
    for i in range(0, n, SEGMENT):
        j = i + SEGMENT
        block_p = None if flat_p is None else flat_p[i:j]
        block_out = block_p if block_p is not None and out is p else flat_out[i:j]
        block_sources = (
            None if flat_sources is None else [None if s is None else s[i:j] for s in flat_sources]
        )
        yield (
            block_out,
            block_p,
            flat_g[i:j],
            [None if b is None else b[i:j] for b in flat_buffers],
            block_sources,
        )


FEW = 16
"""Small params of another trailing shape step as a chunk of their own from this many on;
fewer join the chunk of 1-d params as flat views."""


def run_chunk(algorithm: Any, coefficients: Any, hyperparams: Any,
              chunk: Sequence[list[Tensor]]) -> None:  # fmt: skip
    """Step several small params in place at once.

    `chunk` holds the params, their gradients, then each buffer, all with one trailing
    shape (``t.shape[1:]``), or Nones for a buffer absent from all. The math runs on their
    concatenation along the first dimension; the results are copied back.
    """
    if len(chunk[0]) == 1:
        p, g, *buffers = (column[0] for column in chunk)
        run(algorithm, coefficients, hyperparams, p, p, g, buffers)
        return
    p, g, *buffers = [None if column[0] is None else torch.cat(column) for column in chunk]
    run(algorithm, coefficients, hyperparams, p, p, g, buffers)
    sizes = [t.shape[0] for t in chunk[0]]
    for targets, result in zip((chunk[0], *chunk[2:]), (p, *buffers)):
        if result is not None:
            torch.split_with_sizes_copy(result, sizes, 0, out=targets)  # no views: faster


def _flat_viewable(chunk: Sequence[list[Tensor]]) -> bool:
    """Whether the params and buffers of `chunk` have flat views, which writes reach."""
    return all(t is None or t.is_contiguous() for column in (chunk[0], *chunk[2:]) for t in column)


class Chunks:
    """Tiny CPU params, stepped in chunks (`run_chunk`) of about `CHUNK` elements that
    share a schedule, dtype and device.

    A chunk is concatenated along the first dimension, so its params share their
    trailing shape and need no flat view: a view costs about a microsecond, which counts
    with hundreds of tiny params. 1-d params (and 0-d ones, as 1-d views) make one chunk;
    fewer than `FEW` contiguous params of another trailing shape join it as flat views
    rather than step by themselves.
    """

    def __init__(self, algorithm: Any, hyperparams: Any) -> None:
        self.algorithm, self.hyperparams = algorithm, hyperparams
        # (key, trailing shape) -> [coefficients, columns, elements in them]
        self.open: dict[Any, list[Any]] = {}

    def add(self, key: Any, coefficients: Any, p: Tensor, g: Tensor, buffers: Sequence[Tensor],
            numel: int) -> None:  # fmt: skip
        """Queue a param with its gradient and buffers; `key` holds what its chunk shares
        with it besides the trailing shape (schedule, dtype, device), and `numel` is
        ``p.numel()``, which the caller has read."""
        row = (p, g, *buffers) if p.ndim else [None if t is None else t.view(1) for t in (p, g, *buffers)]
        key = (key, row[0].shape[1:])
        entry = self.open.get(key)
        if entry is None:
            entry = self.open[key] = [coefficients, [[] for _ in row], 0]
        for column, t in zip(entry[1], row):
            column.append(t)
        self._grow(self.open, key, entry, numel)

    def add_vectors(self, coefficients: Any, ps: list[Tensor], gs: list[Tensor],
                    buffers: list[list[Any]]) -> None:  # fmt: skip
        """Step 1-d params of at most `TINY` elements (their gradients, then each buffer's
        column: all of one schedule, dtype and device), in chunks of about `CHUNK`
        elements, at once: no per-param queueing (`add`), which counts with hundreds."""
        start, size = 0, 0
        for j, n in enumerate([p.shape[0] for p in ps]):
            size += n
            if size >= CHUNK or j == len(ps) - 1:
                end = j + 1
                run_chunk(self.algorithm, coefficients, self.hyperparams,
                          [ps[start:end], gs[start:end], *(column[start:end] for column in buffers)])  # fmt: skip
                start, size = end, 0

    def run(self) -> None:
        """Step the queued params."""
        flat: dict[Any, list[Any]] = {}  # key -> [coefficients, columns, elements in them]
        for (key, tail), (coefficients, chunk, size) in self.open.items():
            if tail and (len(chunk[0]) >= FEW or not _flat_viewable(chunk)):
                run_chunk(self.algorithm, coefficients, self.hyperparams, chunk)
                continue
            entry = flat.setdefault(key, [coefficients, [[] for _ in chunk], 0])
            for column, ts in zip(entry[1], chunk):
                column.extend([None if t is None else t.flatten() for t in ts] if tail else ts)
            self._grow(flat, key, entry, size)  # merged groups too stay near `CHUNK`
        for coefficients, columns, _ in flat.values():
            run_chunk(self.algorithm, coefficients, self.hyperparams, columns)
        self.open.clear()

    def _grow(self, entries: dict[Any, list[Any]], key: Any, entry: list[Any], size: int) -> None:
        """Count `size` more elements in `entry`, the chunk at `key` of `entries`, and step
        it (removing it from `entries`) once it holds `CHUNK`."""
        entry[2] += size
        if entry[2] >= CHUNK:
            run_chunk(self.algorithm, entry[0], self.hyperparams, entries.pop(key)[1])


def step_dense(algorithm: Any, coefficients: Any, hyperparams: Any, ps: Sequence[Tensor],
               gs: Sequence[Tensor], buffers: Sequence[Sequence[Any]],
               kernel: Callable[..., None] | None = None) -> None:  # fmt: skip
    """Step params in place, each the way `plan` says (`IN_PLACE`, or `FUSED` with a
    `kernel`, which steps the `KERNEL` params: ``kernel(ps, gs, buffers)``). The params
    (real, dense, with per-element math) share their schedule and dtype; `buffers` holds
    each buffer's column (Nones where absent from all)."""
    chunks = Chunks(algorithm, hyperparams)
    routes = plan(ps, buffers, IN_PLACE if kernel is None else FUSED)
    for route, indices in routes.items():
        group = pick((ps, gs, *buffers), indices)
        if route == KERNEL:
            cast(Callable[..., None], kernel)(group[0], group[1], group[2:])
        elif route == VECTORS:
            chunks.add_vectors(coefficients, group[0], group[1], group[2:])
        elif route == LISTS:
            for columns in _by_device(group):
                run_lists(algorithm, coefficients, hyperparams, columns)
        else:
            for p, g, *row in zip(*group):
                if route == CHUNKS:
                    chunks.add(p.device, coefficients, p, g, row, p.numel())
                elif route == BLOCKS:
                    run_blocks(algorithm, coefficients, hyperparams, p, p, g, row)
                else:
                    run(algorithm, coefficients, hyperparams, p, p, g, row)
    chunks.run()


def pick(columns: Sequence[Sequence[Any]], indices: list[int]) -> list[list[Any]]:
    """Each column's entries at `indices` (ascending, each once): where they are all of
    them, as usual, the columns themselves (lists are not copied: hundreds of tiny params)."""
    if columns and len(indices) == len(columns[0]):
        return [column if isinstance(column, list) else list(column) for column in columns]
    return [[column[i] for i in indices] for column in columns]


def _by_device(columns: list[list[Any]]) -> list[list[list[Any]]]:
    """A group's columns (params, gradients, buffers) split by the params' device, for
    foreach ops. Params without buffers (SGD without momentum) are taken together: their
    devices are not read (a read costs about as much as a small op, with hundreds of
    tiny params), and a foreach op steps a list across devices tensor by tensor."""
    if all(column[0] is None for column in columns[2:]):
        return [columns]
    by_device: dict[torch.device, list[int]] = {}
    for i, p in enumerate(columns[0]):
        by_device.setdefault(p.device, []).append(i)
    if len(by_device) == 1:
        return [columns]
    return [pick(columns, indices) for indices in by_device.values()]


def fresh_step(algorithm: Any, coefficients: Any, hyperparams: Any, p: Tensor | None, g: Tensor,
               buffers: Sequence[Tensor]) -> tuple[Tensor, list[Tensor]]:  # fmt: skip
    """One param's step as new tensors ``(update, new buffers)``, computed in place, block
    by block, in fresh memory: `p` (None for an update without params), `g` and
    `buffers` are only read."""
    # like the param (contiguous, see `blockable`), or, without params, a contiguous
    # tensor like the gradient
    update = torch.empty_like(g if p is None else p, memory_format=torch.contiguous_format)
    new = [None if b is None else torch.empty_like(b) for b in buffers]
    run_blocks(algorithm, coefficients, hyperparams, as_real(update), None if p is None else as_real(p), as_real(g),
               [as_real(b) for b in new], [as_real(b) for b in buffers])  # fmt: skip
    return update, new


def fresh_lists(algorithm: Any, coefficients: Any, hyperparams: Any, columns: Sequence[Sequence[Any]]
                ) -> tuple[list[Tensor], list[list[Tensor] | None]]:  # fmt: skip
    """`fresh_step` for a group of params with `ForEach` ops: ``(updates, new buffers)``
    as new tensors. `columns` holds the params (all None for an update without params),
    their gradients, then each buffer; they are only read: the buffers are `Borrowed`, so
    the first op on each makes its new tensors, and the update is fresh memory."""
    ps, gs, *buffers = columns
    updates = [torch.empty_like(g if p is None else p) for p, g in zip(ps, gs)]
    torch._foreach_zero_(updates)
    complex_ = gs[0].is_complex()
    borrowed = [
        None if c[0] is None else Borrowed([as_real(t) for t in c] if complex_ else c) for c in buffers
    ]
    _, new = algorithm.elementwise(
        ForEach, _real(updates), _real(ps), _real(gs), *borrowed, coefficients, **hyperparams
    )
    back = as_complex if complex_ else None
    return updates, [None if b is None else list(b) if back is None else [back(t) for t in b] for b in new]


def _real(ts: Sequence[Any] | None) -> TensorList | None:
    """A group's tensors as a `TensorList` for `ForEach` ops, complex ones as real views;
    None for an absent buffer (or the params of an update without them)."""
    if ts is None or ts[0] is None:
        return None
    return TensorList([as_real(t) for t in ts] if ts[0].is_complex() else ts)
