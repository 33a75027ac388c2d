"""fo.scan_inner_loop: the same numbers and meta-gradients as fo.inner_loop (float64),
and clear errors where torch's scan cannot go (torch.func transforms, double backward,
a differentiable tensor read from a closure, a state that changes structure). Eager
scan traces its body at every call (seconds), so the cases that run it are slow."""

from __future__ import annotations

import pytest
import torch

import funcopt as fo

D = torch.float64
K = 4
torch.manual_seed(0)
XS = (torch.randn(K, 8, 3, dtype=D), torch.randn(K, 8, 1, dtype=D))


def loss_fn(params, x, y):
    return (torch.tanh(x @ params["w"]) + params["b"] - y).pow(2).mean()


def make_params():
    g = torch.Generator().manual_seed(1)
    return {
        "w": torch.randn(3, 1, dtype=D, generator=g).requires_grad_(),
        "b": torch.zeros(1, dtype=D, requires_grad=True),
    }


@pytest.mark.slow
@pytest.mark.parametrize("first_order", [False, True])
def test_same_numbers_and_meta_gradients_as_inner_loop(first_order):
    params = make_params()
    lr = torch.tensor(0.1, dtype=D, requires_grad=True)
    tx = fo.inject_hyperparams(fo.adam)(lr=lr)  # a differentiable lr, in the state
    got = fo.scan_inner_loop(loss_fn, params, tx, XS, first_order=first_order)
    want = fo.inner_loop(loss_fn, params, tx, list(zip(*XS)), first_order=first_order)
    torch.testing.assert_close(got[:2], want[:2], rtol=1e-12, atol=0)
    torch.testing.assert_close(got[2], torch.stack(want[2]), rtol=1e-12, atol=0)
    wrt = [*params.values(), lr]
    outer = [loss_fn(adapted, XS[0][0], XS[1][0]) for adapted in (got[0], want[0])]
    with pytest.raises(RuntimeError, match="create_graph=True"):  # scan's double backward is wrong
        torch.autograd.grad(outer[0], wrt, create_graph=True, retain_graph=True)
    torch.testing.assert_close(
        torch.autograd.grad(outer[0], wrt), torch.autograd.grad(outer[1], wrt), rtol=1e-10, atol=0
    )


def test_refuses_what_scan_cannot_do():
    params = {k: v.detach() for k, v in make_params().items()}
    with pytest.raises(RuntimeError, match="torch.func transforms"):
        torch.func.grad(lambda p: fo.scan_inner_loop(loss_fn, p, fo.adam(lr=0.1), XS)[2].sum())(params)
    lr = torch.tensor(0.1, dtype=D, requires_grad=True)
    with pytest.raises(RuntimeError, match="inject_hyperparams"):  # held by the transform: refused
        fo.scan_inner_loop(loss_fn, params, fo.adam(lr=lr), XS)
    with pytest.raises(TypeError, match="tuple of loss_fn's arguments"):
        fo.scan_inner_loop(loss_fn, params, fo.adam(lr=0.1), XS[0])
    with pytest.raises(ValueError, match="leading dimension"):
        fo.scan_inner_loop(loss_fn, params, fo.adam(lr=0.1), (XS[0], XS[1][:2]))


@pytest.mark.slow
def test_sgd_with_momentum_runs_in_scan():
    """SGD's momentum buffer is in the state from init on: a scan carry of fixed structure."""
    params = {k: v.detach() for k, v in make_params().items()}
    tx = fo.sgd(lr=0.1, momentum=0.9, nesterov=True)
    got = fo.scan_inner_loop(loss_fn, params, tx, XS)
    want = fo.inner_loop(loss_fn, params, tx, list(zip(*XS)))
    torch.testing.assert_close(got[:2], want[:2], rtol=1e-12, atol=0)
