"""optax's line searches (`scale_by_backtracking_linesearch`, `scale_by_zoom_linesearch`,
`value_and_grad_from_state`) and `scale_by_lbfgs` against optax itself: 20 steps in
float64 beside optax on JAX, on a quadratic and on Rosenbrock's function, params equal
to 1e-9 relative; the extra arguments, their errors, and the traced (masked-loop) mode."""

from __future__ import annotations

import math
import pickle
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
A = np.array([[3.0, 1.0, 0.0], [1.0, 2.0, 0.5], [0.0, 0.5, 1.0]])


def quadratic(p: Any, lib: Any) -> Any:
    """``0.5 x'Ax - b'x + |y|^2`` over params {"x": (3,), "y": (2, 2)}."""
    x = p["x"]
    a = lib.asarray(A) if lib is jnp else torch.tensor(A)
    return 0.5 * lib.sum(x * (a @ x)) - lib.sum(x * lib.asarray([1.0, -1.0, 2.0])) + lib.sum(p["y"] ** 2)


def rosenbrock(p: Any, lib: Any) -> Any:
    x = lib.concatenate([p["x"], p["y"].reshape(-1)])
    return lib.sum(100.0 * (x[1:] - x[:-1] ** 2) ** 2 + (1 - x[:-1]) ** 2)


OBJECTIVES = {"quadratic": quadratic, "rosenbrock": rosenbrock}


def start() -> dict[str, torch.Tensor]:
    return {
        "x": torch.tensor([-1.2, 1.0, 0.5], dtype=torch.float64),
        "y": torch.tensor([[0.3, -0.4], [0.8, 1.1]], dtype=torch.float64),
    }


def to_jax(t: Any) -> Any:
    return optree.tree_map(lambda x: jnp.asarray(x.detach().numpy()), t)


def run_both(tx: Any, otx: Any, name: str, from_state: bool, steps: int = STEPS) -> Any:
    """`steps` steps of each on objective `name`, the value and gradient either computed
    at each step or taken from the state (value_and_grad_from_state); params compared at
    every step, the state's structure with init's. Returns the last states."""
    f = lambda p: OBJECTIVES[name](p, torch)  # noqa: E731
    of = lambda p: OBJECTIVES[name](p, jnp)  # noqa: E731
    vg = fo.value_and_grad_from_state(f)
    ovg = jax.jit(lambda p, s: optax.value_and_grad_from_state(of)(p, state=s))
    ovalue_and_grad = jax.jit(jax.value_and_grad(of))
    oupdate = jax.jit(lambda g, s, p, v: otx.update(g, s, p, value=v, grad=g, value_fn=of))  # eager jax: slow
    params, oparams = start(), to_jax(start())
    state, ostate = tx.init(params), otx.init(oparams)
    spec = optree.tree_structure(state)
    for step in range(steps):
        if from_state:
            value, grad = vg(params, state=state)
            ovalue, ograd = ovg(oparams, ostate)
        else:
            grad, value = torch.func.grad_and_value(f)(params)
            ovalue, ograd = ovalue_and_grad(oparams)
        updates, state = tx.update(grad, state, params, value=value, grad=grad, value_fn=f)
        oupdates, ostate = oupdate(ograd, ostate, oparams, ovalue)
        params, oparams = fo.apply_updates(params, updates), optax.apply_updates(oparams, oupdates)
        for k in params:
            np.testing.assert_allclose(
                params[k].numpy(), np.asarray(oparams[k]), **TOL, err_msg=f"step {step}"
            )
        assert optree.tree_structure(state) == spec
    return state, ostate


# each option on Rosenbrock's function, the defaults on the quadratic too
BACKTRACKING = [
    ("quadratic", {"max_backtracking_steps": 40}),
    *(("rosenbrock", hp) for hp in [
    {"max_backtracking_steps": 40},
    {"max_backtracking_steps": 40, "store_grad": True},
    {"max_backtracking_steps": 5, "decrease_factor": 0.5, "store_grad": True},  # runs out of trials
    {"max_backtracking_steps": 30, "slope_rtol": 0.3, "increase_factor": 1.0, "max_learning_rate": 0.4},
    {"max_backtracking_steps": 30, "increase_factor": math.inf, "max_learning_rate": 0.05},
    {"max_backtracking_steps": 30, "atol": 1e-3, "rtol": 1e-4},
    ]),
]  # fmt: skip


