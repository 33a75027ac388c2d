"""Shared test helpers: torch's own optimizer test tables, and state comparisons."""

from __future__ import annotations

import copy
import functools
import inspect
from collections.abc import Collection
from typing import Any

import optree
import pytest
import torch
from torch.testing._internal.common_optimizers import (
    _get_optim_inputs_including_global_cliquey_kwargs,
    optim_db,
)
from torch.testing._internal.common_utils import set_default_dtype as set_default_dtype  # for the tests

import funcopt as fo
from funcopt._src.engine.algorithm import Algorithm

# every torch.optim-compatible class funcopt exports (its torch twin has the same name):
# those on funcopt's engine (fo.Optimizer), and LBFGS (a torch.optim.Optimizer of its own)
ALGORITHMS = sorted(
    name
    for name in fo.__all__
    if isinstance(getattr(fo, name), type)
    and issubclass(getattr(fo, name), torch.optim.Optimizer)
    and getattr(fo, name) is not fo.Optimizer
    and isinstance(getattr(torch.optim, name, None), type)
)
IMPLEMENTATION_FLAGS = ("foreach", "fused", "capturable", "differentiable")
INFOS = {info.optim_cls.__name__: info for info in optim_db if info.optim_cls.__name__ in ALGORITHMS}


def torch_cls(name: str) -> type[torch.optim.Optimizer]:
    return getattr(torch.optim, name)


def fo_cls(name: str) -> type[torch.optim.Optimizer]:
    return getattr(fo, name)


def factory(name: str):
    """The factory of the class `name`: its name lower-cased (fo.nadam), or in snake case
    where that is no name (fo.sparse_adam)."""
    snake = "".join(f"_{c.lower()}" if c.isupper() and i else c.lower() for i, c in enumerate(name))
    return getattr(fo, name.lower(), None) or getattr(fo, snake)


def skip_unless_steps_on_gradients(name: str) -> None:
    """Skip the calling test, which steps `name` on the dense gradients it gives alone,
    where torch's own OptimizerInfo says that cannot be: LBFGS's step needs a closure
    (and fo.lbfgs's update the objective, value_fn), SparseAdam takes sparse gradients
    only. Their own tests (tests/test_lbfgs.py, tests/test_sparse_adam.py) cover it."""
    skip_if_closure_required(name)
    if INFOS[name].only_supports_sparse_grads:
        pytest.skip(
            f"{name} takes sparse gradients only (only_supports_sparse_grads); this test gives dense ones"
        )


def steps_on_dense_gradients(name: str) -> bool:
    """Whether `name`'s step takes the dense gradients of a backward pass alone, as
    torch's OptimizerInfo says: not LBFGS (its step needs a closure,
    step_requires_closure), not SparseAdam (sparse gradients only,
    only_supports_sparse_grads). Whether it steps params of every shape is
    `matrices_only`."""
    info = INFOS[name]
    return not info.step_requires_closure and not info.only_supports_sparse_grads


def skip_if_closure_required(name: str) -> None:
    """Skip the calling test, which steps `name` without a closure (or updates without
    the objective), where torch's OptimizerInfo says its step requires one (LBFGS)."""
    if INFOS[name].step_requires_closure:
        pytest.skip(
            f"{name}'s step requires a closure (step_requires_closure), and fo.{factory(name).__name__}'s "
            "update the objective (value_fn): this test steps without"
        )


