"""`inplace.plan`: one planner says how each param of a group runs its math, for the
adapters' in-place step and the functional update alike (the executors' results are
the same whichever way a param takes: the parity tests run every way)."""

from __future__ import annotations

import optree
import pytest
import torch

import funcopt as fo
from funcopt._src.engine import groups, inplace
from funcopt._src.engine.inplace import (
    BLOCKS,
    CHUNKS,
    FRESH,
    FUSED,
    IN_PLACE,
    KERNEL,
    LISTS,
    RECORDED,
    VECTORS,
    WHOLE,
    WRITTEN_BACK,
    plan,
)

TINY_VECTOR = torch.zeros(5)
TINY_MATRIX = torch.zeros(3, 4)
MEDIUM = torch.zeros(200, 200)  # above TINY and SMALL, one segment
LARGE = torch.zeros(inplace.SEGMENT + 1)
LARGE_T = torch.zeros(1000, inplace.SEGMENT // 1000 + 1).t()  # not contiguous


def routes(tensors: list[torch.Tensor], face: str, with_buffers: bool = True) -> dict[str, list[int]]:
    buffers = [[torch.zeros_like(t) for t in tensors]] if with_buffers else [[None] * len(tensors)]
    return plan(tensors, buffers, face)


def test_in_place_on_the_cpu():
    tensors = [TINY_VECTOR, TINY_MATRIX, MEDIUM, LARGE, LARGE_T, TINY_VECTOR]
    assert routes(tensors, IN_PLACE) == {VECTORS: [0, 5], CHUNKS: [1], WHOLE: [2, 4], BLOCKS: [3]}
    assert routes([TINY_VECTOR] * 3, IN_PLACE) == {VECTORS: [0, 1, 2]}


def test_in_place_without_buffers_takes_lists():
    """SGD without momentum: one foreach call per op for all, as torch's foreach step."""
    assert routes([TINY_VECTOR, LARGE], IN_PLACE, with_buffers=False) == {LISTS: [0, 1]}


def test_fused_takes_kernels_for_the_larger_cpu_params():
    """``fused=True``: a CPU param of more than TINY elements by its compiled kernel (dense
    or not: fused.py runs one that is not dense alike as in place), the others as in place."""
    tensors = [TINY_VECTOR, TINY_MATRIX, MEDIUM, LARGE, LARGE_T, TINY_VECTOR, LARGE.to("meta")]
    assert routes(tensors, FUSED) == {KERNEL: [2, 3, 4], VECTORS: [0, 5], CHUNKS: [1], LISTS: [6]}
    assert routes([TINY_VECTOR, TINY_MATRIX], FUSED) == routes([TINY_VECTOR, TINY_MATRIX], IN_PLACE)
    assert routes([TINY_VECTOR, LARGE], FUSED, with_buffers=False) == {KERNEL: [1], LISTS: [0]}


def test_off_the_cpu_takes_lists():
    on_meta = [t.to("meta") for t in (TINY_VECTOR, LARGE)]
    assert routes(on_meta, IN_PLACE) == {LISTS: [0, 1]}
    assert routes(on_meta, FRESH) == {LISTS: [0, 1]}
    mixed = routes([TINY_MATRIX, LARGE.to("meta")], IN_PLACE)  # a group in place may span devices
    assert mixed == {CHUNKS: [0], LISTS: [1]}


def test_fresh():
    tensors = [TINY_VECTOR, TINY_MATRIX, MEDIUM, LARGE, LARGE_T]
    assert routes(tensors, FRESH) == {LISTS: [0, 1], BLOCKS: [2, 3], WHOLE: [4]}
    # without buffers (SGD without momentum) the math is one pass: no blocks
    assert routes(tensors, FRESH, with_buffers=False) == {LISTS: [0, 1], WHOLE: [2, 3, 4]}


def test_where_autograd_records():
    """Small tensors in foreach groups; larger ones by themselves, whose per-tensor ops
    save less for the backward pass; none in foreach groups where the results are
    written back in place."""
    tensors = [TINY_VECTOR, MEDIUM, TINY_MATRIX]
    assert routes(tensors, RECORDED) == {LISTS: [0, 2], WHOLE: [1]}
    assert routes(tensors, WRITTEN_BACK) == {WHOLE: [0, 1, 2]}


@pytest.mark.parametrize("name", ["adam", "adamax", "sgd", "rmsprop", "asgd", "rprop"])
def test_the_usual_update_equals_the_per_leaf_grouping(name, monkeypatch):
    """The functional update finds the usual case (leaves alike, counters shared) column
    by column; its results equal, bit for bit, those of grouping leaf by leaf."""
    torch.manual_seed(0)
    params = {
        "w": torch.randn(64, 8),
        "b": torch.randn(64),
        "big": torch.randn(130, 130),
        "s": torch.randn(1),
    }
    kwargs = {"momentum": 0.9} if name == "sgd" else {} if name == "rprop" else {"weight_decay": 0.1}
    tx = getattr(fo, name)(lr=0.01, **kwargs)

    def run() -> list[torch.Tensor]:
        state, p = tx.init(params), params
        for _ in range(3):
            grads = {k: torch.sin(v * 3) for k, v in p.items()}
            updates, state = tx.update(grads, state, p)
            p = fo.apply_updates(p, updates)
        return optree.tree_leaves((p, state))

    usual = run()
    monkeypatch.setattr(groups, "usual", lambda *args: None)
    for a, b in zip(usual, run(), strict=True):
        assert torch.equal(a, b)


def test_leaves_not_alike_take_the_per_leaf_grouping():
    """Mixed dtypes, a None gradient, or a state moved leaf by leaf (counters not shared)
    are not the usual case; the per-leaf grouping steps them as torch would."""
    calls = []
    found = groups.usual

    def spy(*args):
        calls.append(found(*args))
        return calls[-1]

    params = {"a": torch.ones(3), "b": torch.ones(2, dtype=torch.float64)}
    tx = fo.adam(lr=0.1)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(groups, "usual", spy)
        tx.update({"a": torch.ones(3), "b": torch.ones(2, dtype=torch.float64)}, tx.init(params), params)
        assert calls[-1] is None
        same = {"a": torch.ones(3), "b": torch.ones(2)}
        tx.update({"a": torch.ones(3), "b": None}, tx.init(same), same)
        assert calls[-1] is None
        moved = optree.tree_map(torch.clone, tx.init(same))  # counters no longer shared
        updates, _ = tx.update({"a": torch.ones(3), "b": torch.ones(2)}, moved, same)
        assert calls[-1] is None
        tx.update({"a": torch.ones(3), "b": torch.ones(2)}, tx.init(same), same)
        assert calls[-1] is not None
    assert torch.allclose(updates["b"], torch.full((2,), -0.1))
