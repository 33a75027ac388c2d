"""Every transformation's functional state is a pytree of tensors, no None among its
leaves, so that it crosses ``torch.func.vmap`` (as input and output), ``torch.func.grad``
(as input and auxiliary output) and ``torch.compile``.

The factories are found, not listed: every lower-case function of ``fo.__all__`` that
returns a `GradientTransformation` when called with no arguments, or with the values
of `REQUIRED_ARGS` for its required ones; `COMBOS` adds `masked`, `partition` and
`chain` around them. Each batched result is checked against the same steps run on
each member of the batch alone."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import optree
import pytest
import torch
from helpers import ALGORITHMS, INFOS, assert_same, factory, matrices_only
from torch.func import grad, vmap

import funcopt as fo

BATCH = 3
TOL = {"rtol": 1e-6, "atol": 1e-7}

REQUIRED_ARGS: dict[str, Any] = {
    "max_norm": 1.0,  # clip_by_global_norm
    "max_delta": 0.5,  # clip
    "threshold": 1.0,  # clip_by_block_rms
    "clipping": 0.1,  # adaptive_grad_clip
    "learning_rate": 0.1,  # optax's name for lr
    "step_size": 0.1,  # scale
    "decay": 0.9,  # ema, trace
    "step_size_fn": lambda count: 0.1 / (1 + count),  # scale_by_schedule
    "inner": fo.nadam(lr=0.05),  # apply_if_finite
    "max_consecutive_errors": 2,  # apply_if_finite
    "base_optimizer": fo.adamax(lr=0.05),  # schedule_free
}
"""Values for the required arguments of factories, by argument name. A factory with a
required argument not named here is skipped, with the reason: add its value here."""

OPTIONS: dict[str, dict[str, Any]] = {
    # Newton-Schulz in float64: in torch's bfloat16 a batched run rounds otherwise than a
    # loop (vmap computes addmm as a product and a sum); tests/test_muon.py checks that
    "muon": {"ns_dtype": torch.float64},
}
"""Options of some factories, by factory name, for results that batched and looped
runs give alike."""


COMBINATORS = ("masked", "partition")  # tested in COMBOS


def _factory_names() -> list[str]:
    return sorted(
        name
        for name in fo.__all__
        if name[0].islower() and callable(getattr(fo, name)) and not isinstance(getattr(fo, name), type)
    )


def _is_transformation(value: Any) -> bool:
    return callable(getattr(value, "init", None)) and callable(getattr(value, "update", None))


NEEDS_EXTRA_ARGS = {
    "hutchinson_estimator_diag_hessian": "obj_fn",
    "scale_by_sophia": "obj_fn",
    "sophia": "obj_fn",
    "reduce_on_plateau": "value",
    "scale_by_polyak": "value",
    "polyak_sgd": "value",
    "momo": "value",
    "momo_adam": "value",
}
"""Factories whose update needs an extra argument these steps do not give (the loss, or
the objective): tests/test_catalogue.py runs them with it, under vmap, grad and compile."""


def build(name: str) -> fo.GradientTransformation:
    """``fo.<name>(...)`` with `REQUIRED_ARGS` for its required arguments, or a skip that
    says why it cannot be built here."""
    if name in COMBINATORS:
        pytest.skip(f"fo.{name} takes a mask or labels: COMBOS tests it")
    if name in NEEDS_EXTRA_ARGS:
        pytest.skip(f"fo.{name}'s update needs {NEEDS_EXTRA_ARGS[name]}=: tests/test_catalogue.py runs it")
    factory = getattr(fo, name)
    try:
        parameters = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):
        pytest.skip(f"fo.{name} has no signature to read")
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    required = [p.name for p in parameters if p.kind in kinds and p.default is inspect.Parameter.empty]
    unknown = [r for r in required if r not in REQUIRED_ARGS]
    if unknown:
        pytest.skip(
            f"fo.{name} needs required arguments {unknown}: add values for them to REQUIRED_ARGS "
            "if it returns a GradientTransformation"
        )
    result = factory(**{r: REQUIRED_ARGS[r] for r in required}, **OPTIONS.get(name, {}))
    if not _is_transformation(result):
        pytest.skip(f"fo.{name}(...) returns {type(result).__name__}, not a GradientTransformation")
    return result


def objective(params: Any) -> torch.Tensor:
    """The loss that updates get as ``value_fn`` (fo.lbfgs evaluates it; every other
    transformation ignores extra arguments)."""
    return sum(t.pow(2).sum() for t in optree.tree_leaves(params))


def _info(make: Callable[[], fo.GradientTransformation]) -> Any:
    """torch's OptimizerInfo of the class whose factory `make` builds, or None."""
    name = getattr(make, "factory_name", None)
    return next((INFOS[c] for c in ALGORITHMS if factory(c).__name__ == name), None)


