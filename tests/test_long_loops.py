"""inner_loop(checkpoint_every=n, truncate=k): the checkpointed loop's meta-gradient
equals the plain unroll's (float64), with less saved for the backward; truncation
equals a loop restarted from detached params and state; what cannot be differentiated
raises an error."""

from __future__ import annotations

import pytest
import torch
from torch.func import functional_call

import funcopt as fo

D = torch.float64
K = 7
MODEL = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1)).to(D)


def loss_fn(params, x, y):
    return torch.nn.functional.mse_loss(functional_call(MODEL, params, (x,)), y)


def dropout_loss_fn(params, x, y):
    hidden = torch.nn.functional.dropout(torch.tanh(x @ params["0.weight"].T + params["0.bias"]), 0.3)
    return torch.nn.functional.mse_loss(hidden @ params["2.weight"].T + params["2.bias"], y)


def problem(seed=0):
    g = torch.Generator().manual_seed(seed)
    params = {
        k: torch.randn(v.shape, dtype=D, generator=g).requires_grad_() for k, v in MODEL.named_parameters()
    }
    batches = [
        (torch.randn(16, 3, dtype=D, generator=g), torch.randn(16, 1, dtype=D, generator=g)) for _ in range(K)
    ]
    return params, batches


def meta_grads(tx, wrt_lr=True, fn=loss_fn, **kwargs):
    """d outer / d (initial params, lr) by torch.autograd.grad, lr in the state."""
    params, batches = problem()
    lr = torch.tensor(0.05, dtype=D, requires_grad=True)
    inner = fo.inject_hyperparams(tx)(lr=lr)
    torch.manual_seed(1)
    adapted, state, losses = fo.inner_loop(fn, params, inner, batches, **kwargs)
    outer = loss_fn(adapted, *batches[0]) + 0.1 * sum(losses)
    wrt = [*params.values(), lr] if wrt_lr else list(params.values())
    return torch.autograd.grad(outer, wrt, allow_unused=True), state


def assert_equal_grads(got, want, rtol=1e-10):
    for g, w in zip(got, want):
        assert g is not None and w is not None
        assert float((g - w).norm()) <= rtol * float(w.norm()) + 1e-300


@pytest.mark.parametrize("tx", [fo.adam, fo.nadam, fo.adamax])
@pytest.mark.parametrize("n", [1, 3, K, K + 2])
def test_checkpointed_equals_plain(tx, n):
    want, want_state = meta_grads(tx)
    got, state = meta_grads(tx, checkpoint_every=n)
    assert_equal_grads(got, want)
    torch.testing.assert_close(state, want_state, rtol=0, atol=0)


def test_first_order_state_structure_change_and_dropout():
    assert_equal_grads(
        meta_grads(fo.adam, first_order=True, checkpoint_every=2)[0], meta_grads(fo.adam, first_order=True)[0]
    )
    # the segments replay the random draws of the forward pass
    got = meta_grads(fo.adam, fn=dropout_loss_fn, checkpoint_every=3)[0]
    assert_equal_grads(got, meta_grads(fo.adam, fn=dropout_loss_fn)[0])
    # a state whose structure changes after the first step (SGD's momentum buffer)
    sgd = lambda lr: fo.sgd(lr=lr, momentum=0.9)
    assert_equal_grads(meta_grads(sgd, checkpoint_every=2)[0], meta_grads(sgd)[0])


def test_backward_and_differentiable_batches():
    params, batches = problem()
    x0 = batches[0][0].detach().requires_grad_()  # a meta-learned input
    grads = []
    for n in (None, 2):
        batches = [(x0 * 1.5, y) for _, y in batches]
        for p in [*params.values(), x0]:
            p.grad = None
        adapted, _, _ = fo.inner_loop(loss_fn, params, fo.adam(lr=0.05), batches, checkpoint_every=n)
        loss_fn(adapted, *batches[0]).backward()
        grads.append([p.grad.clone() for p in [*params.values(), x0]])
    assert_equal_grads(grads[1], grads[0])


