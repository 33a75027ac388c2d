"""Lion (funcopt/_src/algorithms/lion.py), an algorithm with no torch.optim twin, built with
the public way to write one: `fo.lion` against optax's, `fo.Lion` against the authors'
PyTorch code and timm's step (written out below), and every face of it against the others."""

from __future__ import annotations

import copy
import pickle

import optree
import pytest
import torch
from torch.func import grad, vmap

import funcopt as fo


def reference_step(params, grads, exp_avgs, lr, betas, weight_decay):
    """One step of timm's Lion (timm/optim/lion.py, ``_single_tensor_lion``), the class's
    reference: its interpolations are ``lerp``s."""
    beta1, beta2 = betas
    for p, g, exp_avg in zip(params, grads, exp_avgs):
        p.mul_(1 - lr * weight_decay)
        update = exp_avg.lerp(g, 1 - beta1).sign_()
        p.add_(update, alpha=-lr)
        exp_avg.lerp_(g, 1 - beta2)


def lucidrains_step(params, grads, exp_avgs, lr, betas, weight_decay):
    """One step of lucidrains/lion-pytorch's ``update_fn`` (as the paper's code): the
    same algorithm, its interpolations rounded as a product and a sum."""
    beta1, beta2 = betas
    for p, g, exp_avg in zip(params, grads, exp_avgs):
        p.mul_(1 - lr * weight_decay)
        update = exp_avg.clone().mul_(beta1).add(g, alpha=1 - beta1).sign_()
        p.add_(update, alpha=-lr)
        exp_avg.mul_(beta2).add_(g, alpha=1 - beta2)


def problem(dtype=torch.float64, n=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    shapes = [(4, 3), (3,), (2, 2, 2)][:n]
    params = [torch.randn(s, generator=g, dtype=dtype) for s in shapes]
    grads = [[torch.randn(s, generator=g, dtype=dtype) for s in shapes] for _ in range(20)]
    return params, grads


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("kwargs", [{}, {"weight_decay": 0.1}, {"betas": (0.8, 0.95), "weight_decay": 0.01}])
@pytest.mark.parametrize("flag", [{}, {"foreach": True}, {"foreach": False}])
def test_class_is_timms_step_bit_for_bit(dtype, kwargs, flag):
    params, grads = problem(dtype)
    ours = [torch.nn.Parameter(p.clone()) for p in params]
    theirs = [p.clone() for p in params]
    opt = fo.Lion(ours, lr=0.01, **kwargs, **flag)
    exp_avgs = [torch.zeros_like(p) for p in theirs]
    for gs in grads:
        for p, g in zip(ours, gs):
            p.grad = g.clone()
        opt.step()
        reference_step(
            theirs, gs, exp_avgs, 0.01, kwargs.get("betas", (0.9, 0.99)), kwargs.get("weight_decay", 0.0)
        )
    for p, q, m in zip(ours, theirs, exp_avgs):
        torch.testing.assert_close(p.detach(), q, rtol=0, atol=0)
        torch.testing.assert_close(opt.state[p]["exp_avg"], m, rtol=0, atol=0)


def test_class_is_lucidrains_code_to_round_off():
    """The paper's rounding (a product and a sum where timm lerps): float64 round-off."""
    params, grads = problem(torch.float64)
    ours = [torch.nn.Parameter(p.clone()) for p in params]
    theirs = [p.clone() for p in params]
    opt = fo.Lion(ours, lr=0.01, weight_decay=0.1)
    exp_avgs = [torch.zeros_like(p) for p in theirs]
    for gs in grads:
        for p, g in zip(ours, gs):
            p.grad = g.clone()
        opt.step()
        lucidrains_step(theirs, gs, exp_avgs, 0.01, (0.9, 0.99), 0.1)
    for p, q, m in zip(ours, theirs, exp_avgs):
        torch.testing.assert_close(p.detach(), q, rtol=1e-13, atol=1e-15)
        torch.testing.assert_close(opt.state[p]["exp_avg"], m, rtol=1e-13, atol=1e-15)


def test_maximize_and_fused_agree_with_the_default_step():
    params, grads = problem(torch.float32)
    runs = {}
    for name, flags in {
        "default": {},
        "fused": {"fused": True},
    }.items():
        ps = [torch.nn.Parameter(p.clone()) for p in params]
        opt = fo.Lion(ps, lr=0.01, weight_decay=0.1, **flags)
        for gs in grads[:5]:
            for p, g in zip(ps, gs):
                p.grad = g.clone()
            opt.step()
        runs[name] = [p.detach() for p in ps]
    torch.testing.assert_close(runs["fused"], runs["default"], rtol=1e-6, atol=1e-6)
    ps = [torch.nn.Parameter(p.clone()) for p in params]
    neg = [torch.nn.Parameter(p.clone()) for p in params]
    a, b = fo.Lion(ps, lr=0.01, maximize=True), fo.Lion(neg, lr=0.01)
    for p, q, g in zip(ps, neg, grads[0]):
        p.grad, q.grad = g.clone(), -g
    a.step()
    b.step()
    torch.testing.assert_close(ps, neg, rtol=0, atol=0)


def optax_run(params, grads, **kwargs):
    jax = pytest.importorskip("jax")
    optax = pytest.importorskip("optax")
    import numpy as np

    jax.config.update("jax_enable_x64", True)
    tx = optax.lion(**kwargs)
    jparams = [jax.numpy.asarray(p.numpy()) for p in params]
    state = tx.init(jparams)
    for gs in grads:
        updates, state = tx.update([jax.numpy.asarray(g.numpy()) for g in gs], state, jparams)
        jparams = optax.apply_updates(jparams, updates)
    return [torch.from_numpy(np.array(p)) for p in jparams]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"learning_rate": 0.01},
        {"learning_rate": 0.003, "b1": 0.8, "b2": 0.9, "weight_decay": 0.1},
        {"learning_rate": 0.01, "weight_decay": 0.5, "mask": [True, False, True]},
    ],
)
def test_pure_form_is_optax_lion(kwargs):
    params, grads = problem(torch.float64)
    tx = fo.lion(**kwargs)
    state = tx.init(params)
    ours = params
    for gs in grads:
        updates, state = tx.update(gs, state, ours)
        ours = fo.apply_updates(ours, updates)
    torch.testing.assert_close(ours, optax_run(params, grads, **kwargs), rtol=1e-9, atol=1e-12)