def skip_if_sparse_only(make: Callable[[], fo.GradientTransformation]) -> None:
    """Skip for the factory of a class that takes sparse gradients only (torch's
    OptimizerInfo: SparseAdam), which torch.func transforms do not support."""
    info = _info(make)
    if info is not None and info.only_supports_sparse_grads:
        pytest.skip(
            f"{info.name} takes sparse gradients only, which torch.func and this test's dense ones are not"
        )


def dtype_for(make: Callable[[], fo.GradientTransformation]) -> torch.dtype:
    """float64 for the factory of a class whose step requires a closure (LBFGS): its update
    is a loop of up to 20 dependent iterations, after which a traced or batched run (dot
    products summed in another order) and an eager one differ by more than float32's
    round-off of one step; float32 for the others."""
    info = _info(make)
    return torch.float64 if info is not None and info.step_requires_closure else torch.float32


def rows_for(make: Callable[[], fo.GradientTransformation]) -> bool:
    """Whether the factory is of a class that steps matrices only (Muon, as torch's): its
    params' biases are rows (1, n)."""
    info = _info(make)
    return info is not None and matrices_only(info.optim_cls.__name__)


def model_params(
    batch: int | None = None, seed: int = 0, dtype: torch.dtype = torch.float32, rows: bool = False
) -> dict[str, Any]:
    """Two layers' weights and biases (each bias a row (1, n) with `rows`)."""
    g = torch.Generator().manual_seed(seed)
    lead = () if batch is None else (batch,)
    bias = (*lead, 1, 2) if rows else (*lead, 2)
    params = {
        "layer1": {"w": torch.randn(*lead, 3, 2, generator=g), "b": torch.randn(bias, generator=g)},
        "layer2": {"w": torch.randn(*lead, 2, 2, generator=g), "b": torch.randn(bias, generator=g)},
    }
    return optree.tree_map(lambda t: t.to(dtype), params)


def is_weight(tree: Any) -> Any:
    return optree.tree_map(lambda p: p.ndim > 1, tree)


def by_rank(tree: Any) -> Any:
    return optree.tree_map(lambda p: 0 if p.ndim > 1 else 1, tree)


COMBOS: dict[str, Callable[[], fo.GradientTransformation]] = {
    "masked-tree": lambda: fo.masked(fo.nadam(weight_decay=0.1), is_weight(model_params())),
    "masked-prefix": lambda: fo.masked(fo.adamax(lr=0.05), {"layer1": True, "layer2": False}),
    "masked-function": lambda: fo.masked(fo.adagrad(lr=0.1, weight_decay=0.1), is_weight),
    "masked-nothing": lambda: fo.masked(fo.nadam(), False),
    "partition-int-labels": lambda: fo.partition({0: fo.nadam(weight_decay=0.1), 1: fo.adadelta()}, by_rank),
    "partition-prefix": lambda: fo.partition(
        {"a": fo.adamax(), "b": fo.adagrad(), "unused": fo.nadam()}, {"layer1": "a", "layer2": "b"}
    ),
    "chain-clip-masked": lambda: fo.chain(
        fo.clip_by_global_norm(1.0), fo.masked(fo.nadam(lr=0.05), is_weight), fo.adamax(lr=0.01)
    ),
    "masked-partition": lambda: fo.masked(
        fo.partition({"w": fo.nadam(), "b": fo.adagrad()}, lambda t: optree.tree_map(lambda p: "w", t)),
        {"layer1": True, "layer2": False},
    ),
}


def _builder(name: str) -> Callable[[], fo.GradientTransformation]:
    make = functools.partial(build, name)
    make.factory_name = name  # type: ignore[attr-defined]
    return make


CASES = [pytest.param(_builder(name), id=name) for name in _factory_names()] + [
    pytest.param(make, id=name) for name, make in COMBOS.items()
]


def member(tree: Any, i: int) -> Any:
    return optree.tree_map(lambda t: t[i], tree)


def assert_tensors_only(state: Any) -> None:
    """A state's leaves are all tensors: no None (vmap refuses it as an output), no number."""
    leaves = optree.tree_leaves(state, none_is_leaf=True)
    wrong = [type(x).__name__ for x in leaves if not isinstance(x, torch.Tensor)]
    assert not wrong, f"state leaves that are not tensors: {wrong}"


def assert_same_structure(actual: Any, expected: Any) -> None:
    assert optree.tree_structure(actual, none_is_leaf=True) == optree.tree_structure(
        expected, none_is_leaf=True
    )


