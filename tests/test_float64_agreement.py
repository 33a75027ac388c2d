"""In float64 the functional form agrees with torch.optim to the params' own round-off
(issue 62): every algorithm, through fo.inner_loop, at 1e-12 after 8 steps.

torch.optim keeps its counters in the default dtype, float32 unless
``torch.set_default_dtype(torch.float64)``: with float64 params, torch's NAdam then
rounds ``mu_product`` to float32 at each step, and ASGD its ``eta`` and ``mu``, which
moves its params by ~1e-9. funcopt's functional state keeps float64 counters for float64
params (docs/concepts.md), so it agrees with torch's float64 computation, the one torch
makes under a float64 default dtype; funcopt's classes keep torch's counters and agree
with torch either way (tests/test_adapter.py)."""

from __future__ import annotations

import pytest
import torch
from helpers import ALGORITHMS, HYPER, factory, kwargs_of, set_default_dtype, steps_on_dense_gradients

import funcopt as fo

F64 = torch.float64
STEPS = 8  # RAdam's rectification starts at the sixth
NAMES = [n for n in ALGORITHMS if steps_on_dense_gradients(n)]
# torch's counters that round to the default dtype with float64 params (not integers)
ROUNDED_COUNTERS = {"NAdam": ["mu_product"], "ASGD": ["eta", "mu"]}


def problem():
    g = torch.Generator().manual_seed(0)
    params = {"w": torch.randn(4, 3, generator=g, dtype=F64), "b": torch.randn(1, 3, generator=g, dtype=F64)}
    x, y = torch.randn(16, 4, generator=g, dtype=F64), torch.randn(16, 3, generator=g, dtype=F64)
    return params, x, y


def loss_fn(params, x, y):
    return (torch.tanh(x @ params["w"] + params["b"]) - y).pow(2).mean()


def torch_run(name):
    """torch's class: the params after `STEPS` steps, and its state."""
    params, x, y = problem()
    leaves = {k: v.clone().requires_grad_() for k, v in params.items()}
    opt = getattr(torch.optim, name)(leaves.values(), **kwargs_of(HYPER[name]))
    for _ in range(STEPS):
        opt.zero_grad()
        loss_fn(leaves, x, y).backward()
        opt.step()
    return {k: v.detach() for k, v in leaves.items()}, opt.state[leaves["w"]]


def functional_run(name):
    params, x, y = problem()
    adapted, _, _ = fo.inner_loop(loss_fn, params, factory(name)(**kwargs_of(HYPER[name])), [(x, y)] * STEPS)
    return adapted


def assert_within(actual, expected, tol):
    for k in expected:
        diff = float((actual[k] - expected[k]).abs().max())
        assert diff <= tol, f"{k}: {diff:.3g}"


@pytest.mark.parametrize("name", NAMES)
def test_functional_agrees_with_torch_in_float64(name):
    with set_default_dtype(F64):  # torch's counters in float64 too
        expected, _ = torch_run(name)
        assert_within(functional_run(name), expected, 1e-12)
    # under the float32 default dtype, funcopt's functional form computes the same
    ours = functional_run(name)
    assert_within(ours, expected, 1e-12)
    theirs, torch_state = torch_run(name)
    if name not in ROUNDED_COUNTERS:
        assert_within(ours, theirs, 1e-12)
        return
    # torch's class rounds these counters to float32: its params move by that rounding
    assert all(torch_state[key].dtype == torch.float32 for key in ROUNDED_COUNTERS[name])
    assert_within(theirs, expected, 1e-7)
    with pytest.raises(AssertionError):
        assert_within(theirs, expected, 1e-12)