# The test values of each algorithm's hyperparameters: the one table a new algorithm adds
# an entry to (tests/test_properties.py draws random ones). Every hyperparameter is set
# away from its default, to a value where it changes the result (eps included), and the
# betas are given apart, so that each can be differentiated and batched on its own.
HYPER: dict[str, dict[str, float]] = {
    # t0 moves only the average (state.ax), never the params (tests/test_asgd.py)
    "ASGD": {"lr": 0.05, "lambd": 0.1, "alpha": 0.6, "weight_decay": 0.05},
    "Adadelta": {"lr": 0.5, "rho": 0.8, "eps": 1e-3, "weight_decay": 0.05},
    "Adagrad": {
        "lr": 0.1,
        "lr_decay": 0.1,
        "weight_decay": 0.05,
        "initial_accumulator_value": 0.2,
        "eps": 1e-3,
    },
    # eps is a pair, eps1 and eps2 apart (see kwargs_of)
    "Adafactor": {
        "lr": 0.05,
        "beta2_decay": -0.6,
        "eps1": 0.05,
        "eps2": 1.02,
        "d": 1.05,
        "weight_decay": 0.05,
    },
    "Adam": {"lr": 0.05, "beta1": 0.8, "beta2": 0.9, "eps": 1e-3, "weight_decay": 0.05},
    "AdamW": {"lr": 0.05, "beta1": 0.8, "beta2": 0.9, "eps": 1e-3, "weight_decay": 0.2},
    "Adamax": {"lr": 0.05, "beta1": 0.8, "beta2": 0.9, "eps": 1e-3, "weight_decay": 0.05},
    "NAdam": {
        "lr": 0.05,
        "beta1": 0.8,
        "beta2": 0.9,
        "eps": 1e-3,
        "weight_decay": 0.05,
        "momentum_decay": 0.05,
    },
    # max_iter, max_eval and history_size are ints: they set the loops, never tensors
    "LBFGS": {"lr": 0.5, "tolerance_grad": 1e-3, "tolerance_change": 1e-4},
    # eps bounds a norm from below (never reached: no hypergradient); ns_coefficients a triple
    "Muon": {"lr": 0.05, "weight_decay": 0.05, "momentum": 0.8},
    # betas and eps change nothing before RAdam's rectification starts, at the sixth step
    # (the shared tests take three): tests/test_radam.py checks them over more steps
    "RAdam": {"lr": 0.05, "weight_decay": 0.05},
    # centered is a flag (tests/test_rmsprop.py)
    "RMSprop": {"lr": 0.01, "alpha": 0.9, "eps": 1e-3, "weight_decay": 0.05, "momentum": 0.5},
    # etas given apart (see kwargs_of); step_sizes at their default: a clamp that acts makes
    # the step non-linear in lr, which test_first_order_maml relies on (tests/test_rprop.py)
    "Rprop": {"lr": 0.1, "etaminus": 0.4, "etaplus": 1.3},
    "SGD": {"lr": 0.1, "momentum": 0.8, "dampening": 0.2, "weight_decay": 0.05},
    "SparseAdam": {"lr": 0.05, "beta1": 0.8, "beta2": 0.9, "eps": 1e-3},
}


def kwargs_of(hp: dict[str, Any]) -> dict[str, Any]:
    """Hyperparameters as the factories and classes take them: beta1 and beta2 as `betas`."""
    hp = dict(hp)
    if "beta1" in hp:
        hp["betas"] = (hp.pop("beta1"), hp.pop("beta2"))
    if "etaminus" in hp:
        hp["etas"] = (hp.pop("etaminus"), hp.pop("etaplus"))
    if "eps1" in hp:
        hp["eps"] = (hp.pop("eps1"), hp.pop("eps2"))
    return hp


def as_tensors(
    kwargs: dict[str, Any], dtype: torch.dtype, names: Collection[str] | None = None
) -> dict[str, Any]:
    """`kwargs` with the hyperparameters among `names` (default: all but the boolean
    flags) as 0-d tensors of `dtype`; a pair, such as betas, as a tuple of two."""
    if names is None:
        names = [k for k, v in kwargs.items() if not isinstance(v, bool)]
    tensor = lambda v: torch.tensor(v, dtype=dtype)  # noqa: E731
    return {
        k: v if k not in names else tuple(map(tensor, v)) if isinstance(v, tuple) else tensor(v)
        for k, v in kwargs.items()
    }


def make(name: str, hp: dict[str, Any] | None = None) -> fo.GradientTransformation:
    """The transformation of `name` with the hyperparameters `hp` (default: its `HYPER`)."""
    return factory(name)(**kwargs_of(HYPER[name] if hp is None else hp))


def weight_decay(name: str, value: float) -> dict[str, float]:
    """``{"weight_decay": value}`` where the class `name` takes a weight decay, else no
    keyword (Rprop has none, as torch's)."""
    return {"weight_decay": value} if "weight_decay" in inspect.signature(fo_cls(name)).parameters else {}


