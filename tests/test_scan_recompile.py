"""A compiled fo.scan_inner_loop compiles once: called again with new params (as every
meta-iteration does), TorchDynamo reuses its graphs. An `id()` taken of the carry's
tensors made it guard on their identity, and recompile (tens of seconds under inductor)
at every call. It is also one graph (``fullgraph=True``): its probing step, which ran
eagerly behind a graph break at every call, is traced (tests/test_scan_compiled.py)."""

from __future__ import annotations

import pytest
import torch
from test_scan_inner_loop import XS, loss_fn, make_params
from torch._dynamo.utils import counters

import funcopt as fo


@pytest.mark.slow  # about 20 s: TorchDynamo traces scan's body
def test_compiled_scan_does_not_recompile_for_new_params():
    # (config.patch: monkeypatch's undo deletes the setting from torch's config module)
    with torch._dynamo.config.patch(capture_scalar_outputs=True):
        _check_no_recompile()


def _check_no_recompile() -> None:
    torch._dynamo.reset()

    @torch.compile(backend="eager", fullgraph=True)  # the guards are TorchDynamo's, whatever the backend
    def meta_loss(params):
        adapted, _, _ = fo.scan_inner_loop(loss_fn, params, fo.adam(lr=0.01), XS)
        return loss_fn(adapted, XS[0][0], XS[1][0])

    counters.clear()
    meta_loss(make_params()).backward()
    assert not counters["graph_break"]
    graphs = counters["stats"]["unique_graphs"]
    for _ in range(2):
        meta_loss(make_params()).backward()
    assert counters["stats"]["unique_graphs"] == graphs
    torch._dynamo.reset()