@pytest.mark.parametrize("make", CASES)
def test_state_crosses_vmap(make):
    """``vmap(init)`` over a batch of params, then two vmapped updates over a batch of
    grads: the states and updates of running each member alone."""
    skip_if_sparse_only(make)
    tx = make()
    params = model_params(BATCH, dtype=dtype_for(make), rows=rows_for(make))
    state = vmap(tx.init)(params)
    assert_tensors_only(state)
    alone = [tx.init(member(params, i)) for i in range(BATCH)]
    for i in range(BATCH):
        assert_same_structure(state, alone[i])
        assert_same(member(state, i), alone[i], **TOL)
    g = torch.Generator().manual_seed(1)
    for _ in range(2):
        grads = optree.tree_map(lambda p: torch.randn(p.shape, generator=g, dtype=p.dtype), params)
        updates, new_state = vmap(functools.partial(tx.update, value_fn=objective))(grads, state, params)
        assert_tensors_only(new_state)
        assert_same_structure(new_state, state)  # a state a loop (or a compiled step) can carry
        for i in range(BATCH):
            expected, alone[i] = tx.update(member(grads, i), alone[i], member(params, i), value_fn=objective)
            assert_same(member(updates, i), expected, **TOL)
            assert_same(member(new_state, i), alone[i], **TOL)
        params, state = fo.apply_updates(params, updates), new_state


@pytest.mark.parametrize("make", CASES)
def test_state_crosses_grad(make):
    """The state goes into ``torch.func.grad`` and comes out as its auxiliary output; the
    gradient through the update is autograd's."""
    skip_if_sparse_only(make)
    tx = make()
    params = model_params(dtype=dtype_for(make), rows=rows_for(make))
    grads = model_params(seed=1, dtype=dtype_for(make), rows=rows_for(make))
    state = tx.init(params)
    assert_tensors_only(state)

    def loss(p: Any, s: Any) -> tuple[torch.Tensor, Any]:
        updates, new = tx.update(grads, s, p, value_fn=objective)
        new_params = fo.apply_updates(p, updates)
        return sum(t.pow(2).sum() for t in optree.tree_leaves(new_params)), new

    g, new_state = grad(loss, has_aux=True)(params, state)
    assert_tensors_only(new_state)
    assert_same_structure(new_state, state)
    assert_same(new_state, tx.update(grads, state, params, value_fn=objective)[1], **TOL)
    leaves = [t.clone().requires_grad_() for t in optree.tree_leaves(params)]
    value, _ = loss(optree.tree_unflatten(optree.tree_structure(params), leaves), state)
    expected = torch.autograd.grad(value, leaves)
    assert_same(optree.tree_leaves(g), list(expected), **TOL)


@pytest.mark.slow
@pytest.mark.parametrize("make", CASES)
def test_state_crosses_compile(make):
    """``torch.compile(fullgraph=True)`` of a step takes and returns the state: the eager
    steps' results. (test_masking and test_functional check, for some, that nothing
    recompiles after the first step.)"""
    import torch._dynamo

    skip_if_sparse_only(make)
    info = _info(make)
    if info is not None and info.step_requires_closure:
        pytest.skip(
            f"{info.name}'s update unrolls max_iter x history_size rounds under torch.compile: minutes "
            "of tracing at the defaults (tests/test_lbfgs.py compiles a small configuration)"
        )
    tx = make()
    params = model_params(dtype=dtype_for(make), rows=rows_for(make))
    g = torch.Generator().manual_seed(1)
    grads_seq = [
        optree.tree_map(lambda p: torch.randn(p.shape, generator=g, dtype=p.dtype), params) for _ in range(3)
    ]

    def step(grads: Any, state: Any, params: Any) -> tuple[Any, Any]:
        updates, state = tx.update(grads, state, params, value_fn=objective)
        return fo.apply_updates(params, updates), state

    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True, backend="eager")
    eager_p, eager_s = params, tx.init(params)
    comp_p, comp_s = params, torch.compile(tx.init, fullgraph=True, backend="eager")(params)
    assert_tensors_only(comp_s)
    assert_same(comp_s, eager_s, **TOL)
    for grads in grads_seq:
        eager_p, eager_s = step(grads, eager_s, eager_p)
        comp_p, comp_s = compiled(grads, comp_s, comp_p)
        assert_tensors_only(comp_s)
    assert_same(comp_p, eager_p, rtol=1e-5, atol=1e-6)
    assert_same(comp_s, eager_s, rtol=1e-5, atol=1e-6)


def test_discovery_finds_the_algorithms():
    """The discovery above sees the factories (a rename of `fo.__all__` would silently
    test nothing)."""
    names = _factory_names()
    assert {"adadelta", "adagrad", "adamax", "nadam", "clip_by_global_norm", "chain"} <= set(names)
