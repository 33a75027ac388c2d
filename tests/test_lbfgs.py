"""fo.LBFGS and fo.lbfgs against torch.optim.LBFGS: the class bit for bit (params and
state_dict, its types included) over torch's option table, checkpoints both ways; the
functional update on Rosenbrock, least squares and logistic regression, eager and
traced (the branch-free variant that torch.func transforms and torch.compile take),
vmap over a batch of problems, a gradient through a fit, a compiled update."""

from __future__ import annotations

import copy
import io
import pickle

import optree
import pytest
import torch
from helpers import optim_inputs

import funcopt as fo
import funcopt._src.algorithms.lbfgs as lbfgs_module

# -- problems: an objective of a dict of params, and where to start ------------------


def rosenbrock(dtype):
    def value_fn(ps):
        x = ps["x"]
        return (100 * (x[1:] - x[:-1] ** 2) ** 2 + (1 - x[:-1]) ** 2).sum()

    return value_fn, {"x": torch.tensor([-1.5, 2.0, 0.5, -0.3], dtype=dtype)}


def least_squares(dtype):
    g = torch.Generator().manual_seed(0)
    A, b = torch.randn(20, 6, generator=g, dtype=dtype), torch.randn(20, generator=g, dtype=dtype)

    def value_fn(ps):
        return 0.5 * (A @ ps["w"] + ps["c"] - b).pow(2).sum()

    return value_fn, {"w": torch.zeros(6, dtype=dtype), "c": torch.zeros((), dtype=dtype)}


def logistic_regression(dtype):
    g = torch.Generator().manual_seed(1)
    X, y = torch.randn(40, 5, generator=g, dtype=dtype), (torch.rand(40, generator=g) > 0.5).to(dtype)

    def value_fn(ps):
        z = X @ ps["w"] + ps["b"]
        return torch.nn.functional.binary_cross_entropy_with_logits(z, y) + 1e-3 * ps["w"].pow(2).sum()

    return value_fn, {"w": torch.zeros(5, dtype=dtype), "b": torch.zeros(1, dtype=dtype)}


def complex_least_squares(dtype):
    g = torch.Generator().manual_seed(2)
    A = torch.randn(8, 3, generator=g, dtype=dtype)
    b = torch.randn(8, generator=g, dtype=dtype)

    def value_fn(ps):
        return (A @ ps["z"] - b).abs().pow(2).sum() + ps["r"].pow(2).sum()

    return value_fn, {"z": torch.zeros(3, dtype=dtype), "r": torch.ones(2, dtype=torch.float32)}


PROBLEMS = {"rosenbrock": rosenbrock, "least_squares": least_squares, "logistic": logistic_regression}
OPTIONS = [
    {},
    {"line_search_fn": "strong_wolfe"},
    {"lr": 0.1, "history_size": 3, "max_iter": 7},
    {"history_size": 2, "line_search_fn": "strong_wolfe", "max_iter": 30},
    {"max_iter": 2.5, "tolerance_change": 0.0},  # torch takes floats: `while n_iter < max_iter`
]


def run_class(cls, value_fn, init, kwargs, steps):
    """`steps` steps of `cls` (torch's or funcopt's LBFGS) on `value_fn`: params, state_dict,
    losses, and the closure's calls. The params in key order, as the functional update
    flattens a dict."""
    ps = {k: init[k].clone().requires_grad_() for k in sorted(init)}
    opt = cls(list(ps.values()), **kwargs)
    calls = []

    def closure():
        calls.append(1)
        opt.zero_grad()
        loss = value_fn(ps)
        loss.backward()
        return loss

    losses = [opt.step(closure) for _ in range(steps)]
    return [p.detach() for p in ps.values()], opt.state_dict(), losses, len(calls)


def run_functional(tx, value_fn, params, steps):
    state = tx.init(params)
    for _ in range(steps):
        grads = torch.func.grad(value_fn)(params)
        updates, state = tx.update(grads, state, params, value_fn=value_fn)
        params = fo.apply_updates(params, updates)
    return params, state