@pytest.mark.parametrize(("name", "hp"), BACKTRACKING, ids=str)
def test_sgd_with_backtracking_matches_optax(name, hp):
    tx = fo.chain(fo.sgd(lr=1.0), fo.scale_by_backtracking_linesearch(**hp))
    otx = optax.chain(optax.sgd(1.0), optax.scale_by_backtracking_linesearch(**hp))
    state, ostate = run_both(tx, otx, name, from_state=hp.get("store_grad", False))
    ls, ols = state[1], ostate[1]
    assert int(ls.info.num_linesearch_steps) == int(ols.info.num_linesearch_steps)
    np.testing.assert_allclose(float(ls.learning_rate), float(ols.learning_rate), **TOL)
    np.testing.assert_allclose(float(ls.value), float(ols.value), **TOL)


ZOOM = [
    ("quadratic", {}),
    *(("rosenbrock", hp) for hp in [
    {},
    {"initial_guess_strategy": "one"},
    {"max_learning_rate": 0.5, "curv_rtol": 0.5, "slope_rtol": 1e-3},
    {"approx_dec_rtol": None, "increase_factor": 3.0, "tol": 1e-8},
    {"curv_rtol": math.inf},
    {"stepsize_precision": 1e-2, "max_linesearch_steps": 6},
    ]),
]  # fmt: skip


@pytest.mark.parametrize(("name", "hp"), ZOOM, ids=str)
def test_sgd_with_zoom_matches_optax(name, hp):
    hp = {"max_linesearch_steps": 30, **hp}
    tx = fo.chain(fo.sgd(lr=1.0), fo.scale_by_zoom_linesearch(**hp))
    otx = optax.chain(optax.sgd(1.0), optax.scale_by_zoom_linesearch(**hp))
    state, ostate = run_both(tx, otx, name, from_state=True)
    ls, ols = state[1], ostate[1]
    assert int(ls.info.num_linesearch_steps) == int(ols.info.num_linesearch_steps)


@pytest.mark.parametrize(
    ("name", "hp", "from_state"),
    [
        ("rosenbrock", {}, True),
        ("rosenbrock", {}, False),
        ("quadratic", {}, True),
        ("rosenbrock", {"memory_size": 3, "scale_init_precond": False}, True),
        ("quadratic", {"memory_size": 1}, False),
    ],
    ids=str,
)
def test_lbfgs_with_zoom_matches_optax_lbfgs(name, hp, from_state):
    """optax's ``lbfgs`` is this chain of public blocks."""
    tx = fo.chain(
        fo.scale_by_lbfgs(**hp), fo.scale(-1.0), fo.scale_by_zoom_linesearch(20, initial_guess_strategy="one")
    )
    state, ostate = run_both(tx, optax.lbfgs(**hp), name, from_state=from_state)
    for ours, theirs in zip(optree.tree_leaves(state[0]), jax.tree.leaves(ostate[0])):
        np.testing.assert_allclose(ours.numpy(), np.asarray(theirs), **TOL)


def test_backtracking_passes_data_to_value_fn():
    """Extra arguments that value_fn names (input data) go to it, as in optax's example."""

    def fn(params: Any, x: Any, y: Any) -> Any:
        return 0.5 * ((x * params).sum() - y) ** 2

    ofn = lambda params, x, y: 0.5 * (jnp.sum(x * params) - y) ** 2  # noqa: E731
    tx = fo.chain(fo.sgd(lr=1.0), fo.scale_by_backtracking_linesearch(max_backtracking_steps=15))
    otx = optax.chain(optax.sgd(1.0), optax.scale_by_backtracking_linesearch(max_backtracking_steps=15))
    params = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)
    oparams = jnp.asarray(params.numpy())
    state, ostate = tx.init(params), otx.init(oparams)
    for i in range(5):
        x, y = torch.tensor([3.0, 2.0, 1.0 + i], dtype=torch.float64), torch.tensor(0.5, dtype=torch.float64)
        g, v = torch.func.grad_and_value(fn)(params, x, y)
        updates, state = tx.update(g, state, params, value=v, grad=g, value_fn=fn, x=x, y=y)
        params = fo.apply_updates(params, updates)
        ox, oy = jnp.asarray(x.numpy()), jnp.asarray(y.numpy())
        ov, og = jax.value_and_grad(ofn)(oparams, ox, oy)
        oupdates, ostate = otx.update(og, ostate, oparams, value=ov, grad=og, value_fn=ofn, x=ox, y=oy)
        oparams = optax.apply_updates(oparams, oupdates)
        np.testing.assert_allclose(params.numpy(), np.asarray(oparams), **TOL)


