"""fo.SparseAdam and fo.sparse_adam against torch.optim.SparseAdam: sparse gradients
only (uncoalesced, empty, from nn.Embedding(sparse=True)), torch's Python-int step,
checkpoints both ways, torch's errors, and the functional update's purity, tensor
hyperparameters and schedules."""

from __future__ import annotations

import io
import pickle

import optree
import pytest
import torch
from helpers import assert_same, optim_inputs

import funcopt as fo


def sparse_grad(shape, gen, dtype=torch.float32, duplicates=False):
    """A sparse gradient holding about half the entries of a param of `shape` (on its
    first dimension, as nn.Embedding's); with `duplicates`, uncoalesced, a row twice."""
    rows = (torch.rand(shape[0], generator=gen) < 0.5).nonzero().flatten()
    if duplicates and len(rows):
        rows = torch.cat([rows, rows[:1]])
    values = torch.randn((len(rows), *shape[1:]), generator=gen, dtype=dtype)
    return torch.sparse_coo_tensor(rows.unsqueeze(0), values, shape, check_invariants=True)


def empty_grad(shape, dtype=torch.float32):
    return torch.sparse_coo_tensor(
        torch.zeros(1, 0, dtype=torch.long),
        torch.zeros((0, *shape[1:]), dtype=dtype),
        shape,
        check_invariants=True,
    )


def run_three_ways(kwargs, base, grad_steps):
    """torch.optim.SparseAdam, fo.SparseAdam and fo.sparse_adam side by side."""
    ref_params = [p.clone().requires_grad_() for p in base]
    our_params = [p.clone().requires_grad_() for p in base]
    ref, ours = torch.optim.SparseAdam(ref_params, **kwargs), fo.SparseAdam(our_params, **kwargs)
    tx = fo.sparse_adam(**kwargs)
    params, state = list(base), tx.init(list(base))
    for grads in grad_steps:
        for ps in (ref_params, our_params):
            for p, g in zip(ps, grads):
                p.grad = None if g is None else g.clone()
        ref.step()
        ours.step()
        updates, state = tx.update(grads, state, params)
        params = fo.apply_updates(params, updates)
    return ref, ref_params, ours, our_params, params, state


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("desc,kwargs", optim_inputs("SparseAdam", with_flags=False))
def test_matches_torch_with_uncoalesced_and_empty_gradients(desc, kwargs, dtype):
    """Uncoalesced gradients (a row twice), an empty one (the step still counts), a None
    one (skipped): params and state_dict equal torch's bit for bit, the step a Python
    int; the functional path's too."""
    gen = torch.Generator().manual_seed(0)
    base = [torch.randn(6, 3, generator=gen, dtype=dtype), torch.randn(5, generator=gen, dtype=dtype)]
    grad_steps = [[sparse_grad(p.shape, gen, dtype, duplicates=True) for p in base] for _ in range(5)]
    grad_steps[1][1] = empty_grad(base[1].shape, dtype)
    grad_steps[3][0] = None
    ref, ref_params, ours, our_params, params, state = run_three_ways(kwargs, base, grad_steps)
    assert_same(our_params, ref_params, rtol=0, atol=0)
    assert_same(ours.state_dict(), ref.state_dict(), rtol=0, atol=0)
    assert type(ours.state_dict()["state"][0]["step"]) is int
    assert_same(params, [p.detach() for p in ref_params])
    assert [int(state.step[i]) for i in range(2)] == [ref.state[p]["step"] for p in ref_params]
    for i, p in enumerate(ref_params):
        assert_same(
            [state.exp_avg[i], state.exp_avg_sq[i]], [ref.state[p]["exp_avg"], ref.state[p]["exp_avg_sq"]]
        )


