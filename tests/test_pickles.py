"""Pickles made by earlier versions of funcopt still load and step (fixtures in
tests/fixtures/, written by tests/fixtures/make_pickles.py at the commit in their name):
a module moving or being renamed must not break a user's saved state or transformation."""

from __future__ import annotations

import copy
import pickle
from pathlib import Path

import optree
import pytest
import torch

import funcopt as fo

FIXTURES = Path(__file__).parent / "fixtures"
CHANGED_ON_PURPOSE = {
    # the functional ASGD's float64 counters no longer round to float32 (float64 agreement)
    "asgd": 1e-8,
    # the warmup is read at the same step by the base step and the averaging weight, as the
    # schedule-free authors compute it (it lagged one step)
    "schedule_free": None,
    # scale_by_adam runs fo.adam's math (issue 61: one copy), equal to float64 round-off
    "chain": 1e-14,
}
"""Entries whose math changed on purpose since the fixture: they load and step, to this
relative tolerance (None: to finite values of the same structure)."""
PICKLES = sorted(FIXTURES.glob("pickles_*.pkl"))
STATES = sorted(FIXTURES.glob("states_*.pt"))


def same(a, b):
    la, lb = optree.tree_leaves(a, none_is_leaf=True), optree.tree_leaves(b, none_is_leaf=True)
    assert optree.tree_structure(a, none_is_leaf=True) == optree.tree_structure(b, none_is_leaf=True)
    for x, y in zip(la, lb):
        if isinstance(x, torch.Tensor):
            torch.testing.assert_close(x, y, rtol=0, atol=0)
        else:
            assert x == y


@pytest.mark.parametrize("path", PICKLES, ids=lambda p: p.stem)
def test_old_transformations_and_states_step_as_they_did(path):
    """The pickled transformation, and today's factory's, step the pickled state as the
    code that pickled them did, bit for bit."""
    fixture = pickle.loads(path.read_bytes())
    params, grads = fixture["params"], fixture["grads"]
    assert len(fixture["entries"]) >= 20
    for name, entry in fixture["entries"].items():
        updates, after = entry["tx"].update(grads[2], entry["state"], params)
        if name not in CHANGED_ON_PURPOSE:
            same(updates, entry["updates"])
            same(after, entry["after"])
            continue
        assert optree.tree_structure(after) == optree.tree_structure(entry["after"]), name
        assert all(torch.isfinite(x).all() for x in optree.tree_leaves(updates)), name
        if CHANGED_ON_PURPOSE[name] is not None:
            torch.testing.assert_close(updates, entry["updates"], rtol=CHANGED_ON_PURPOSE[name], atol=0)


@pytest.mark.parametrize("path", STATES, ids=lambda p: p.stem)
def test_old_states_load_with_torch_load_defaults(path):
    """A state saved with torch.save loads with torch.load's default (weights_only=True)."""
    states = torch.load(path)
    fixture = pickle.loads(next(FIXTURES.glob(f"pickles_{path.stem.split('_')[1]}.pkl")).read_bytes())
    for name, state in states.items():
        same(state, fixture["entries"][name]["state"])


@pytest.mark.parametrize("path", PICKLES, ids=lambda p: p.stem)
def test_old_optimizers_load_and_step(path):
    """A pickled fo.Adam and fo.Optimizer load, and step as a fresh one given their
    state_dict does."""
    fixture = pickle.loads(path.read_bytes())
    for name, opt in fixture["optimizers"].items():
        params = opt.param_groups[0]["params"]
        twin_params = [p.detach().clone() for p in params]
        if name == "Adam":
            twin = fo.Adam(twin_params)
        else:
            twin = fo.Optimizer(twin_params, copy.deepcopy(opt._transform))
        twin.load_state_dict(copy.deepcopy(opt.state_dict()))  # as torch.load gives it
        for o, ps in ((opt, params), (twin, twin_params)):
            for p in ps:
                p.grad = torch.ones_like(p)
            o.step()
        for p, q in zip(params, twin_params):
            torch.testing.assert_close(p, q, rtol=0, atol=0)


def test_new_pickles_name_public_paths_only():
    """A transformation, its state and a drop-in optimizer pickle under public names
    (funcopt.adam(...), funcopt.AdamState, funcopt.Adam): no private module is named."""
    import sys

    sys.path.insert(0, str(FIXTURES))
    try:
        from make_pickles import transformations
    finally:
        sys.path.remove(str(FIXTURES))
    params = {"w": torch.randn(3, 2), "b": torch.randn(2)}
    for name, tx in transformations().items():
        state = tx.init(params)
        _, state = tx.update(optree.tree_map(torch.ones_like, params), state, params)
        for what, obj in (("transformation", tx), ("state", state)):
            blob = pickle.dumps(obj)
            assert b"_src" not in blob, f"{name}'s {what} names a private module: {blob!r}"
        copy_ = pickle.loads(pickle.dumps(tx))
        same(copy_.update(optree.tree_map(torch.ones_like, params), state, params),
             tx.update(optree.tree_map(torch.ones_like, params), state, params))  # fmt: skip
    model = torch.nn.Linear(2, 2)
    for opt in (fo.Adam(model.parameters()), fo.Optimizer(model.parameters(), fo.adam(lr=0.1))):
        model(torch.ones(2)).sum().backward()
        opt.step()
        assert b"_src" not in pickle.dumps(opt)