# ---------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "make",
    [
        lambda: fo.scale_by_backtracking_linesearch(10),
        lambda: fo.scale_by_zoom_linesearch(10),
    ],
)
def test_missing_extra_arguments_are_named(make):
    tx = make()
    params = start()
    f = lambda p: quadratic(p, torch)  # noqa: E731
    grad, value = torch.func.grad_and_value(f)(params)
    state = tx.init(params)
    for missing in ("value", "grad", "value_fn"):
        kw = {"value": value, "grad": grad, "value_fn": f}
        del kw[missing]
        with pytest.raises(ValueError, match=f"needs the extra arguments {missing}:"):
            tx.update(grad, state, params, **kw)
    with pytest.raises(ValueError, match="value, grad, value_fn"):
        tx.update(grad, state, params)
    with pytest.raises(TypeError, match=r"unexpected keyword arguments \['data'\]"):
        tx.update(grad, state, params, value=value, grad=grad, value_fn=f, data=1.0)
    with pytest.raises(ValueError, match="needs the params"):
        tx.update(grad, state, None, value=value, grad=grad, value_fn=f)


def test_value_fn_taking_kwargs_gets_them_all():
    seen = {}

    def f(p: Any, **data: Any) -> Any:
        seen.update(data)
        return quadratic(p, torch)

    tx = fo.scale_by_backtracking_linesearch(10)
    params = start()
    grad, value = torch.func.grad_and_value(f)(params)
    tx.update(grad, tx.init(params), params, value=value, grad=grad, value_fn=f, batch=3)
    assert seen == {"batch": 3}


def test_bad_arguments():
    with pytest.raises(TypeError, match="max_backtracking_steps must be an int"):
        fo.scale_by_backtracking_linesearch(2.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=">= 0"):
        fo.scale_by_backtracking_linesearch(-1)
    with pytest.raises(ValueError, match="initial_guess_strategy must be 'one' or 'keep'"):
        fo.scale_by_zoom_linesearch(10, initial_guess_strategy="two")
    with pytest.raises(ValueError, match="memory_size must be an int >= 1"):
        fo.scale_by_lbfgs(memory_size=0)


def test_value_and_grad_from_state_needs_a_stored_grad():
    f = lambda p: quadratic(p, torch)  # noqa: E731
    params = start()
    tx = fo.chain(fo.sgd(lr=1.0), fo.scale_by_backtracking_linesearch(10))  # store_grad=False
    with pytest.raises(ValueError, match="no 'grad' found in the state.*store_grad=True"):
        fo.value_and_grad_from_state(f)(params, state=tx.init(params))
    two = fo.chain(fo.scale_by_zoom_linesearch(10), fo.scale_by_zoom_linesearch(10))
    with pytest.raises(KeyError, match="2 entries named 'value'"):
        fo.value_and_grad_from_state(f)(params, state=two.init(params))


def test_optimizer_class_says_what_to_use():
    """fo.Optimizer's step(closure) supplies only value=: the error says so."""
    model = torch.nn.Linear(2, 1)
    opt = fo.Optimizer(model.parameters(), fo.scale_by_zoom_linesearch, max_linesearch_steps=5)

    def closure() -> Any:
        opt.zero_grad()
        loss = model(torch.ones(1, 2)).pow(2).sum()
        loss.backward()
        return loss

    with pytest.raises(ValueError, match="needs the extra arguments grad, value_fn.*functional API"):
        opt.step(closure)


# ---------------------------------------------------------------- tracers, pickles, complex


def _steps(tx: Any, params: Any, f: Any, n: int = 4) -> Any:
    vg = fo.value_and_grad_from_state(f)
    state = tx.init(params)
    for _ in range(n):
        value, grad = vg(params, state=state)
        updates, state = tx.update(grad, state, params, value=value, grad=grad, value_fn=f)
        params = fo.apply_updates(params, updates)
    return params, state


MAKERS = {
    "backtracking": lambda: fo.chain(
        fo.sgd(lr=1.0), fo.scale_by_backtracking_linesearch(30, store_grad=True)
    ),
    "zoom": lambda: fo.chain(fo.sgd(lr=1.0), fo.scale_by_zoom_linesearch(20)),
    "lbfgs": lambda: fo.chain(
        fo.scale_by_lbfgs(memory_size=3),
        fo.scale(-1.0),
        fo.scale_by_zoom_linesearch(15, initial_guess_strategy="one"),
    ),
}