def test_embedding_training_matches_torch():
    """nn.Embedding(sparse=True), the layer SparseAdam is meant for, with a dense layer
    on SparseAdam's sibling (Adam): both optimizers' results equal torch's."""

    def train(lib):
        torch.manual_seed(0)
        emb, head = torch.nn.Embedding(20, 4, sparse=True), torch.nn.Linear(4, 1)
        sparse_opt = lib.SparseAdam(emb.parameters(), lr=0.05)
        dense_opt = torch.optim.Adam(head.parameters(), lr=0.05)
        gen = torch.Generator().manual_seed(1)
        for _ in range(6):
            idx = torch.randint(0, 20, (8,), generator=gen)
            y = torch.randn(8, 1, generator=gen)
            sparse_opt.zero_grad()
            dense_opt.zero_grad()
            torch.nn.functional.mse_loss(head(emb(idx)), y).backward()
            sparse_opt.step()
            dense_opt.step()
        return [emb.weight.detach(), head.weight.detach()], sparse_opt.state_dict()

    assert_same(train(fo), train(torch.optim), rtol=0, atol=0)


@pytest.mark.parametrize("direction", ["funcopt->torch", "torch->funcopt"])
def test_state_dict_loads_both_ways(direction):
    gen = torch.Generator().manual_seed(0)
    base = [torch.randn(6, 3, generator=gen)]
    grads = [[sparse_grad((6, 3), gen)] for _ in range(4)]
    src_cls, dst_cls = fo.SparseAdam, torch.optim.SparseAdam
    if direction == "torch->funcopt":
        src_cls, dst_cls = dst_cls, src_cls
    p = base[0].clone().requires_grad_()
    src = src_cls([p], lr=0.01)
    for g in grads[:2]:
        p.grad = g[0].clone()
        src.step()
    buffer = io.BytesIO()
    torch.save(src.state_dict(), buffer)
    buffer.seek(0)
    q = p.detach().clone().requires_grad_()
    dst = dst_cls([q], lr=0.5)  # the hyperparameters come from the checkpoint
    dst.load_state_dict(torch.load(buffer))  # weights_only
    assert type(dst.state[q]["step"]) is int
    for g in grads[2:]:
        p.grad, q.grad = g[0].clone(), g[0].clone()
        src.step()
        dst.step()
    assert_same(q, p, rtol=0, atol=0)
    assert_same(dst.state_dict(), src.state_dict(), rtol=0, atol=0)


def test_dense_gradient_raises_torchs_error_before_any_change():
    msg = "SparseAdam does not support dense gradients, please consider Adam instead"
    gen = torch.Generator().manual_seed(0)
    a, b = torch.nn.Parameter(torch.randn(4)), torch.nn.Parameter(torch.randn(3))
    a.grad, b.grad = sparse_grad((4,), gen), torch.randn(3)
    with pytest.raises(RuntimeError, match=msg):
        torch.optim.SparseAdam([a, b]).step()
    before = a.detach().clone()
    opt = fo.SparseAdam([a, b])
    with pytest.raises(RuntimeError, match=msg):
        opt.step()
    assert torch.equal(a.detach(), before)
    tx = fo.sparse_adam()
    with pytest.raises(RuntimeError, match=msg):
        tx.update([torch.randn(3)], tx.init([torch.zeros(3)]))


@pytest.mark.parametrize(
    "params,kwargs,message",
    [
        ([torch.zeros(3).to_sparse()], {}, "SparseAdam requires dense parameter tensors"),
        ([torch.zeros(3, dtype=torch.complex64)], {}, "SparseAdam does not support complex parameters"),
        ([torch.zeros(3)], {"lr": 0.0}, "Invalid learning rate: 0.0"),
        ([torch.zeros(3)], {"eps": 0.0}, "Invalid epsilon value: 0.0"),
        ([torch.zeros(3)], {"betas": (0.9, 1.0)}, "Invalid beta parameter at index 1: 1.0"),
    ],
)
def test_construction_errors_as_torch(params, kwargs, message):
    for cls in (torch.optim.SparseAdam, fo.SparseAdam):
        with pytest.raises(ValueError, match=message):
            cls(params, **kwargs)
    if kwargs:
        with pytest.raises(ValueError, match=message):
            fo.sparse_adam(**kwargs)


