"""The catalogue (optax's blocks, aliases and contrib optimizers) against optax itself:
each run 20 steps in float64 beside optax on JAX, params and updates equal to 1e-9
relative; and each state keeps one tree structure (shapes, dtypes) from init on."""

from __future__ import annotations

from typing import Any

import numpy as np
import optree
import pytest
import torch

import funcopt as fo

optax = pytest.importorskip("optax")
jax = pytest.importorskip("jax")
jnp = jax.numpy
jax.config.update("jax_enable_x64", True)

STEPS = 20
TOL = {"rtol": 1e-9, "atol": 1e-12}
SHAPES = {"w": (3, 4), "b": (4,), "k": (2, 3, 2)}


def schedule(count: Any) -> Any:
    """A schedule both libraries run (in float64 on both)."""
    if isinstance(count, torch.Tensor):
        count = count.double()
    return 0.05 * 0.9**count


def tree(seed: int, scale: float = 1.0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {k: scale * torch.randn(s, generator=g, dtype=torch.float64) for k, s in SHAPES.items()}


def to_jax(t: Any) -> Any:
    return optree.tree_map(lambda x: jnp.asarray(x.detach().numpy()), t)


def loss(params: Any, lib: Any) -> Any:
    """A loss both libraries compute from their params: ``0.5 |p|^2 + 1``."""
    return 0.5 * sum(lib.sum(p * p) for p in optree.tree_leaves(params)) + 1.0


def grads_at(params: Any, step: int, lib: Any) -> Any:
    """The gradient of `loss` plus fixed noise (the same in both libraries)."""
    noise = tree(100 + step, 0.5)
    return {k: params[k] + (lib.asarray(noise[k].numpy()) if lib is jnp else noise[k]) for k in params}


def run_both(tx: Any, otx: Any, with_value: bool = False, steps: int = STEPS, extra: Any = None) -> None:
    """`steps` steps of each; params and updates compared at every step; the state's
    structure, shapes and dtypes at init and after steps 1-3 compared with init's."""
    params, oparams = tree(0), to_jax(tree(0))
    state, ostate = tx.init(params), otx.init(oparams)
    spec = structure(state)
    for step in range(steps):
        kw = dict(extra(params, step, torch) if extra else {})
        okw = dict(extra(oparams, step, jnp) if extra else {})
        if with_value:
            kw["value"], okw["value"] = loss(params, torch), loss(oparams, jnp)
        updates, state = tx.update(grads_at(params, step, torch), state, params, **kw)
        oupdates, ostate = otx.update(grads_at(oparams, step, jnp), ostate, oparams, **okw)
        params = fo.apply_updates(params, updates)
        oparams = optax.apply_updates(oparams, oupdates)
        if step < 3:
            assert structure(state) == spec, f"step {step + 1}: the state changed structure"
        for k in params:
            torch.testing.assert_close(
                params[k], torch.from_numpy(np.array(oparams[k])), msg=lambda m, k=k, s=step: f"step {s}, {k}: {m}", **TOL
            )
            torch.testing.assert_close(
                updates[k], torch.from_numpy(np.array(oupdates[k])), msg=lambda m, k=k, s=step: f"step {s}, update {k}: {m}", **TOL
            )


def structure(state: Any) -> Any:
    leaves, spec = optree.tree_flatten(state, none_is_leaf=True)
    return spec, [(tuple(x.shape), x.dtype) if isinstance(x, torch.Tensor) else x for x in leaves]


def both(name: str, **hp: Any) -> tuple[Any, Any]:
    """funcopt's and optax's transformation of that name and arguments."""
    theirs = getattr(optax, name, None) or getattr(optax.contrib, name)
    return getattr(fo, name)(**hp), theirs(**hp)


BLOCKS: list[tuple[str, dict[str, Any]]] = [
    ("scale_by_belief", {}),
    ("scale_by_belief", {"b1": 0.8, "eps": 1e-6, "nesterov": True}),
    ("scale_by_radam", {}),
    ("scale_by_radam", {"b2": 0.9, "nesterov": True}),
    ("scale_by_yogi", {}),
    ("scale_by_amsgrad", {"b2": 0.9, "eps_root": 1e-3}),
    ("scale_by_amsgrad", {"bias_correction_mu": False, "bias_correction_nu": False}),
    ("scale_by_adamax", {}),
    ("scale_by_adan", {}),
    ("scale_by_adan", {"eps_root": 1e-4}),
    ("scale_by_novograd", {}),
    ("scale_by_novograd", {"weight_decay": 0.1, "b2": 0.5}),
    ("scale_by_stddev", {}),
    ("scale_by_stddev", {"decay": 0.8, "eps": 1e-2, "eps_in_sqrt": False, "bias_correction": True, "initial_scale": 1.0}),
    ("scale_by_rss", {}),
    ("scale_by_sm3", {}),
    ("scale_by_sm3", {"b1": 0.5, "b2": 0.9}),
    ("scale_by_optimistic_gradient", {"alpha": 0.7, "beta": 0.3}),
]


def case_id(case: tuple[str, dict[str, Any]]) -> str:
    return "-".join([case[0], *case[1]])


@pytest.mark.parametrize("case", BLOCKS, ids=map(case_id, BLOCKS))
def test_block_matches_optax(case):
    name, hp = case
    tx, otx = both(name, **hp)
    lr = 0.05
    run_both(fo.chain(tx, fo.scale(-lr)), optax.chain(otx, optax.scale(-lr)))


@pytest.mark.parametrize("case", [c for c in BLOCKS if c[1]][:6], ids=case_id)
def test_block_tensor_hyperparameters(case):
    """0-d tensor hyperparameters give the numbers' steps."""
    name, hp = case
    tensors = {k: torch.tensor(v, dtype=torch.float64) if isinstance(v, float) else v for k, v in hp.items()}
    run_both(
        fo.chain(getattr(fo, name)(**tensors), fo.scale(-0.05)),
        optax.chain(getattr(optax, name)(**hp), optax.scale(-0.05)),
        steps=5,
    )