@pytest.mark.parametrize("kind", MAKERS)
def test_vmap_over_problems_equals_the_loop(kind):
    """Under vmap the search runs its largest number of rounds, masked past the stopping
    point: the same params and states as eager runs of each problem."""
    shifts = torch.tensor([0.0, 0.5, -1.0], dtype=torch.float64)

    def run(shift: Any) -> Any:
        f = lambda p: rosenbrock(p, torch) + shift * p["x"].sum()  # noqa: E731
        return _steps(MAKERS[kind](), start(), f)

    batched = torch.func.vmap(run)(shifts)
    for i in range(len(shifts)):
        alone = run(shifts[i])
        for a, b in zip(optree.tree_leaves(batched), optree.tree_leaves(alone)):
            torch.testing.assert_close(a[i], b, rtol=1e-9, atol=1e-12)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["backtracking", "lbfgs"])
def test_compiled_step_equals_eager(kind):
    tx = MAKERS[kind]()
    f = lambda p: rosenbrock(p, torch)  # noqa: E731

    def step(params: Any, state: Any) -> Any:
        grad, value = torch.func.grad_and_value(f)(params)
        updates, state = tx.update(grad, state, params, value=value, grad=grad, value_fn=f)
        return fo.apply_updates(params, updates), state

    compiled = torch.compile(step, backend="eager", fullgraph=True)
    p, s = start(), tx.init(start())
    cp, cs = start(), tx.init(start())
    for _ in range(2):
        p, s = step(p, s)
        cp, cs = compiled(cp, cs)
    for a, b in zip(optree.tree_leaves((cp, cs)), optree.tree_leaves((p, s))):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("kind", MAKERS)
def test_transformations_and_states_pickle_under_public_names(kind, tmp_path):
    tx = MAKERS[kind]()
    _, state = _steps(tx, start(), lambda p: quadratic(p, torch), n=2)
    for obj in (tx, state):
        blob = pickle.dumps(obj)
        assert b"_src" not in blob and b"funcopt" in blob
    torch.save(state, tmp_path / "s.pt")
    loaded = torch.load(tmp_path / "s.pt", weights_only=True)
    for a, b in zip(optree.tree_leaves(loaded), optree.tree_leaves(state)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize("kind", MAKERS)
def test_complex_params_step_as_pairs_of_reals(kind):
    """A complex param steps as the real problem over its (real, imaginary) pairs."""
    target = torch.tensor([1.0 + 2.0j, -0.5 + 0.0j], dtype=torch.complex128)
    weights = torch.tensor([1.0, 4.0], dtype=torch.float64)

    def fc(p: Any) -> Any:
        return (weights * (p["z"] - target).abs() ** 2).sum() + (p["w"] ** 4).sum()

    def fr(p: Any) -> Any:
        return fc({"z": torch.view_as_complex(p["z"]), "w": p["w"]})

    z0 = torch.tensor([0.3 - 1.0j, 2.0 + 0.5j], dtype=torch.complex128)
    w0 = torch.tensor([0.7, -1.2], dtype=torch.float64)
    pc, _ = _steps(MAKERS[kind](), {"z": z0, "w": w0}, fc)
    pr, _ = _steps(MAKERS[kind](), {"z": torch.view_as_real(z0).clone(), "w": w0}, fr)
    torch.testing.assert_close(torch.view_as_real(pc["z"]), pr["z"], rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(pc["w"], pr["w"], rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("kind", ["backtracking", "zoom"])
def test_grad_through_the_search(kind):
    """torch.func.grad of the loss after two steps with respect to the starting point
    equals central differences (the search's unused interpolations stay finite)."""

    def final(x: Any) -> Any:
        f = lambda q: rosenbrock(q, torch)  # noqa: E731
        return f(_steps(MAKERS[kind](), {**start(), "x": x}, f, n=2)[0])

    x = start()["x"]
    g = torch.func.grad(final)(x)
    eps = 1e-6
    numeric = torch.stack(
        [(final(x + eps * e) - final(x - eps * e)) / (2 * eps) for e in torch.eye(3, dtype=x.dtype)]
    )
    torch.testing.assert_close(g, numeric, rtol=1e-5, atol=1e-6)
