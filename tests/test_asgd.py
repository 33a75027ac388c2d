"""What is particular to ASGD: the average ``ax`` of the params (a copy of them until t0,
their running mean after), the counters eta and mu (on the param's device, rounded as
torch rounds them), and an update that needs the params."""

from __future__ import annotations

import pytest
import torch
from helpers import assert_matches_torch, assert_same, compiled_and_eager_steps
from torch.func import grad, vmap

import funcopt as fo
from funcopt._src.algorithms.asgd import ASGD_
from funcopt._src.torch.knobs import knobs
from funcopt._src.torch.state import torch_state


def _steps(base, n, seed=1):
    gen = torch.Generator().manual_seed(seed)
    return [[torch.randn(p.shape, generator=gen, dtype=p.dtype) for p in base] for _ in range(n)]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"lr": 0.05, "t0": 3, "lambd": 0.1, "alpha": 0.6},
        {"lr": 0.05, "t0": 0, "weight_decay": 0.1, "maximize": True},
        {"lr": torch.tensor(0.05), "t0": 2.5, "lambd": 0.2},
        {"lr": torch.tensor(0.05, dtype=torch.float64), "t0": 4},
    ],
    ids=["t0=3", "t0=0", "tensor-lr", "float64-lr"],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_average_across_t0_matches_torch(kwargs, dtype):
    """Steps before, at and after t0 (ax a copy of the params, then their running mean):
    the adapter bit for bit, the functional path to round-off, complex params too."""
    gen = torch.Generator().manual_seed(0)
    base = [
        torch.randn(6, 5, generator=gen, dtype=dtype),
        torch.randn(7, generator=gen, dtype=dtype.to_complex()),
    ]
    assert_matches_torch("ASGD", kwargs, base, _steps(base, 8))


def test_update_needs_the_params():
    tx = fo.asgd()
    params = {"w": torch.ones(3)}
    with pytest.raises(ValueError, match="ASGD needs the params, which its update reads: call update"):
        tx.update({"w": torch.ones(3)}, tx.init(params))


def test_eta_starts_at_each_groups_lr():
    def run(cls):
        torch.manual_seed(0)
        a, b, c = (torch.nn.Parameter(torch.randn(3)) for _ in range(3))
        opt = cls([{"params": [a]}, {"params": [b], "lr": 0.3}], lr=0.01, t0=1)
        opt.add_param_group({"params": [c], "lr": torch.tensor(0.2)})
        for _ in range(4):
            for p in (a, b, c):
                p.grad = torch.randn(3)
            opt.step()
        return [a, b, c], opt.state_dict()["state"]

    ours, theirs = run(fo.ASGD), run(torch.optim.ASGD)
    assert_same(ours, theirs, rtol=0, atol=0)


def test_counters_on_the_params_device():
    """torch keeps step, eta and mu on the param's device (the meta device stands in for
    a GPU here), and each as a 0-d tensor of its scalar dtype."""
    p = torch.empty(3, device="meta")
    state = torch_state(ASGD_, p, {"lr": 0.01}, on_device=knobs(ASGD_).counters_on_device, fused=False)
    assert [(k, v.device.type, v.dim()) for k, v in state.items()] == [
        ("step", "meta", 0),
        ("eta", "meta", 0),
        ("mu", "meta", 0),
        ("ax", "meta", 1),
    ]
    q = torch.nn.Parameter(p)
    q.grad = torch.empty_like(p)
    reference = torch.optim.ASGD([q])
    reference._init_group(reference.param_groups[0], [], [], [], [], [], [])  # makes q's state
    assert [(k, v.device.type, v.dim()) for k, v in reference.state[q].items()] == [
        (k, v.device.type, v.dim()) for k, v in state.items()
    ]
    assert fo.asgd().init({"w": p}).eta["w"].device.type == "meta"


def test_float64_counters_after_a_reload_round_as_torchs():
    """After the model is converted to float64 and the state reloaded (torch casts eta and
    mu to float64), torch still rounds each new eta and mu to the default dtype
    (``torch.as_tensor`` of a Python float): so does funcopt, bit for bit."""

    def run(lib):
        torch.manual_seed(0)
        model = torch.nn.Linear(3, 2)
        opt = lib.ASGD(model.parameters(), lr=0.1, t0=1)
        x = torch.randn(4, 3)
        for i in range(5):
            opt.zero_grad()
            model(x.to(model.weight.dtype)).sum().backward()
            opt.step()
            if i == 1:
                model.double()
                opt.load_state_dict(opt.state_dict())
        return list(model.parameters()), opt.state_dict()["state"]

    ours, theirs = run(fo), run(torch.optim)
    assert ours[1][0]["eta"].dtype == torch.float64
    assert_same(ours, theirs, rtol=0, atol=0)


_GEN = torch.Generator().manual_seed(2)
_W = torch.randn(4, 3, generator=_GEN, dtype=torch.float64)
_X = torch.randn(16, 4, generator=_GEN, dtype=torch.float64)


def _loss(p):
    return (_X @ p["w"]).tanh().pow(2).mean()


def _average(t0, lr=0.1, steps=5):
    """The loss at the average of the params after `steps` steps."""
    _, state, _ = fo.inner_loop(_loss, {"w": _W}, fo.asgd(lr=lr, t0=t0), [()] * steps)
    return _loss({"w": state.ax["w"]})


def test_t0_hypergradient_through_the_average_matches_finite_differences():
    t0 = torch.tensor(1.5, dtype=torch.float64)
    eps = 1e-6
    fd = (_average(t0 + eps) - _average(t0 - eps)) / (2 * eps)
    g = grad(_average)(t0)
    torch.testing.assert_close(g, fd, rtol=1e-5, atol=1e-8)
    assert g.abs() > 0


def test_vmap_over_t0_equals_loop():
    """Batched t0: each member switches from copying to averaging at its own step (no
    Python branch on mu)."""
    t0s = torch.tensor([0.0, 1.5, 2.0, 100.0], dtype=torch.float64)
    batched = vmap(_average)(t0s)
    loop = torch.stack([_average(t) for t in t0s])
    torch.testing.assert_close(batched, loop, rtol=1e-12, atol=1e-14)
    assert len(set(loop.tolist())) == 4


def test_compiled_update_compiles_once():
    """One graph for steps before and after t0 (where mu becomes other than 1)."""
    torch.manual_seed(0)
    params = {"w": torch.randn(4, 3), "b": torch.randn(3)}
    grads_seq = [{k: torch.randn_like(v) for k, v in params.items()} for _ in range(5)]
    tx = fo.asgd(lr=0.05, t0=2, lambd=0.1, weight_decay=0.1)
    (comp_p, comp_s), (eager_p, eager_s) = compiled_and_eager_steps(tx, params, grads_seq)
    assert_same(comp_p, eager_p)
    assert_same(list(comp_s), list(eager_s))
    assert comp_s.mu["w"] == torch.tensor(1 / 3)  # after 5 steps with t0 = 2
