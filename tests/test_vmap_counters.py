"""Batched step counters under ``vmap``: leaves whose counters are views of one counter
(as ``vmap(init)`` returns them) take one schedule per step, as leaves that share their
counter tensor do, with the numbers of a schedule per leaf."""

from __future__ import annotations

import optree
import pytest
import torch
from helpers import ALGORITHMS, HYPER, assert_same, kwargs_of, skip_unless_steps_on_gradients
from torch.func import vmap

import funcopt as fo
from funcopt._src.engine.leaves import same_batched

BATCH = 3


def factory(name, lr):
    return getattr(fo, name.lower())(**{**kwargs_of(HYPER[name]), "lr": lr})


def batch_params():
    g = torch.Generator().manual_seed(0)
    shapes = {"w": (4, 3), "v": (3, 3), "b": (1, 3)}  # matrices: Muon steps those only
    return {k: torch.randn(BATCH, *s, generator=g, dtype=torch.float64) for k, s in shapes.items()}


def counters(state):
    """The state's counter leaves, field by field (0-d per member: 1-d batched)."""
    return [[t for t in optree.tree_leaves(field) if t.ndim == 1] for field in state]


@pytest.mark.parametrize("name", ALGORITHMS)
def test_views_of_one_counter_take_one_schedule_with_the_same_numbers(name):
    """Stepped from ``vmap(init)``'s state, whose counters are views of one counter per
    field, the vmapped update's new counters are one tensor per field (one schedule per
    step, not one per leaf), and every update and state equals the one from the same
    state with each leaf's counters cloned apart (a schedule per leaf)."""
    skip_unless_steps_on_gradients(name)
    params = batch_params()
    lrs = torch.tensor([0.01, 0.02, 0.05], dtype=torch.float64)
    state = vmap(lambda p, lr: factory(name, lr).init(p))(params, lrs)
    if not any(counters(state)):
        pytest.skip(f"{name}'s state has no counters")
    apart = optree.tree_map(torch.clone, state)
    g = torch.Generator().manual_seed(1)

    def update(grads, state, params, lr):
        return factory(name, lr).update(grads, state, params)

    for _ in range(3):
        grads = optree.tree_map(lambda p: torch.randn(p.shape, generator=g, dtype=p.dtype), params)
        updates, state = vmap(update)(grads, state, params, lrs)
        expected, apart = vmap(update)(grads, apart, params, lrs)
        assert_same((updates, list(state)), (expected, list(apart)), rtol=0, atol=0)
        for field in counters(state):
            assert all(t is field[0] for t in field), "one schedule: one new counter for every leaf"
        params = fo.apply_updates(params, updates)


def test_same_batched_tells_views_of_one_counter_only():
    """Views of one counter at the same vmap level and batch dim are the same; clones, other
    offsets or counters that autograd records are not."""
    base = torch.zeros(BATCH)
    recorded = torch.zeros(BATCH, requires_grad=True)

    def check(a, b, c, r1, r2):
        assert same_batched(a, b)
        assert not same_batched(a, c)
        assert not same_batched(r1, r2)  # distinct autograd histories stay apart
        assert not same_batched(torch.tensor(0.0), torch.tensor(0.0))  # plain: identity serves
        return a

    vmap(check)(
        base.expand(BATCH), base.expand(BATCH), base.clone(), recorded.view(BATCH), recorded.view(BATCH)
    )
