"""A functional state keeps one structure from `init` on: every factory, with every
option set torch tests and inside the wrappers, has a state of the same tree structure,
shapes and dtypes at init and after each step, so that a compiled update makes one graph
for all steps and a state can be a scan carry or a vmap input of fixed structure."""

from __future__ import annotations

import inspect

import optree
import pytest
import torch
from helpers import ALGORITHMS, factory, matrices_only, optim_inputs, steps_on_dense_gradients

import funcopt as fo

NAMES = [name for name in ALGORITHMS if steps_on_dense_gradients(name)] + ["Lion"]


def _factory(name):
    return fo.lion if name == "Lion" else factory(name)


def _option_sets(name):
    if name == "Lion":
        return [("default", {"learning_rate": 0.01}), ("decay", {"learning_rate": 0.01, "weight_decay": 0.1})]
    accepted = inspect.signature(_factory(name)).parameters
    sets = []
    for desc, kwargs in optim_inputs(name, with_flags=False):
        kwargs = {k: v for k, v in kwargs.items() if k in accepted}
        if any(isinstance(v, torch.Tensor) and v.numel() != 1 for v in kwargs.values()):
            continue
        sets.append((desc, kwargs))
    return sets


def _params(name):
    params = {"w": torch.randn(3, 2), "b": torch.randn(2)}
    return {"w": params["w"]} if name != "Lion" and matrices_only(name) else params


def _signature(state):
    leaves, spec = optree.tree_flatten(state)
    return spec, [(x.shape, x.dtype) if isinstance(x, torch.Tensor) else type(x) for x in leaves]


WRAPPERS = {
    "plain": lambda f, kw: f(**kw),
    "chain": lambda f, kw: fo.chain(fo.clip_by_global_norm(1.0), f(**kw)),
    "multi_steps": lambda f, kw: fo.MultiSteps(f(**kw), every_k_schedule=2).gradient_transformation(),
    "apply_if_finite": lambda f, kw: fo.apply_if_finite(f(**kw), max_consecutive_errors=2),
    "inject_hyperparams": lambda f, kw: fo.inject_hyperparams(f)(**kw),
    # a sync at step 2, which restarts the fast state from its init (reset_state)
    "lookahead": lambda f, kw: fo.lookahead(f(**kw), sync_period=2, slow_step_size=0.5, reset_state=True),
}


def _given(tx_name, params):
    """The params that the transformation's init and update take: lookahead's are the
    fast and slow params (the gradients stay those of the fast ones)."""
    return fo.LookaheadParams.init_synced(params) if "lookahead" in tx_name else params


@pytest.mark.parametrize("wrapper", list(WRAPPERS))
@pytest.mark.parametrize("name", NAMES)
def test_state_keeps_its_structure(name, wrapper):
    params = _params(name)
    for desc, kwargs in _option_sets(name):
        tx = WRAPPERS[wrapper](_factory(name), kwargs)
        given = _given(wrapper, params)
        state = tx.init(given)
        signatures = [_signature(state)]
        for step in range(3):
            make = torch.zeros_like if step == 1 else torch.randn_like  # a zero gradient too
            _, state = tx.update(optree.tree_map(make, params), state, given)
            signatures.append(_signature(state))
        changes = sum(a != b for a, b in zip(signatures, signatures[1:]))
        assert changes == 0, f"{name} ({desc}, {wrapper})"


class _Count:
    """A torch.compile backend that counts the graphs it is given and runs them eagerly."""

    def __init__(self):
        self.graphs = 0

    def __call__(self, gm, example_inputs):
        self.graphs += 1
        return gm.forward


COMPILED = {name: (lambda n=name: WRAPPERS["plain"](_factory(n), _option_sets(n)[0][1])) for name in NAMES}
COMPILED["SGD momentum"] = lambda: fo.sgd(lr=0.1, momentum=0.9, nesterov=True)
COMPILED["SGD momentum, MultiSteps"] = lambda: WRAPPERS["multi_steps"](fo.sgd, {"lr": 0.1, "momentum": 0.9})
COMPILED["SGD momentum, apply_if_finite"] = lambda: WRAPPERS["apply_if_finite"](
    fo.sgd, {"lr": 0.1, "momentum": 0.9}
)
COMPILED["SGD dampening"] = lambda: fo.sgd(lr=0.1, momentum=0.9, dampening=0.1)
COMPILED["SGD dampening, inject_hyperparams"] = lambda: WRAPPERS["inject_hyperparams"](
    fo.sgd, {"lr": 0.1, "momentum": 0.9, "dampening": 0.1}
)
COMPILED["Adam, inject_hyperparams"] = lambda: WRAPPERS["inject_hyperparams"](fo.adam, {"lr": 0.1})
COMPILED["SGD momentum, lookahead"] = lambda: WRAPPERS["lookahead"](fo.sgd, {"lr": 0.1, "momentum": 0.9})


@pytest.mark.slow
@pytest.mark.parametrize("name", list(COMPILED))
def test_compiled_update_makes_one_graph_for_all_steps(name):
    torch._dynamo.reset()
    base = name.split()[0]
    params = _params(base if base in NAMES else "SGD")
    given = _given(name, params)
    tx = COMPILED[name]()
    backend = _Count()
    update = torch.compile(tx.update, fullgraph=True, backend=backend)
    state = tx.init(given)
    eager_state = state
    for _ in range(5):
        grads = optree.tree_map(torch.randn_like, params)
        updates, state = update(grads, state, given)
        expected, eager_state = tx.update(grads, eager_state, given)
        torch.testing.assert_close(optree.tree_leaves(updates), optree.tree_leaves(expected))
    assert backend.graphs == 1, f"{name}: {backend.graphs} graphs over 5 steps"