def test_foreign_tensor_raises():
    params, batches = problem()
    lr = torch.tensor(0.05, dtype=D, requires_grad=True)  # held by the transform, not in the state
    with pytest.raises(RuntimeError, match="inject_hyperparams"):
        fo.inner_loop(loss_fn, params, fo.adam(lr=lr), batches, checkpoint_every=3)
    closure = lambda params, x, y: loss_fn(params, x * lr, y)
    with pytest.raises(RuntimeError, match="not in params, state or the batches"):
        fo.inner_loop(closure, params, fo.inject_hyperparams(fo.adam)(lr=lr), batches, checkpoint_every=3)
    with torch.no_grad():  # nothing to differentiate: no graph, no check
        fo.inner_loop(closure, params, fo.adam(lr=lr), batches, checkpoint_every=3)


def test_torch_func_raises():
    params, batches = problem()
    params = {k: v.detach() for k, v in params.items()}
    f = lambda p: loss_fn(
        fo.inner_loop(loss_fn, p, fo.adam(lr=0.05), batches, checkpoint_every=2)[0], *batches[0]
    )
    with pytest.raises(RuntimeError, match="torch.func transforms"):
        torch.func.grad(f)(params)


def test_double_backward_raises():
    params, batches = problem()
    adapted, _, _ = fo.inner_loop(loss_fn, params, fo.adam(lr=0.05), batches, checkpoint_every=2)
    with pytest.raises(RuntimeError, match="create_graph=True"):
        torch.autograd.grad(loss_fn(adapted, *batches[0]), [params["2.bias"]], create_graph=True)


def truncated_by_hand(lr, k, params, batches):
    """The loop restarted from the detached params and state after K - k steps."""
    tx = fo.adam(lr=lr)
    with torch.no_grad():
        mid, state, _ = fo.inner_loop(loss_fn, params, tx, batches[: K - k])
    mid, state = [torch.utils._pytree.tree_map(lambda x: x.detach(), t) for t in (mid, state)]
    return fo.inner_loop(loss_fn, mid, tx, batches[K - k :], state=state)[0]


@pytest.mark.parametrize("n", [None, 2])
def test_truncate_equals_restart(n):
    params, batches = problem()
    lr = torch.tensor(0.05, dtype=D, requires_grad=True)
    want = torch.autograd.grad(loss_fn(truncated_by_hand(lr, 3, params, batches), *batches[0]), lr)
    tx = fo.inject_hyperparams(fo.adam)(lr=lr) if n else fo.adam(lr=lr)
    adapted, state, losses = fo.inner_loop(loss_fn, params, tx, batches, truncate=3, checkpoint_every=n)
    assert len(losses) == K and not losses[0].requires_grad and losses[-1].requires_grad
    got = torch.autograd.grad(loss_fn(adapted, *batches[0]), [lr, *params.values()], allow_unused=True)
    assert_equal_grads(got[:1], want)
    assert all(g is None for g in got[1:])  # the initial params are before the truncation


def test_truncate_under_torch_func():
    params, batches = problem()
    params = {k: v.detach() for k, v in params.items()}
    lr = torch.tensor(0.05, dtype=D)
    f = lambda lr, k: loss_fn(
        fo.inner_loop(loss_fn, params, fo.adam(lr=lr), batches, truncate=k)[0], *batches[0]
    )
    want = torch.func.grad(lambda lr: loss_fn(truncated_by_hand(lr, 2, params, batches), *batches[0]))(lr)
    torch.testing.assert_close(torch.func.grad(f)(lr, 2), want, rtol=1e-10, atol=0)
    full = torch.func.grad(
        lambda lr: loss_fn(fo.inner_loop(loss_fn, params, fo.adam(lr=lr), batches)[0], *batches[0])
    )
    torch.testing.assert_close(torch.func.grad(f)(lr, K), full(lr), rtol=1e-12, atol=0)
    lrs = torch.tensor([0.01, 0.05], dtype=D)
    torch.testing.assert_close(
        torch.vmap(torch.func.grad(f), in_dims=(0, None))(lrs, 2)[1], want, rtol=1e-10, atol=0
    )


@pytest.mark.parametrize(
    "kwargs", [{"checkpoint_every": 0}, {"truncate": -1}, {"truncate": 2.0}, {"checkpoint_every": True}]
)
def test_bad_counts(kwargs):
    params, batches = problem()
    with pytest.raises(ValueError, match="positive int"):
        fo.inner_loop(loss_fn, params, fo.adam(lr=0.1), batches, **kwargs)