def algorithm(name: str) -> Algorithm | None:
    """The engine's `Algorithm` of the class `name` (its flags: needs_params, counters,
    per_element, ...), or None for a class off the engine (LBFGS)."""
    # a matrix: Muon's class takes 2-D params only
    transform = getattr(fo_cls(name)([torch.zeros(2, 2, requires_grad=True)]), "_transform", None)
    return transform if isinstance(transform, Algorithm) else None


def needs_params(name: str) -> bool:
    """Whether `name`'s update reads the params beyond weight decay (Algorithm.needs_params:
    ASGD's average, Adafactor's step size): then ``update(grads, state)`` is refused."""
    algo = algorithm(name)
    return algo is not None and algo.needs_params


def skip_if_needs_params(name: str) -> None:
    """Skip the calling test, which updates without the params, for an algorithm whose
    math reads them (`needs_params`): its update refuses that by design
    (tests/test_asgd.py and test_adafactor.py check the message)."""
    if needs_params(name):
        pytest.skip(f"{name}'s update reads the params (needs_params): it refuses an update without them")


def full_state(tx: fo.GradientTransformation, params: Any) -> Any:
    """`tx`'s state for `params`, with every buffer there: stepped once (with gradients of
    ones) where init leaves one absent that the first step creates (SGD's momentum_buffer)."""
    state = tx.init(params)
    if any(isinstance(x, fo.MaskedNode) for x in optree.tree_leaves(state, is_leaf=is_empty)):
        _, state = tx.update(optree.tree_map(torch.ones_like, params), state, params)
    return state


def is_empty(x: Any) -> bool:
    """Whether `x` is an empty node (a buffer absent from a functional state)."""
    return isinstance(x, fo.MaskedNode)


def creates_at_first_step(name: str) -> bool:
    """Whether `name`'s first step creates a buffer (SGD's momentum_buffer, with its
    `HYPER` values): a functional state then changes structure once, there."""
    params = {"w": torch.zeros(2, 2)}
    tx = make(name)
    state = tx.init(params)
    _, stepped = tx.update({"w": torch.ones(2, 2)}, state, params)
    return optree.tree_structure(stepped) != optree.tree_structure(state)


def skip_without_counters(state: Any) -> None:
    """Skip a test of step counters for an algorithm whose state has none (SGD)."""
    if "step" not in state._fields:
        pytest.skip(f"{type(state).__name__} has no step counter (as torch's state has none)")


# -- what a class supports, for the shared suites to skip or adapt what it does not -----


def supports_complex(name: str) -> bool:
    """Whether torch's class steps complex params (its OptimizerInfo's supports_complex;
    Adafactor and Muon refuse them at the step)."""
    return INFOS[name].supports_complex


def takes(name: str, arg: str) -> bool:
    """Whether the class's constructor takes `arg`, as torch's does (torch's Adafactor
    has no differentiable or capturable switch, Muon no switch and no maximize)."""
    return arg in inspect.signature(fo_cls(name)).parameters


@functools.cache
def matrices_only(name: str) -> bool:
    """Whether torch's class steps 2-D params only (Muon: it refuses others at
    construction)."""
    try:
        torch_cls(name)([torch.nn.Parameter(torch.zeros(2))])
    except ValueError:
        return True
    return False


def skip_unsupported(
    name: str, *, complex: bool = False, vectors: bool = False, flags: Collection[str] = ()
) -> None:
    """Skip a test that needs what torch's class `name` does not support either: complex
    params, params that are not matrices (vectors, 0-d; the test's fixture has some), one
    of torch's switches (differentiable, capturable, foreach)."""
    if complex and not supports_complex(name):
        pytest.skip(f"{name} does not support complex params (supports_complex, as torch's)")
    if vectors and matrices_only(name):
        pytest.skip(f"{name} steps 2-D params only (as torch's); this test's fixture has vectors")
    for flag in flags:
        if not takes(name, flag):
            pytest.skip(f"{name} has no {flag} switch (as torch's)")


