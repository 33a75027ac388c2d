"""Differentiating through a funcopt step makes no NaN where a gradient entry is exactly
zero, with the forward values unchanged bit for bit (issue 62).

A ReLU net has dead units, whose gradient entries are exactly 0; torch's derivative of
``sqrt`` at 0 is infinite, and ``0 * inf`` made every meta-gradient of a MAML through
Adam NaN (in torch.optim too). funcopt's functional ops take ``sqrt`` with derivative 0
at 0 (`ops.safe_sqrt`), the convention of a subgradient.
"""

from __future__ import annotations

import pytest
import torch
from helpers import ALGORITHMS, factory, matrices_only, steps_on_dense_gradients
from torch.autograd import forward_ad

import funcopt as fo
from funcopt._src.engine import ops
from funcopt._src.transforms import clipping

TASKS, POINTS, STEPS = 4, 10, 5


def net_params(dtype=torch.float32):
    """A 1-40-40-1 ReLU net whose biases leave many units dead, and a dead 2-D layer
    ``wd`` (its every gradient entry is 0: a whole block for block-wise clipping, a zero
    matrix for Muon)."""
    g = torch.Generator().manual_seed(1)
    p = {
        "w1": torch.randn(40, 1, generator=g),
        "b1": torch.randn(40, generator=g) * 0.1 - 0.5,
        "w2": torch.randn(40, 40, generator=g) / 6.3,
        "b2": torch.randn(40, generator=g) * 0.1 - 0.5,
        "w3": torch.randn(1, 40, generator=g) / 6.3,
        "b3": torch.zeros(1),
        "wd": torch.randn(3, 40, generator=g),
    }
    return {k: v.to(dtype) for k, v in p.items()}


def loss_fn(p, x, y):
    h = torch.relu(x @ p["w1"].T + p["b1"])
    h = torch.relu(h @ p["w2"].T + p["b2"])
    dead = torch.relu(h @ p["wd"].T.abs().neg() - 1.0).sum(-1, keepdim=True)  # always 0
    return ((h @ p["w3"].T + p["b3"] + dead - y) ** 2).mean()


def tasks(dtype=torch.float32):
    xs = torch.linspace(-5, 5, POINTS, dtype=dtype).reshape(1, POINTS, 1).expand(TASKS, POINTS, 1)
    return xs, torch.sin(xs + torch.arange(TASKS, dtype=dtype).reshape(TASKS, 1, 1))


def transform(name):
    """The functional form of `name` (an algorithm class, or a transform chain) at its
    defaults and no weight decay (which would make the zero gradient entries nonzero)."""
    if name in ALGORITHMS:
        tx = factory(name)(lr=1e-2)
        if matrices_only(name):  # Muon: the matrices; Adam the rest
            labels = {k: "m" if k in ("w2", "wd") else "a" for k in net_params()}
            tx = fo.partition({"m": tx, "a": fo.adam(lr=1e-2)}, labels)
        return tx
    return fo.chain(TRANSFORMS[name](), fo.sgd(lr=1e-2))


TRANSFORMS = {
    "scale_by_adam": fo.scale_by_adam,
    "scale_by_adam_nesterov": lambda: fo.scale_by_adam(nesterov=True),
    "scale_by_rms": fo.scale_by_rms,
    "scale_by_rms_eps_outside": lambda: fo.scale_by_rms(eps_in_sqrt=False, bias_correction=True),
    "clip_by_block_rms": lambda: fo.clip_by_block_rms(1.0),
    "clip_by_global_norm": lambda: fo.clip_by_global_norm(1.0),
    "adaptive_grad_clip": lambda: fo.adaptive_grad_clip(0.1),
    "clip": lambda: fo.clip(0.1),
}
NAMES = [n for n in ALGORITHMS if steps_on_dense_gradients(n)] + list(TRANSFORMS)
# the steps that take a root of a second moment, or of a block's mean square, that may be
# 0 (Muon's chain has Adam; scale_by_rms adds its eps inside the root)
ROOTS = {"Adagrad", "Adam", "AdamW", "Muon", "NAdam", "RAdam", "RMSprop", "scale_by_adam",
         "scale_by_adam_nesterov", "scale_by_rms_eps_outside", "clip_by_block_rms"}  # fmt: skip


