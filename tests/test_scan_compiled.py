"""A compiled fo.scan_inner_loop is one graph, with no eager step at each call: its
probing step (which finds the leaves a step passes on unchanged) is traced, not run
(dead code that the compiler drops). Eagerly it ran at every call behind a graph break,
cost more than the compiled loop itself (second-order MAML, K=5), and its foreign-leaf
check recompiled at every call. The traced probe does no foreign-leaf check: these
tests show that a compiled scan needs none. tests/test_scan_recompile.py checks that
it is one graph (``fullgraph=True``) that does not recompile."""

from __future__ import annotations

import pytest
import torch
from test_scan_inner_loop import XS, D, loss_fn, make_params

import funcopt as fo


@pytest.mark.slow  # about 30 s: AOTAutograd traces scan's forward and backward
def test_compiled_scan_differentiates_a_closure_tensor_and_refuses_a_double_backward():
    """Eagerly, a differentiable tensor the steps read from a closure is refused; traced,
    TorchDynamo makes it an input of the scan, which gets its gradient. A compiled
    backward refuses ``create_graph=True`` (AOTAutograd's, as inductor's)."""
    # (config.patch: monkeypatch's undo deletes the setting from torch's config module)
    with torch._dynamo.config.patch(capture_scalar_outputs=True):
        torch._dynamo.reset()
        params = make_params()
        lr = torch.tensor(0.1, dtype=D, requires_grad=True)
        tx = fo.adam(lr=lr)  # held by the transform, not in the state

        @torch.compile(backend="aot_eager", fullgraph=True)
        def meta_loss(params):
            adapted, _, _ = fo.scan_inner_loop(loss_fn, params, tx, XS)
            return loss_fn(adapted, XS[0][0], XS[1][0])

        wrt = [*params.values(), lr]
        got = torch.autograd.grad(meta_loss(params), wrt)
        adapted, _, _ = fo.inner_loop(loss_fn, params, tx, list(zip(*XS)))
        want = torch.autograd.grad(loss_fn(adapted, XS[0][0], XS[1][0]), wrt)
        torch.testing.assert_close(got, want, rtol=1e-10, atol=0)
        with pytest.raises(RuntimeError, match="create_graph=False|double backward"):
            torch.autograd.grad(meta_loss(params), wrt, create_graph=True)
        torch._dynamo.reset()