def matrices_for(name: str, tree: Any) -> Any:
    """A fixture's tensors as `name` steps them: for a class that steps matrices only
    (Muon), each vector as a row ``(1, n)`` and each 0-d tensor as ``(1, 1)`` (a bias
    broadcasts the same); else the tree itself."""
    if not matrices_only(name):
        return tree
    return optree.tree_map(
        lambda t: t if not isinstance(t, torch.Tensor) or t.dim() == 2 else t.reshape(1, -1),
        tree,
        none_is_leaf=True,
    )


def supported(name: str, params: list[torch.Tensor]) -> list[torch.Tensor]:
    """The params of a fixture that `name` steps: its matrices only where it steps no
    other, its real ones where it steps no complex ones."""
    return [
        p
        for p in params
        if (p.dim() == 2 or not matrices_only(name)) and (not p.is_complex() or supports_complex(name))
    ]


def optim_inputs(name: str, with_flags: bool = True) -> list[tuple[str, dict[str, Any]]]:
    """torch's CPU configurations for `name` as (description, kwargs); with the
    implementation flags torch tests on CPU (differentiable, fused), plus foreach."""
    info = INFOS[name]
    if with_flags:
        inputs = _get_optim_inputs_including_global_cliquey_kwargs("cpu", torch.float32, info)
    else:
        inputs = info.optim_inputs_func("cpu")
    out = [(i.desc, copy.deepcopy(i.kwargs)) for i in inputs]
    if with_flags and "foreach" in inspect.signature(torch_cls(name)).parameters:  # not SparseAdam's
        out += [(f"{i.desc} & foreach", {**i.kwargs, "foreach": True}) for i in info.optim_inputs_func("cpu")]
    return out


def functional_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in kwargs.items() if k not in IMPLEMENTATION_FLAGS}


def assert_same(actual: Any, expected: Any, path: str = "", **tol: Any) -> None:
    """Recursive equality: tensors by assert_close (dtype and device checked), the rest by ==."""
    if isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor), f"{path}: {type(actual)} is not a tensor"
        torch.testing.assert_close(actual.detach(), expected.detach(), msg=lambda m: f"{path}: {m}", **tol)
    elif isinstance(expected, dict):
        assert isinstance(actual, dict) and actual.keys() == expected.keys(), (
            f"{path}: keys {sorted(map(str, actual))} != {sorted(map(str, expected))}"
        )
        for k in expected:
            assert_same(actual[k], expected[k], f"{path}.{k}", **tol)
    elif isinstance(expected, (list, tuple)):
        assert type(actual) is type(expected) and len(actual) == len(expected), (
            f"{path}: {actual!r} != {expected!r}"
        )
        for i, (a, e) in enumerate(zip(actual, expected)):
            assert_same(a, e, f"{path}[{i}]", **tol)
    else:
        assert actual == expected, f"{path}: {actual!r} != {expected!r}"


def run(tx: fo.GradientTransformation, params: Any, grads_seq: list[Any]) -> tuple[Any, Any]:
    """The params and state after one pure step of `tx` per gradient tree in `grads_seq`."""
    state = tx.init(params)
    for grads in grads_seq:
        updates, state = tx.update(grads, state, params)
        params = fo.apply_updates(params, updates)
    return params, state


def compiled_and_eager_steps(
    tx: fo.GradientTransformation, params: Any, grads_seq: list[Any], backend: str = "aot_eager"
) -> tuple[tuple[Any, Any], tuple[Any, Any]]:
    """(params, state) after one step of `tx` (update + apply_updates) per gradient tree,
    compiled (``torch.compile(fullgraph=True)``; a recompile after the first step fails)
    and eager."""
    import torch._dynamo

    torch._dynamo.reset()

    def step(grads: Any, state: Any, params: Any) -> tuple[Any, Any]:
        updates, state = tx.update(grads, state, params)
        return fo.apply_updates(params, updates), state

    compiled = torch.compile(step, fullgraph=True, backend=backend)
    eager_p, eager_s = params, tx.init(params)
    comp_p, comp_s = params, tx.init(params)
    first = None  # a state whose structure the first step changes (SGD's momentum_buffer,
    for i, grads in enumerate(grads_seq):  # created there) compiles once more, at the second
        eager_p, eager_s = step(grads, eager_s, eager_p)
        if i == 0:
            first = optree.tree_structure(eager_s) != optree.tree_structure(comp_s)
        with torch._dynamo.config.patch(error_on_recompile=i > (1 if first else 0)):
            comp_p, comp_s = compiled(grads, comp_s, comp_p)
    return (comp_p, comp_s), (eager_p, eager_s)