def maml(tx, dtype=torch.float32):
    """The meta-gradient and meta-loss of MAML: `STEPS` inner steps through
    fo.inner_loop, vmapped over the tasks, differentiated with torch.func.grad."""
    xs, ys = tasks(dtype)

    def task(p, x, y):
        adapted, _, _ = fo.inner_loop(loss_fn, p, tx, [(x, y)] * STEPS)
        return loss_fn(adapted, x, y)

    def outer(p):
        return torch.func.vmap(task, in_dims=(None, 0, 0))(p, xs, ys).mean()

    return torch.func.grad_and_value(outer)(net_params(dtype))


@pytest.fixture
def torch_sqrt(monkeypatch):
    """Puts torch's sqrt back in the functional ops (the formula before issue 62)."""

    def apply():
        monkeypatch.setattr(ops.Pure, "sqrt", staticmethod(torch.sqrt))
        monkeypatch.setattr(ops.Pure, "sqrt_", staticmethod(torch.sqrt))
        lists = staticmethod(ops._foreach(torch._foreach_sqrt))
        monkeypatch.setattr(ops.PureForEach, "sqrt", lists)
        monkeypatch.setattr(ops.PureForEach, "sqrt_", lists)
        monkeypatch.setattr(clipping, "safe_sqrt", torch.sqrt)

    return apply


def finite(tree):
    return all(torch.isfinite(t).all() for t in tree.values())


def test_the_net_has_zero_gradient_entries():
    """What the tests below rely on: dead units give exactly-zero gradient entries."""
    xs, ys = tasks()
    g = torch.func.grad(loss_fn)(net_params(), xs[0], ys[0])
    assert (g["b1"] == 0).any() and (g["w2"] == 0).any() and (g["wd"] == 0).all()


@pytest.mark.parametrize("name", NAMES)
def test_maml_meta_gradients_are_finite_and_forward_unchanged(name, torch_sqrt):
    tx = transform(name)
    meta_grad, meta_loss = maml(tx)
    assert torch.isfinite(meta_loss)
    assert finite(meta_grad), {k: int(torch.isnan(v).sum()) for k, v in meta_grad.items()}
    torch_sqrt()
    old_grad, old_loss = maml(tx)
    assert torch.equal(meta_loss, old_loss)  # the forward pass, bit for bit
    if name in ROOTS:
        assert not finite(old_grad)  # what it was: NaN
    else:  # where torch's sqrt made no NaN, the same meta-gradient, bit for bit
        for k in meta_grad:
            assert torch.equal(meta_grad[k], old_grad[k]), k


@pytest.mark.parametrize("name", ["Adam", "RMSprop", "NAdam"])
def test_adapted_params_unchanged_bit_for_bit(name, torch_sqrt):
    """The inner loop's results, every step's loss, the params and the state, are those
    of torch's sqrt, in the vmapped functional path (`Pure`) and where plain autograd
    records (`PureForEach`, params that require grad)."""
    xs, ys = tasks()

    def run(params, vmapped):
        def task(x, y):
            return fo.inner_loop(loss_fn, params, transform(name), [(x, y)] * STEPS)

        return torch.func.vmap(task)(xs, ys) if vmapped else task(xs[0], ys[0])

    params = {k: v.requires_grad_() for k, v in net_params().items()}
    new = [run(params, vmapped) for vmapped in (True, False)]
    torch_sqrt()
    old = [run(params, vmapped) for vmapped in (True, False)]
    for a, b in zip(torch.utils._pytree.tree_leaves(new), torch.utils._pytree.tree_leaves(old)):
        assert torch.equal(a, b)