def test_functional_update_is_pure_and_sparse():
    """No input is mutated; the updates are sparse (the entries the gradients hold), and
    an update without params gives the same, bit for bit."""
    gen = torch.Generator().manual_seed(0)
    params = {"e": torch.randn(6, 3, generator=gen)}
    tx = fo.sparse_adam(lr=0.05)
    state = tx.update({"e": sparse_grad((6, 3), gen)}, tx.init(params), params)[1]
    grads = {"e": sparse_grad((6, 3), gen, duplicates=True)}
    inputs = (params, state)
    snapshot = optree.tree_map(torch.clone, inputs)
    updates, new_state = tx.update(grads, state, params)
    assert updates["e"].is_sparse
    for a, b in zip(optree.tree_leaves(inputs), optree.tree_leaves(snapshot)):
        assert torch.equal(a, b)
    without = tx.update(grads, state)
    assert_same(
        [u.to_dense() for u in without[0].values()], [u.to_dense() for u in updates.values()], rtol=0, atol=0
    )
    assert_same(list(without[1]), list(new_state), rtol=0, atol=0)
    untouched = (grads["e"].coalesce().to_dense() == 0).all(dim=1)
    assert (fo.apply_updates(params, updates)["e"][untouched] == params["e"][untouched]).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_tensor_hyperparameters_equal_floats(dtype):
    gen = torch.Generator().manual_seed(0)
    base = [torch.randn(5, 2, generator=gen)]
    grad_steps = [[sparse_grad((5, 2), gen)] for _ in range(4)]
    floats = {"lr": 0.05, "betas": (0.8, 0.9), "eps": 1e-3}
    tensors = {
        "lr": torch.tensor(0.05, dtype=dtype),
        "betas": (torch.tensor(0.8, dtype=dtype), torch.tensor(0.9, dtype=dtype)),
        "eps": torch.tensor(1e-3, dtype=dtype),
    }
    results = []
    for kwargs in (floats, tensors):
        tx = fo.sparse_adam(**kwargs)
        params, state = list(base), tx.init(list(base))
        for grads in grad_steps:
            updates, state = tx.update(grads, state, params)
            params = fo.apply_updates(params, updates)
        results.append((params, list(state)))
    assert_same(results[1], results[0])  # dtypes too: a float64 hyperparameter promotes nothing


def test_scheduled_lr_matches_torch_with_lambda_lr():
    gen = torch.Generator().manual_seed(0)
    w0 = torch.randn(6, 2, generator=gen, dtype=torch.float64)
    grads = [sparse_grad((6, 2), gen, torch.float64) for _ in range(5)]
    schedule = fo.linear_schedule(0.1, 0.01, transition_steps=4)
    p = torch.nn.Parameter(w0.clone())
    opt = torch.optim.SparseAdam([p], lr=0.1)
    lambda_lr = torch.optim.lr_scheduler.LambdaLR(opt, lambda count: schedule(count) / 0.1)
    for g in grads:
        p.grad = g.clone()
        opt.step()
        lambda_lr.step()
    tx = fo.sparse_adam(lr=lambda count: 0.1 * (schedule(count) / 0.1))
    params, state = [w0.clone()], tx.init([w0])
    for g in grads:
        updates, state = tx.update([g], state, params)
        params = fo.apply_updates(params, updates)
    torch.testing.assert_close(params[0], p.detach(), rtol=1e-12, atol=1e-12)


def test_state_saves_and_transformation_pickles():
    gen = torch.Generator().manual_seed(0)
    params = [torch.randn(4, 2, generator=gen)]
    tx = fo.sparse_adam(lr=torch.tensor(0.05))
    state = tx.update([sparse_grad((4, 2), gen)], tx.init(params), params)[1]
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer)  # weights_only
    assert type(loaded) is fo.SparseAdamState
    grads = [sparse_grad((4, 2), gen)]
    a = tx.update(grads, state, params)
    b = pickle.loads(pickle.dumps(tx)).update(grads, loaded, params)
    assert_same(a[0][0].to_dense(), b[0][0].to_dense(), rtol=0, atol=0)
    assert_same(list(a[1]), list(b[1]), rtol=0, atol=0)