def hypergradients_both_ways(
    optimizer: Any, transform: Any, values: dict[str, float], steps: int = 3
) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]:
    """The loss after `steps` steps of ``optimizer([w], hp)`` (a differentiable=True torch
    optimizer; each step on a gradient taken with create_graph), and its gradients with
    respect to each hyperparameter of `hp` (the `values` as float64 tensors that require
    grad) and to the initial params; then the same through ``fo.inner_loop`` with
    ``transform(hp)``. The loss saves no param for its backward: the steps write into
    the param in place, which such a loss would see (docs/recipes.md, Hypergradients)."""
    with set_default_dtype(torch.float64):  # float64 counters, as the functional path's
        torch.manual_seed(0)
        w0, x = torch.randn(5, 3, requires_grad=True), torch.randn(8, 5)
        hp = {k: torch.tensor(v, requires_grad=True) for k, v in values.items()}

        def loss_fn(params):
            return (x @ params["w"]).tanh().pow(2).sum()

        w = w0.clone()
        opt = optimizer([w], hp)
        for _ in range(steps):
            (w.grad,) = torch.autograd.grad(loss_fn({"w": w}), w, create_graph=True)
            opt.step()
        final = loss_fn({"w": w})
        ours = (final, *torch.autograd.grad(final, (*hp.values(), w0)))

        def functional(hp, w0):
            adapted, _, _ = fo.inner_loop(loss_fn, {"w": w0}, transform(hp), [()] * steps)
            return loss_fn(adapted)

        hypergrads, w0_grad = torch.func.grad(functional, argnums=(0, 1))(hp, w0.detach())
        return ours, (functional(hp, w0), *hypergrads.values(), w0_grad)


def make_params(dtype: torch.dtype, seed: int = 0) -> list[torch.Tensor]:
    """Mixed shapes: a matrix, a non-contiguous matrix, a vector and a 0-d tensor."""
    g = torch.Generator().manual_seed(seed)
    return [
        torch.randn(10, 5, generator=g, dtype=dtype),
        torch.randn(6, 4, 2, generator=g, dtype=dtype)[..., 0],
        torch.randn(7, generator=g, dtype=dtype),
        torch.randn((), generator=g, dtype=dtype),
    ]


def trainable(base: list[torch.Tensor], differentiable: bool) -> list[torch.Tensor]:
    """Params to step, cloned from `base`: leaves that require grad, or non-leaves for
    torch's differentiable step (it updates params in place inside the graph)."""
    leaves = [p.clone().requires_grad_() for p in base]
    return [p.clone() for p in leaves] if differentiable else leaves


def assert_matches_torch(
    name: str,
    kwargs: dict[str, Any],
    base: list[torch.Tensor],
    grad_steps,
    adapter_tol: dict[str, Any] | None = None,
    **functional_tol: Any,
) -> None:
    """Run torch.optim.X, funcopt.X and funcopt.x side by side from the params `base`,
    one step per list of gradients in `grad_steps`; params and state must agree (the
    class within `adapter_tol`, the functional path within `functional_tol`, default:
    assert_close's)."""
    ref_params = [p.clone().requires_grad_() for p in base]
    our_params = [p.clone().requires_grad_() for p in base]
    ref, ours = torch_cls(name)(ref_params, **kwargs), fo_cls(name)(our_params, **kwargs)
    tx = factory(name)(**functional_kwargs(kwargs))
    f_params, f_state = list(base), tx.init(list(base))
    for grads in grad_steps:
        for ps in (ref_params, our_params):
            for p, g in zip(ps, grads):
                p.grad = g.clone()
        ref.step()
        ours.step()
        updates, f_state = tx.update(grads, f_state, f_params)
        f_params = fo.apply_updates(f_params, updates)
    assert_same(our_params, ref_params, **(adapter_tol or {}))
    assert_same(ours.state_dict(), ref.state_dict(), **(adapter_tol or {}))
    assert_same(f_params, ref_params, **functional_tol)
