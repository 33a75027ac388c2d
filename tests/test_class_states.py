"""The in-place drop-in classes Momo, PolyakSGD and SM3 against the earlier classes
(`fo.Optimizer` over the functional forms, optax's math), which they replace: the same
steps to float64 round-off, in place; and state_dicts saved by the earlier classes
(and by the Prodigy and DAdaptAdamW of that commit, `fixtures/class_states_308f432.pt`,
written by `fixtures/make_class_states.py`) load and step on."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch

import funcopt as fo

FIXTURE = Path(__file__).parent / "fixtures" / "class_states_308f432.pt"
SHAPES = [(3, 4), (4,), (2, 3), (2, 2, 3)]


def params(dtype: torch.dtype = torch.float64) -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(0)
    return [torch.nn.Parameter(torch.randn(s, generator=g, dtype=torch.float64).to(dtype)) for s in SHAPES]


def run(opt: Any, ps: list[torch.Tensor], steps: range) -> None:
    for step in range(steps.start, steps.stop):
        g = torch.Generator().manual_seed(100 + step)
        grads = [torch.randn(p.shape, generator=g, dtype=torch.float64).to(p.dtype) for p in ps]
        loss = 3.0 / (1 + step) + 0.1

        def closure(grads: list[torch.Tensor] = grads, loss: float = loss) -> torch.Tensor:
            for p, grad in zip(ps, grads):
                p.grad = grad.clone()
            return torch.tensor(loss, dtype=torch.float64)

        opt.step(closure)


def _momo(lr, beta, lower_bound, weight_decay, adapt_lower_bound):
    return fo.momo(
        lr, beta=beta, lower_bound=lower_bound, weight_decay=weight_decay, adapt_lower_bound=adapt_lower_bound
    )


def _polyak(lr, max_lr, f_min, eps, variant):
    return fo.polyak_sgd(max_learning_rate=max_lr, scaling=lr, f_min=f_min, eps=eps, variant=variant)


def _sm3(lr, momentum):
    return fo.sm3(lr, momentum=momentum)


EARLIER = {
    "Momo": (_momo, dict(lr=1.0, beta=0.9, lower_bound=0.0, weight_decay=0.0, adapt_lower_bound=False)),
    "PolyakSGD": (_polyak, dict(lr=1.0, max_lr=1.0, f_min=0.0, eps=0.0, variant="sps")),
    "SM3": (_sm3, dict(lr=0.1, momentum=0.9)),
}
AWAY = {
    "Momo": [dict(lr=0.5, weight_decay=0.01), dict(lr=0.5, beta=0.5, lower_bound=0.05, adapt_lower_bound=True),
             dict(lr=0.2, weight_decay=0.1, adapt_lower_bound=True)],
    "PolyakSGD": [dict(lr=0.5, max_lr=0.3, f_min=0.5), dict(lr=0.5, max_lr=2.0, f_min=2.0, eps=0.1, variant="sps+")],
    "SM3": [dict(lr=0.3, momentum=0.0), dict(lr=0.03, momentum=0.5)],
}  # fmt: skip
CASES = [(n, k) for n in EARLIER for k in [{}, *AWAY[n]]]


def groups(ps: list[torch.Tensor], name: str) -> list[dict[str, Any]]:
    """Two param groups, the second with its own lr (each group steps on its own)."""
    lr = 0.5 * EARLIER[name][1]["lr"]
    return [{"params": ps[:2]}, {"params": ps[2:], "lr": lr}]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("name, kwargs", CASES, ids=str)
def test_steps_as_the_earlier_class(name, kwargs, dtype):
    """20 steps of two param groups equal the earlier class's (optax's math) to round-off."""
    factory, defaults = EARLIER[name]
    old_ps, new_ps = params(dtype), params(dtype)
    old = fo.Optimizer(groups(old_ps, name), factory, **{**defaults, **kwargs})
    new = getattr(fo, name)(groups(new_ps, name), **kwargs)
    run(old, old_ps, range(20))
    run(new, new_ps, range(20))
    tol = dict(rtol=1e-12, atol=1e-13) if dtype == torch.float64 else dict(rtol=1e-5, atol=1e-6)
    for a, b, p0 in zip(new_ps, old_ps, params(dtype)):
        assert not torch.equal(b, p0)
        torch.testing.assert_close(a, b, **tol)


@pytest.mark.parametrize("name", sorted(EARLIER))
def test_steps_in_place(name):
    """The params and the per-param buffers are the same tensors, written in place."""
    ps = params()
    opt = getattr(fo, name)(ps, **AWAY[name][0])
    run(opt, ps, range(1))
    before = [(p.data_ptr(), {k: v for k, v in opt.state[p].items()}) for p in ps]
    run(opt, ps, range(1, 3))
    for p, (ptr, state) in zip(ps, before):
        assert p.data_ptr() == ptr
        for key, value in state.items():
            assert opt.state[p][key] is value


@pytest.mark.parametrize("name", sorted(EARLIER))
def test_an_earlier_state_dict_loads(name):
    """A state_dict of the earlier class (its chain's keys; Momo's averages in each
    param's state) resumes in today's class, which then steps as the earlier one."""
    factory, defaults = EARLIER[name]
    kwargs = AWAY[name][-1]
    old_ps = params()
    old = fo.Optimizer(groups(old_ps, name), factory, **{**defaults, **kwargs})
    run(old, old_ps, range(4))
    saved = copy.deepcopy(old.state_dict())
    new_ps = [torch.nn.Parameter(p.detach().clone()) for p in old_ps]
    new = getattr(fo, name)(groups(new_ps, name), **kwargs)
    new.load_state_dict(saved)
    run(old, old_ps, range(4, 10))
    run(new, new_ps, range(4, 10))
    for a, b in zip(new_ps, old_ps):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)


def _entries() -> dict[str, Any]:
    return torch.load(FIXTURE)  # (torch.load's default, weights_only, reads it)


@pytest.mark.parametrize("key", sorted(_entries()))
def test_a_saved_state_dict_loads_and_steps_on(key):
    """Each state_dict of the fixture loads into today's class and steps on as that
    commit's class did; a Prodigy or DAdaptAdamW of two groups, which had an estimate
    per group, goes on with the first group's estimate for both."""
    entry = _entries()[key]
    ps = [torch.nn.Parameter(p.clone()) for p in entry["params"]]
    groups, start = [], 0
    for size in entry["sizes"]:
        groups.append({"params": ps[start : start + size]})
        start += size
    opt = getattr(fo, entry["name"])(groups, **entry["kwargs"])
    opt.load_state_dict(entry["state_dict"])
    for grads, loss in entry["more"]:

        def closure(grads: list[torch.Tensor] = grads, loss: float = loss) -> torch.Tensor:
            for p, g in zip(ps, grads):
                p.grad = g.clone()
            return torch.tensor(loss, dtype=torch.float64)

        opt.step(closure)
    if len(entry["sizes"]) > 1 and entry["name"] in ("Prodigy", "DAdaptAdamW"):
        saved = entry["state_dict"]["param_groups"]
        assert (
            saved[0]["numerator_weighted"] != saved[1]["numerator_weighted"]
        )  # (two estimates then, one now)
        assert len({g["numerator_weighted"] for g in opt.param_groups}) == 1
        assert len({g["estim_lr"] for g in opt.param_groups}) == 1
        assert all(g["count"] == saved[0]["count"] + 3 for g in opt.param_groups)
        assert all(torch.isfinite(p).all() for p in ps)
        return
    for a, b in zip(ps, entry["after"]):
        torch.testing.assert_close(a.detach(), b, rtol=1e-12, atol=1e-14)
