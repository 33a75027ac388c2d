"""What is particular to Rprop: per-element step sizes that start at each group's lr and
are clamped to step_sizes, pairs of hyperparameters (etas, step_sizes), torch's eta check,
and a step that follows only the signs of the gradients."""

from __future__ import annotations

import pytest
import torch
from helpers import assert_matches_torch, assert_same, compiled_and_eager_steps
from torch.func import grad, vmap

import funcopt as fo


def _steps(base, n, seed=1):
    gen = torch.Generator().manual_seed(seed)
    return [[torch.randn(p.shape, generator=gen, dtype=p.dtype) for p in base] for _ in range(n)]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"lr": 0.1, "step_sizes": (0.05, 0.15)},  # both clamps act
        {"lr": 0.1, "etas": (0.3, 1.7), "step_sizes": (0.02, 0.2), "maximize": True},
        {"lr": torch.tensor(0.1), "etas": torch.tensor([0.4, 1.3])},
    ],
    ids=["clamped", "maximize", "tensors"],
)
def test_clamped_step_sizes_and_pairs_match_torch(kwargs):
    """Step sizes that hit both bounds, and etas given as one tensor of two (torch
    unpacks it), for real and complex params."""
    gen = torch.Generator().manual_seed(0)
    base = [torch.randn(6, 5, generator=gen), torch.randn(7, generator=gen, dtype=torch.complex64)]
    assert_matches_torch("Rprop", kwargs, base, _steps(base, 8))


def test_step_size_starts_at_each_groups_lr():
    """torch fills step_size with the lr of the param's group (also one added later, and a
    tensor lr), not the constructor's."""

    def run(cls):
        torch.manual_seed(0)
        a, b, c = (torch.nn.Parameter(torch.randn(3)) for _ in range(3))
        z = torch.nn.Parameter(torch.randn(2, dtype=torch.complex64))
        opt = cls([{"params": [a, z]}, {"params": [b], "lr": 0.3}], lr=0.01)
        opt.add_param_group({"params": [c], "lr": torch.tensor(0.2)})
        for _ in range(3):
            for p in (a, b, c, z):
                p.grad = torch.randn_like(p)
            opt.step()
        return [a, b, c, z], opt.state_dict()["state"]

    ours, theirs = run(fo.Rprop), run(torch.optim.Rprop)
    assert_same(ours, theirs, rtol=0, atol=0)


def test_lr_is_read_only_at_init():
    """As in torch, a later lr (a scheduler's) changes nothing: only the initial step sizes
    come from it."""
    params = {"w": torch.tensor([1.0, -2.0, 3.0])}
    grads = {"w": torch.tensor([0.5, -0.5, 0.0])}
    state = fo.rprop(lr=0.1).init(params)
    u1, _ = fo.rprop(lr=0.1).update(grads, state, params)
    u2, _ = fo.rprop(lr=5.0).update(grads, state, params)
    assert_same(u1, u2, rtol=0, atol=0)
    assert_same(u1["w"], torch.tensor([-0.1, 0.1, 0.0]))


@pytest.mark.parametrize("etas", [(1.0, 0.5), (0.0, 1.2), (0.5, 1.0), (float("nan"), 1.2)])
def test_invalid_etas(etas):
    message = f"^Invalid eta values: {etas[0]}, {etas[1]}$"
    with pytest.raises(ValueError, match=message):
        torch.optim.Rprop([torch.nn.Parameter(torch.ones(1))], etas=etas)
    with pytest.raises(ValueError, match=message):
        fo.Rprop([torch.nn.Parameter(torch.ones(1))], etas=etas)
    with pytest.raises(ValueError, match=message):
        fo.rprop(etas=etas)


@pytest.mark.parametrize("key", ["etas", "step_sizes"])
@pytest.mark.parametrize("value", [(0.5, 1.2, 2.0), 0.5, torch.tensor([0.5, 1.2, 2.0])])
def test_pairs_that_are_not_pairs(key, value):
    """torch fails at the first step with an unpacking error; funcopt says what is wrong
    when the optimizer is made."""
    for make in (
        lambda: fo.Rprop([torch.nn.Parameter(torch.ones(1))], **{key: value}),
        lambda: fo.rprop(**{key: value}),
    ):
        with pytest.raises(ValueError, match=f"{key} must be a pair of numbers or 0-d tensors"):
            make()


_GEN = torch.Generator().manual_seed(2)
_W = torch.randn(4, 3, generator=_GEN, dtype=torch.float64)
_X = torch.randn(16, 4, generator=_GEN, dtype=torch.float64)
_Y = torch.randn(16, 3, generator=_GEN, dtype=torch.float64)


def _loss(p):
    return ((_X @ p["w"]).tanh() - _Y).pow(2).mean()


def _run(low, high, etaminus=0.4, lr=0.1, steps=4):
    tx = fo.rprop(lr=lr, etas=(etaminus, 1.3), step_sizes=(low, high))
    adapted, _, _ = fo.inner_loop(_loss, {"w": _W}, tx, [()] * steps)
    return _loss(adapted)


@pytest.mark.parametrize("which", [0, 1])
def test_step_size_bounds_hypergradients_match_finite_differences(which):
    """The clamps are differentiable in their bounds (each acts in these four steps)."""
    bounds = [torch.tensor(0.06, dtype=torch.float64), torch.tensor(0.12, dtype=torch.float64)]

    def f(v):
        return _run(*[v if i == which else b for i, b in enumerate(bounds)])

    eps = 1e-7
    fd = (f(bounds[which] + eps) - f(bounds[which] - eps)) / (2 * eps)
    g = grad(f)(bounds[which])
    torch.testing.assert_close(g, fd, rtol=1e-5, atol=1e-8)
    assert g.abs() > 0


def test_vmap_over_step_sizes_and_etas_equals_loop():
    highs = torch.tensor([0.11, 0.12, 0.2], dtype=torch.float64)
    etaminus = torch.tensor([0.3, 0.4, 0.5], dtype=torch.float64)
    f = lambda high, em: _run(0.06, high, em)  # noqa: E731
    batched = vmap(f)(highs, etaminus)
    loop = torch.stack([f(h, e) for h, e in zip(highs, etaminus)])
    torch.testing.assert_close(batched, loop, rtol=1e-12, atol=1e-14)
    assert len(set(loop.tolist())) == 3


def test_compiled_update_compiles_once():
    torch.manual_seed(0)
    params = {"w": torch.randn(4, 3), "b": torch.randn(3)}
    grads_seq = [{k: torch.randn_like(v) for k, v in params.items()} for _ in range(4)]
    tx = fo.rprop(lr=0.1, etas=(0.4, 1.5), step_sizes=(0.05, 0.2), maximize=True)
    (comp_p, comp_s), (eager_p, eager_s) = compiled_and_eager_steps(tx, params, grads_seq)
    assert_same(comp_p, eager_p)
    assert_same(list(comp_s), list(eager_s))