def test_pure_form_with_a_schedule_is_optax_lion():
    params, grads = problem(torch.float64)
    optax = pytest.importorskip("optax")
    ours_tx = fo.lion(learning_rate=fo.linear_schedule(0.01, 0.001, 10))
    state = ours_tx.init(params)
    ours = params
    for gs in grads:
        updates, state = ours_tx.update(gs, state, ours)
        ours = fo.apply_updates(ours, updates)
    jnp = pytest.importorskip("jax.numpy")

    def schedule(count):  # optax.linear_schedule's, with the count in float64 (optax's divides an int32)
        return 0.01 + (0.001 - 0.01) * jnp.minimum(count.astype(jnp.float64), 10.0) / 10.0

    assert float(optax.linear_schedule(0.01, 0.001, 10)(3)) == pytest.approx(
        float(schedule(jnp.asarray(3))), rel=1e-6
    )
    theirs = optax_run(params, grads, learning_rate=schedule)
    torch.testing.assert_close(ours, theirs, rtol=1e-9, atol=1e-12)


def test_pure_form_and_class_agree():
    params, grads = problem(torch.float64)
    ps = [torch.nn.Parameter(p.clone()) for p in params]
    opt = fo.Lion(ps, lr=0.01, betas=(0.8, 0.9), weight_decay=0.1)
    tx = fo.lion(learning_rate=0.01, b1=0.8, b2=0.9, weight_decay=0.1)
    state, ours = tx.init(params), params
    for gs in grads:
        for p, g in zip(ps, gs):
            p.grad = g.clone()
        opt.step()
        updates, state = tx.update(gs, state, ours)
        ours = fo.apply_updates(ours, updates)
    torch.testing.assert_close([p.detach() for p in ps], ours, rtol=1e-12, atol=1e-14)
    converted = fo.functional_state(opt, ps)
    assert type(converted) is fo.LionState
    torch.testing.assert_close(converted.exp_avg, state.exp_avg, rtol=1e-12, atol=1e-14)


def test_state_dict_round_trip_and_pickle():
    params, grads = problem(torch.float32)
    a = [torch.nn.Parameter(p.clone()) for p in params]
    opt = fo.Lion(a, lr=0.01, weight_decay=0.1)
    for p, g in zip(a, grads[0]):
        p.grad = g.clone()
    opt.step()
    b = [torch.nn.Parameter(p.detach().clone()) for p in a]
    twin = fo.Lion(b, lr=0.5)
    twin.load_state_dict(copy.deepcopy(opt.state_dict()))
    copy_ = pickle.loads(pickle.dumps(opt))
    for o, ps in ((opt, a), (twin, b), (copy_, copy_.param_groups[0]["params"])):
        for p, g in zip(ps, grads[1]):
            p.grad = g.clone()
        o.step()
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    torch.testing.assert_close(a, copy_.param_groups[0]["params"], rtol=0, atol=0)
    tx = fo.lion(learning_rate=0.1)
    assert b"_src" not in pickle.dumps(tx)


def test_bad_hyperparameters_raise():
    params = [torch.zeros(2, requires_grad=True)]
    with pytest.raises(ValueError, match="Invalid learning rate"):
        fo.Lion(params, lr=-1.0)
    with pytest.raises(ValueError, match="Invalid beta parameter at index 1"):
        fo.Lion(params, betas=(0.9, 1.0))
    with pytest.raises(ValueError, match="Invalid weight_decay"):
        fo.lion(learning_rate=0.1, weight_decay=-0.1)
    with pytest.raises(ValueError, match="mu_dtype"):
        fo.lion(learning_rate=0.1, mu_dtype=torch.bfloat16)


def test_torch_func_transforms():
    """Differentiable in the lr through the pure form (the sign has zero derivative, so
    the hypergradient flows through the step size), batched over lrs, compiled in one graph."""
    params, grads = problem(torch.float64, n=2)
    lrs = torch.tensor([0.01, 0.02, 0.05], dtype=torch.float64)

    def final(lr):
        tx = fo.lion(learning_rate=lr, weight_decay=0.1)
        state, ps = tx.init(params), params
        for gs in grads[:3]:
            updates, state = tx.update(gs, state, ps)
            ps = fo.apply_updates(ps, updates)
        return sum(p.sum() for p in ps)

    batched = vmap(final)(lrs)
    looped = torch.stack([final(lr) for lr in lrs])
    torch.testing.assert_close(batched, looped, rtol=1e-12, atol=1e-12)
    g = grad(final)(lrs[0])
    eps = 1e-6
    numeric = (final(lrs[0] + eps) - final(lrs[0] - eps)) / (2 * eps)
    torch.testing.assert_close(g, numeric, rtol=1e-5, atol=1e-8)
    tx = fo.lion(learning_rate=0.01)
    state = tx.init(params)
    compiled = torch.compile(tx.update, fullgraph=True)
    expected = tx.update(grads[0], state, params)
    got = compiled(grads[0], state, params)
    torch.testing.assert_close(optree.tree_leaves(got), optree.tree_leaves(expected))