def assert_identical(actual, expected, path=""):
    """Equal values of equal types: tensors bit for bit (dtype too), lists entry by entry,
    Python numbers by type and value, as torch's state holds them."""
    assert type(actual) is type(expected), f"{path}: {type(actual)} is not {type(expected)}"
    if isinstance(expected, torch.Tensor):
        assert actual.dtype == expected.dtype and torch.equal(actual, expected), path
    elif isinstance(expected, dict):
        assert actual.keys() == expected.keys(), f"{path}: {sorted(actual)} != {sorted(expected)}"
        for k in expected:
            assert_identical(actual[k], expected[k], f"{path}.{k}")
    elif isinstance(expected, (list, tuple)):
        assert len(actual) == len(expected), path
        for i, (a, e) in enumerate(zip(actual, expected)):
            assert_identical(a, e, f"{path}[{i}]")
    else:
        assert actual == expected or (actual != actual and expected != expected), (
            f"{path}: {actual} != {expected}"
        )


# -- the class -----------------------------------------------------------------------


@pytest.mark.parametrize("options", OPTIONS, ids=str)
@pytest.mark.parametrize("problem", PROBLEMS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_class_bit_for_bit_with_torch(problem, options, dtype):
    value_fn, init = PROBLEMS[problem](dtype)
    expected = run_class(torch.optim.LBFGS, value_fn, init, options, steps=4)
    assert_identical(run_class(fo.LBFGS, value_fn, init, options, steps=4), expected)


@pytest.mark.parametrize("desc,kwargs", optim_inputs("LBFGS", with_flags=False))
def test_class_over_torchs_option_table_with_complex_params(desc, kwargs):
    value_fn, init = complex_least_squares(torch.complex64)
    expected = run_class(torch.optim.LBFGS, value_fn, init, kwargs, steps=3)
    assert_identical(run_class(fo.LBFGS, value_fn, init, kwargs, steps=3), expected)


@pytest.mark.parametrize("direction", ["funcopt->torch", "torch->funcopt"])
@pytest.mark.parametrize("options", OPTIONS[:2], ids=str)
def test_state_dict_loads_both_ways(direction, options):
    """A state_dict saved mid-run by one class (through torch.save and torch.load's
    weights_only default) loads into the other, which then steps as the saver would."""
    src_cls, dst_cls = (fo.LBFGS, torch.optim.LBFGS)
    if direction == "torch->funcopt":
        src_cls, dst_cls = dst_cls, src_cls
    value_fn, init = least_squares(torch.float32)
    ps = {k: v.clone().requires_grad_() for k, v in init.items()}
    src = src_cls(list(ps.values()), max_iter=3, **options)

    def closure_of(opt, params):
        def closure():
            opt.zero_grad()
            loss = value_fn(params)
            loss.backward()
            return loss

        return closure

    src.step(closure_of(src, ps))
    buffer = io.BytesIO()
    torch.save(src.state_dict(), buffer)
    buffer.seek(0)
    saved = torch.load(buffer)
    ps2 = {k: v.detach().clone().requires_grad_() for k, v in ps.items()}
    dst = dst_cls(list(ps2.values()), max_iter=3, **options)
    dst.load_state_dict(saved)
    assert_identical(dst.state_dict(), src.state_dict())
    for _ in range(2):
        src.step(closure_of(src, ps))
        dst.step(closure_of(dst, ps2))
    assert_identical([p.detach() for p in ps2.values()], [p.detach() for p in ps.values()])
    assert_identical(dst.state_dict(), src.state_dict())


def test_unpickled_or_copied_class_steps():
    """torch's LBFGS pickles without its params list and cannot step after; funcopt's can,
    as the original does."""
    value_fn, init = least_squares(torch.float64)
    ps = {k: v.clone().requires_grad_() for k, v in init.items()}
    opt = fo.LBFGS(list(ps.values()), max_iter=3)

    def closure_for(o):
        params = dict(zip(ps, o.param_groups[0]["params"]))

        def closure():
            o.zero_grad()
            loss = value_fn(params)
            loss.backward()
            return loss

        return closure

    opt.step(closure_for(opt))
    for clone in (pickle.loads(pickle.dumps(opt)), copy.deepcopy(opt)):
        clone.step(closure_for(clone))
    opt.step(closure_for(opt))
    assert_identical([p.detach() for p in clone.param_groups[0]["params"]], [p.detach() for p in ps.values()])


def test_errors_as_torch():
    p = torch.nn.Parameter(torch.randn(3))
    for cls in (torch.optim.LBFGS, fo.LBFGS):
        with pytest.raises(ValueError, match="LBFGS doesn't support per-parameter options"):
            cls([{"params": [p]}, {"params": [torch.nn.Parameter(torch.randn(2))]}])
        with pytest.raises(ValueError, match="Invalid learning rate: -1"):
            cls([p], lr=-1)
        opt = cls([p], line_search_fn="bisection")

        def closure(opt=opt):
            opt.zero_grad()
            loss = p.pow(2).sum()
            loss.backward()
            return loss

        with pytest.raises(RuntimeError, match="only 'strong_wolfe' is supported"):
            opt.step(closure)
        assert opt.state[p]["n_iter"] == 1 and opt.state[p]["func_evals"] == 1  # counted, as torch
    with pytest.raises(ValueError, match="Invalid learning rate: -1"):
        fo.lbfgs(lr=-1)


# -- the functional update -------------------------------------------------------------


@pytest.mark.parametrize("options", OPTIONS[:4], ids=str)
@pytest.mark.parametrize("problem", PROBLEMS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_functional_matches_torch(problem, options, dtype):
    """The eager update takes torch's steps; the params differ from torch's by the
    rounding of ``params + (new - params)`` (apply_updates), a float64 ulp here; float32
    runs may then take another decision near convergence."""
    value_fn, init = PROBLEMS[problem](dtype)
    expected, torch_state, *_ = run_class(torch.optim.LBFGS, value_fn, init, options, steps=4)
    params, state = run_functional(fo.lbfgs(**options), value_fn, dict(init), steps=4)
    tol = {"rtol": 1e-10, "atol": 1e-12} if dtype == torch.float64 else {"rtol": 1e-3, "atol": 1e-3}
    torch.testing.assert_close(optree.tree_leaves(params), expected, **tol)
    if dtype == torch.float64:  # the same decisions, so the same counts and history
        torch_state = torch_state["state"][0]
        assert (
            int(state.func_evals) == torch_state["func_evals"] and int(state.n_iter) == torch_state["n_iter"]
        )
        num_old = int(state.num_old)
        assert num_old == len(torch_state["old_dirs"])
        torch.testing.assert_close(state.old_dirs[:num_old], torch.stack(torch_state["old_dirs"]), **tol)
        torch.testing.assert_close(state.d, torch_state["d"], **tol)


@pytest.mark.parametrize("options", OPTIONS[:4], ids=str)
@pytest.mark.parametrize("problem", PROBLEMS)
def test_traced_variant_takes_the_eager_steps(problem, options, monkeypatch):
    """The branch-free variant (every loop to its bound, finished work masked), forced
    here in eager mode, gives the eager update's params and state (float64)."""
    value_fn, init = PROBLEMS[problem](torch.float64)
    options = {**options, "max_iter": min(options.get("max_iter", 20), 8)}
    tx = fo.lbfgs(**options)
    eager = run_functional(tx, value_fn, dict(init), steps=3)
    monkeypatch.setattr(lbfgs_module, "tracing", lambda: True)
    traced = run_functional(tx, value_fn, dict(init), steps=3)
    for a, e in zip(optree.tree_leaves(traced), optree.tree_leaves(eager)):
        torch.testing.assert_close(a, e, rtol=1e-9, atol=1e-12)


def test_state_keeps_its_structure_and_inputs_are_not_mutated():
    value_fn, init = logistic_regression(torch.float32)
    tx = fo.lbfgs(history_size=3, line_search_fn="strong_wolfe")
    params = dict(init)
    state = tx.init(params)
    structure = [(t.shape, t.dtype) for t in state]
    assert state.old_dirs.shape == (3, 6) and state.d.shape == (6,)
    for _ in range(3):
        grads = torch.func.grad(value_fn)(params)
        inputs = (params, grads, state)
        snapshot = optree.tree_map(torch.clone, inputs)
        updates, new_state = tx.update(grads, state, params, value_fn=value_fn)
        for a, b in zip(optree.tree_leaves(inputs), optree.tree_leaves(snapshot)):
            assert torch.equal(a, b)
        assert [(t.shape, t.dtype) for t in new_state] == structure
        params, state = fo.apply_updates(params, updates), new_state
    assert int(state.num_old) == 3  # full: the oldest entries were dropped


def test_functional_takes_none_params_and_none_gradients():
    """A None param leaf is skipped; a None gradient counts as zeros (torch's), and the
    param still moves along the direction."""
    A = torch.tensor([[4.0, 1.0], [1.0, 3.0]], dtype=torch.float64)
    target = torch.tensor([1.0, 2.0], dtype=torch.float64)

    def value_fn(ps):
        x = torch.cat([ps["a"], ps["b"]])
        return 0.5 * x @ A @ x - x @ target

    params = {"a": torch.zeros(1, dtype=torch.float64), "b": torch.zeros(1, dtype=torch.float64), "c": None}
    tx = fo.lbfgs(max_iter=10)
    state = tx.init(params)
    grads = {"a": -target[:1], "b": None, "c": None}  # b's gradient missing: zeros, as torch
    updates, state = tx.update(grads, state, params, value_fn=value_fn)
    assert updates["c"] is None
    new = fo.apply_updates(params, updates)
    assert new["b"] != 0  # moved by the later iterations, which evaluate its gradient
    # (to the gradient tolerance, 1e-7)
    torch.testing.assert_close(
        torch.cat([new["a"], new["b"]]), torch.linalg.solve(A, target), rtol=0, atol=1e-6
    )


def test_update_needs_the_objective():
    tx = fo.lbfgs()
    params = {"w": torch.zeros(2)}
    with pytest.raises(ValueError, match="needs the params and the objective"):
        tx.update({"w": torch.ones(2)}, tx.init(params), params)
    with pytest.raises(TypeError, match=r"^LBFGS init: leaf 0 of params is a tensor of dtype int64"):
        tx.init({"n": torch.tensor(1)})


def test_scheduled_lr_matches_torch_with_lambda_lr():
    """An lr schedule (the state then carries the count) takes the steps torch's class
    takes with LambdaLR."""
    value_fn, init = least_squares(torch.float64)
    schedule = fo.linear_schedule(0.5, 0.1, transition_steps=3)
    ps = {k: v.clone().requires_grad_() for k, v in init.items()}
    opt = torch.optim.LBFGS(list(ps.values()), lr=0.5, max_iter=4)
    lambda_lr = torch.optim.lr_scheduler.LambdaLR(opt, lambda count: schedule(count) / 0.5)

    def closure():
        opt.zero_grad()
        loss = value_fn(ps)
        loss.backward()
        return loss

    for _ in range(4):
        opt.step(closure)
        lambda_lr.step()
    tx = fo.lbfgs(lr=lambda count: 0.5 * (schedule(count) / 0.5), max_iter=4)
    params, state = run_functional(tx, value_fn, dict(init), steps=4)
    assert int(state.count) == 4
    torch.testing.assert_close(
        list(params.values()), [p.detach() for p in ps.values()], rtol=1e-10, atol=1e-12
    )


def test_state_saves_and_pickles():
    value_fn, init = rosenbrock(torch.float32)
    tx = fo.lbfgs(history_size=4)
    params, state = run_functional(tx, value_fn, dict(init), steps=2)
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer)  # weights_only
    assert type(loaded) is fo.LBFGSState
    copy_ = pickle.loads(pickle.dumps(tx))
    grads = torch.func.grad(value_fn)(params)
    a = tx.update(grads, state, params, value_fn=value_fn)
    b = copy_.update(grads, loaded, params, value_fn=value_fn)
    for x, y in zip(optree.tree_leaves(a), optree.tree_leaves(b)):
        assert torch.equal(x, y)


# -- vmap, grad, compile ----------------------------------------------------------------


def batch_of_least_squares(batch=4, dtype=torch.float64):
    g = torch.Generator().manual_seed(3)
    return torch.randn(batch, 10, 3, generator=g, dtype=dtype), torch.randn(
        batch, 10, generator=g, dtype=dtype
    )


def fit(tx, A, b, steps=2):
    def value_fn(ps):
        return 0.5 * (A @ ps["w"] - b).pow(2).sum()

    params, state = run_functional(tx, value_fn, {"w": torch.zeros(A.shape[-1], dtype=A.dtype)}, steps)
    return params["w"], state


@pytest.mark.parametrize(
    "options", [{"max_iter": 6}, {"max_iter": 5, "max_eval": 8, "line_search_fn": "strong_wolfe"}], ids=str
)
def test_vmap_over_a_batch_of_problems_equals_a_loop(options):
    A, b = batch_of_least_squares()
    tx = fo.lbfgs(**options)
    w, state = torch.func.vmap(lambda A, b: fit(tx, A, b))(A, b)
    for i in range(A.shape[0]):
        w_i, state_i = fit(tx, A[i], b[i])
        torch.testing.assert_close(w[i], w_i, rtol=1e-10, atol=1e-12)
        for batched, alone in zip(state, state_i):
            torch.testing.assert_close(batched[i], alone, rtol=1e-10, atol=1e-12)
    solution = torch.linalg.lstsq(A, b.unsqueeze(-1)).solution.squeeze(-1)
    torch.testing.assert_close(w, solution, rtol=1e-5, atol=1e-5)
    assert len(set(state.func_evals.tolist())) > 1  # the members stopped at different points


@pytest.mark.parametrize("line_search_fn", [None, "strong_wolfe"])
def test_gradient_through_a_fit(line_search_fn):
    """torch.func.grad through L-BFGS updates (the branch-free variant) equals finite
    differences of the unrolled fit; the fit's solution is w(b) = pinv(A) b, so the
    gradient nears d sum(w) / db = pinv(A)^T 1 as the fit converges."""
    A, b = batch_of_least_squares(batch=1)
    A, b = A[0], b[0]
    tx = fo.lbfgs(max_iter=8, max_eval=12, line_search_fn=line_search_fn)

    def total(b):
        return fit(tx, A, b, steps=2)[0].sum()

    grad = torch.func.grad(total)(b)
    h = 1e-6
    unit = torch.eye(len(b), dtype=b.dtype)
    differences = torch.stack([(total(b + h * e) - total(b - h * e)) / (2 * h) for e in unit])
    torch.testing.assert_close(grad, differences, rtol=1e-6, atol=1e-8)
    implicit = torch.linalg.pinv(A).T @ torch.ones(3, dtype=A.dtype)
    torch.testing.assert_close(grad, implicit, rtol=1e-2, atol=1e-4)


def test_compiled_update_compiles_once():
    """One graph, and the eager update's params and state: also the state's flat vectors,
    laid out alike (a dict whose insertion order is not optree's sorted order, which
    Dynamo's tree_map would follow)."""
    import torch._dynamo

    A, b = batch_of_least_squares(batch=1, dtype=torch.float32)
    A, b = A[0], b[0]

    def value_fn(ps):
        return 0.5 * (A[:, :2] @ ps["w"] + A[:, 2] * ps["b"] - b).pow(2).sum()

    tx = fo.lbfgs(max_iter=3, history_size=2)

    def step(params, state):
        grads = torch.func.grad(value_fn)(params)
        updates, state = tx.update(grads, state, params, value_fn=value_fn)
        return fo.apply_updates(params, updates), state

    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    init = {"w": torch.zeros(2), "b": torch.zeros(())}
    eager = got = (init, tx.init(init))
    for i in range(3):
        eager = step(*eager)
        with torch._dynamo.config.patch(error_on_recompile=i > 0):
            got = compiled(*got)
    for a, e in zip(optree.tree_leaves(got), optree.tree_leaves(eager)):
        torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-6)