def test_plain_autograd_meta_gradient_is_finite(torch_sqrt):
    """MAML with .backward() (no torch.func around the loop): the `PureForEach` path."""
    xs, ys = tasks()
    params = {k: v.requires_grad_() for k, v in net_params().items()}
    adapted, _, _ = fo.inner_loop(loss_fn, params, fo.adam(lr=1e-2), [(xs[0], ys[0])] * STEPS)
    loss_fn(adapted, xs[0], ys[0]).backward()
    assert all(torch.isfinite(p.grad).all() for p in params.values())
    grads = {k: p.grad for k, p in params.items()}
    torch_sqrt()
    for p in params.values():
        p.grad = None
    adapted, _, _ = fo.inner_loop(loss_fn, params, fo.adam(lr=1e-2), [(xs[0], ys[0])] * STEPS)
    loss_fn(adapted, xs[0], ys[0]).backward()
    assert not all(torch.isfinite(p.grad).all() for p in params.values())
    # where both are finite, they are the same
    for k, p in params.items():
        ok = torch.isfinite(p.grad)
        assert torch.equal(grads[k][ok], p.grad[ok])


def test_forward_mode_hypergradient_is_finite():
    """jvp (torch.func) and forward_ad (dual tensors) through the inner loop, by lr."""
    xs, ys = tasks()
    params = net_params()

    def final_loss(lr):
        adapted, _, _ = fo.inner_loop(loss_fn, params, fo.adam(lr=lr), [(xs[0], ys[0])] * STEPS)
        return loss_fn(adapted, xs[0], ys[0])

    lr = torch.tensor(1e-2)
    _, tangent = torch.func.jvp(final_loss, (lr,), (torch.ones(()),))
    assert torch.isfinite(tangent)
    with forward_ad.dual_level():
        dual = forward_ad.unpack_dual(final_loss(forward_ad.make_dual(lr, torch.ones(()))))
    torch.testing.assert_close(dual.tangent, tangent)


SPECIAL = [0.0, -0.0, 1e-45, 2.25, float("inf"), -1.0, float("nan")]


def test_safe_sqrt_values_and_derivatives():
    """Bit for bit torch.sqrt's values (signed zeros, subnormals, inf, NaN); its first and
    second derivatives are torch's where finite, and 0 at 0."""
    x = torch.tensor(SPECIAL, dtype=torch.float64)
    assert torch.equal(ops.safe_sqrt(x).view(torch.int64), torch.sqrt(x).view(torch.int64))
    lists = ops._sqrt_lists(ops.TensorList([x, x[:2]]))
    assert torch.equal(lists[0].view(torch.int64), torch.sqrt(x).view(torch.int64))
    positive = torch.tensor([1e-3, 0.5, 2.25, 7.0], dtype=torch.float64, requires_grad=True)
    for fn in (ops.safe_sqrt, lambda t: ops._sqrt_lists(ops.TensorList([t]))[0]):
        torch.autograd.gradcheck(fn, (positive,))
        torch.autograd.gradgradcheck(fn, (positive,))
        at_zero = torch.zeros(3, dtype=torch.float64, requires_grad=True)
        (first,) = torch.autograd.grad(fn(at_zero).sum(), at_zero, create_graph=True)
        (second,) = torch.autograd.grad(first.sum(), at_zero)
        assert torch.equal(first, torch.zeros(3, dtype=torch.float64)) and torch.equal(second, first)
    # jvp and vmap of grad, as torch.func takes them
    z = torch.tensor([0.0, 4.0])
    assert torch.equal(torch.func.jvp(ops.safe_sqrt, (z,), (torch.ones(2),))[1], torch.tensor([0.0, 0.25]))
    per_row = torch.func.vmap(torch.func.grad(lambda t: ops.safe_sqrt(t).sum()))(z.reshape(2, 1))
    assert torch.equal(per_row, torch.tensor([[0.0], [0.25]]))


def test_pure_sqrt_guards_only_where_a_derivative_may_be_taken():
    """Plain eager tensors and a vmap alone take torch's sqrt (no guard ops)."""
    x = torch.tensor([0.0, 4.0])
    assert not ops.differentiable(x)
    assert torch.func.vmap(lambda t: torch.tensor(ops.differentiable(t)))(x).tolist() == [False, False]
    assert ops.differentiable(x.clone().requires_grad_())
    assert torch.func.grad(lambda t: (t * ops.differentiable(t)).sum())(x).tolist() == [1.0, 1.0]
    with forward_ad.dual_level():
        assert ops.differentiable(x)
