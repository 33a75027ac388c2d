"""What is particular to RMSprop: torch keeps a momentum_buffer only with a momentum and a
grad_avg only when centered (keys read from each param group's options), and the
centered variance estimate."""

from __future__ import annotations

import pytest
import torch
from helpers import assert_matches_torch, assert_same, compiled_and_eager_steps
from torch.func import grad, vmap

import funcopt as fo

OPTIONS = [
    {},
    {"momentum": 0.9},
    {"centered": True},
    {"momentum": 0.5, "centered": True, "weight_decay": 0.1, "maximize": True},
]


@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: "-".join(o) or "default")
def test_state_keys_and_steps_as_torch(options):
    """The adapter's state has torch's keys (an absent buffer: no key) and steps as torch
    does, bit for bit; the functional state holds an empty node for an absent buffer."""
    gen = torch.Generator().manual_seed(0)
    base = [torch.randn(4, 3, generator=gen), torch.randn(5, generator=gen, dtype=torch.complex64)]
    steps = [[torch.randn(p.shape, generator=gen, dtype=p.dtype) for p in base] for _ in range(4)]
    assert_matches_torch("RMSprop", {"lr": 0.01, "alpha": 0.9, **options}, base, steps)
    opt = fo.RMSprop([torch.nn.Parameter(base[0].clone())], **options)
    opt.param_groups[0]["params"][0].grad = steps[0][0]
    opt.step()
    expected = (
        ["step", "square_avg"]
        + ["momentum_buffer"] * bool(options.get("momentum"))
        + ["grad_avg"] * bool(options.get("centered"))
    )
    assert list(opt.state_dict()["state"][0]) == expected
    state = fo.rmsprop(**{k: v for k, v in options.items() if k != "maximize"}).init({"w": base[0]})
    for field in ("momentum_buffer", "grad_avg"):
        assert isinstance(getattr(state, field)["w"], fo.MaskedNode) == (field not in expected)


def test_complex_weight_decay_as_torch_foreach():
    """funcopt decays a complex param's gradient on its real view (one fused multiply-add),
    as torch's foreach step does, bit for bit; torch's single-tensor step decays it in
    complex arithmetic (wd * p rounded, then added). Where g + wd * p cancels, the first
    step, g / (0.1 |g| + eps), makes that one rounding visible: here within 1e-4."""
    gen = torch.Generator().manual_seed(0)
    base = [torch.randn(2, 2048, generator=gen, dtype=torch.complex64)]
    g = torch.randn(2, 2048, generator=gen, dtype=torch.complex64)
    params = {}
    for cls, kwargs in [
        (fo.RMSprop, {}),
        (torch.optim.RMSprop, {"foreach": True}),
        (torch.optim.RMSprop, {}),
    ]:
        p = base[0].clone().requires_grad_()
        p.grad = g.clone()
        cls([p], weight_decay=0.1, **kwargs).step()
        params[cls, "foreach" in kwargs] = p.detach()
    assert_same(params[fo.RMSprop, False], params[torch.optim.RMSprop, True], rtol=0, atol=0)
    assert_same(params[fo.RMSprop, False], params[torch.optim.RMSprop, False], rtol=1e-4, atol=1e-4)


def test_param_groups_with_their_own_momentum_and_centered():
    """Each group's momentum and centered decide its params' keys, as torch's
    _init_group reads them from the group, not from the constructor's defaults."""

    def run(cls):
        torch.manual_seed(0)
        a, b, c = (torch.nn.Parameter(torch.randn(3)) for _ in range(3))
        opt = cls([{"params": [a]}, {"params": [b], "momentum": 0.9, "centered": True}], lr=0.01)
        opt.add_param_group({"params": [c], "centered": True})
        for _ in range(3):
            for p in (a, b, c):
                p.grad = torch.randn(3)
            opt.step()
        return [a, b, c], opt.state_dict()

    ours, theirs = run(fo.RMSprop), run(torch.optim.RMSprop)
    assert [list(s) for s in ours[1]["state"].values()] == [list(s) for s in theirs[1]["state"].values()]
    assert_same(ours, theirs, rtol=0, atol=0)


def test_tensor_momentum_keeps_a_buffer():
    """The functional factory never reads a tensor momentum: it keeps a momentum_buffer,
    and a momentum of 0 then gives the result of none."""
    params = {"w": torch.tensor([1.0, -2.0])}
    grads = {"w": torch.tensor([0.5, 0.25])}
    tx = fo.rmsprop(lr=0.1, momentum=torch.tensor(0.0))
    updates, state = tx.update(grads, tx.init(params), params)
    assert isinstance(state.momentum_buffer["w"], torch.Tensor)
    expected, _ = fo.rmsprop(lr=0.1).update(grads, fo.rmsprop(lr=0.1).init(params), params)
    assert_same(updates, expected)


_GEN = torch.Generator().manual_seed(1)
_W = torch.randn(4, 3, generator=_GEN, dtype=torch.float64)
_X = torch.randn(8, 4, generator=_GEN, dtype=torch.float64)


def _loss(p):
    return (_X @ p["w"]).tanh().pow(2).sum()


def _centered_run(hp, steps=4):
    adapted, _, _ = fo.inner_loop(_loss, {"w": _W}, fo.rmsprop(centered=True, **hp), [()] * steps)
    return _loss(adapted)


@pytest.mark.parametrize("key", ["alpha", "momentum", "eps"])
def test_centered_hypergradients_match_finite_differences(key):
    hp = {"lr": 0.01, "alpha": 0.8, "momentum": 0.5, "eps": 1e-3, "weight_decay": 0.05}
    value = torch.tensor(hp[key], dtype=torch.float64)
    f = lambda v: _centered_run({**hp, key: v})  # noqa: E731
    eps = 1e-6
    fd = (f(value + eps) - f(value - eps)) / (2 * eps)
    g = grad(f)(value)
    torch.testing.assert_close(g, fd, rtol=1e-5, atol=1e-8)
    assert g.abs() > 0


def test_vmap_over_alpha_equals_loop():
    alphas = torch.tensor([0.5, 0.8, 0.99], dtype=torch.float64)
    f = lambda a: _centered_run({"lr": 0.01, "alpha": a, "momentum": 0.5})  # noqa: E731
    torch.testing.assert_close(vmap(f)(alphas), torch.stack([f(a) for a in alphas]), rtol=1e-10, atol=1e-12)


def test_compiled_update_compiles_once():
    """torch.compile(fullgraph=True) of a centered step with momentum: one graph for all
    steps, and the eager result."""
    torch.manual_seed(0)
    params = {"w": torch.randn(4, 3), "b": torch.randn(3)}
    grads_seq = [{k: torch.randn_like(v) for k, v in params.items()} for _ in range(3)]
    tx = fo.rmsprop(lr=0.01, momentum=0.9, centered=True, weight_decay=0.1)
    (comp_p, comp_s), (eager_p, eager_s) = compiled_and_eager_steps(tx, params, grads_seq)
    assert_same(comp_p, eager_p)
    assert_same(list(comp_s), list(eager_s))
