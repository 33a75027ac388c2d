"""Differentiable and batched optimization: torch.func.grad/vjp/jvp/vmap through
K update steps, torch.compile of the update, and the eps_root remedy. Gradients are
checked in float64 against central finite differences."""

from __future__ import annotations

import warnings

import optree
import pytest
import torch
from helpers import (
    ALGORITHMS,
    HYPER,
    algorithm,
    assert_same,
    compiled_and_eager_steps,
    creates_at_first_step,
    factory,
    full_state,
    matrices_only,
    needs_params,
    skip_unless_steps_on_gradients,
    weight_decay,
)
from helpers import make as make_with_values
from torch.func import grad, jvp, vjp, vmap

import funcopt as fo
from funcopt._src.core import base as fo_base
from funcopt._src.engine import algorithm as fo_algorithm
from funcopt._src.engine import inplace

F64 = torch.float64
STEPS = 3
# Muon's Newton-Schulz iteration in float64 here (its funcopt-only ns_dtype): in torch's
# bfloat16 the update is a step function of the gradients (finite differences see none of
# its derivative), and a batched run rounds it otherwise than a loop (tests/test_muon.py
# checks bfloat16 apart)
SMOOTH = {"Muon": {"ns_dtype": F64}}
MATRICES = False  # for a class that steps matrices only (Muon): biases are rows (1, n)


def make(name, hp=None):
    """The transformation of `name` with `hp` (default: its `HYPER`), smooth (`SMOOTH`)."""
    return make_with_values(name, {**(HYPER[name] if hp is None else hp), **SMOOTH.get(name, {})})


@pytest.fixture(autouse=True)
def _matrices_only(request, monkeypatch):
    callspec = getattr(request.node, "callspec", None)
    name = callspec.params.get("name") if callspec else None
    if name in ALGORITHMS and matrices_only(name):
        monkeypatch.setitem(globals(), "MATRICES", True)


def row(t):
    """A bias (or a 0-d param) as the class steps it: a row (1, n) for Muon."""
    return t.reshape(1, -1) if MATRICES else t


@pytest.fixture(autouse=True)
def restore_default_dtype():
    """The default dtype stays float32: float64 params get float64 counters (step,
    mu_product) from `init` all the same, so finite differences and gradcheck are not
    polluted by float32 rounding of mu_product. A test may change it; this restores it."""
    old = torch.get_default_dtype()
    yield
    torch.set_default_dtype(old)


def problem(seed=0, dtype=F64):
    g = torch.Generator().manual_seed(seed)
    params = {
        "w": torch.randn(4, 3, generator=g, dtype=dtype),
        "b": row(torch.randn(3, generator=g, dtype=dtype)),
    }
    x = torch.randn(16, 4, generator=g, dtype=dtype)
    y = torch.randn(16, 3, generator=g, dtype=dtype)
    return params, x, y


def loss_fn(params, x, y):
    return (torch.tanh(x @ params["w"] + params["b"]) - y).pow(2).mean()


def train(name, hp, params, x, y, steps=STEPS):
    """Loss after `steps` differentiable steps: a function of params and hyperparameters."""
    adapted, _, _ = fo.inner_loop(loss_fn, params, make(name, hp), [(x, y)] * steps)
    return loss_fn(adapted, x, y)


def central_difference(f, x, direction, eps=1e-6):
    return (f(x + eps * direction) - f(x - eps * direction)) / (2 * eps)


CASES = [(n, k) for n in ALGORITHMS for k in HYPER[n]]


@pytest.mark.parametrize("name,key", CASES, ids=[f"{n}-{k}" for n, k in CASES])
def test_hypergradient_matches_finite_differences(name, key):
    skip_unless_steps_on_gradients(name)
    params, x, y = problem()

    def f(value):
        return train(name, {**HYPER[name], key: value}, params, x, y)

    value = torch.tensor(HYPER[name][key], dtype=F64)
    g = grad(f)(value)
    fd = central_difference(f, value, torch.ones((), dtype=F64))
    torch.testing.assert_close(g, fd, rtol=1e-5, atol=1e-8)
    assert g.abs() > 0
    # jvp (forward mode) agrees
    _, tangent = jvp(f, (value,), (torch.ones((), dtype=F64),))
    torch.testing.assert_close(tangent, g, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("name", ALGORITHMS)
def test_maml_gradient_wrt_initial_params(name):
    """Second order: the gradient of the post-adaptation loss w.r.t. the initial params,
    by torch.func.grad, torch.func.vjp and plain autograd, against finite differences."""
    skip_unless_steps_on_gradients(name)
    params, x, y = problem()
    hp = HYPER[name]

    def f(p):
        return train(name, hp, p, x, y)

    g = grad(f)(params)
    direction = {k: torch.randn_like(v) for k, v in params.items()}
    fd = central_difference(
        lambda t: f({k: params[k] + t * direction[k] for k in params}),
        torch.zeros((), dtype=F64),
        torch.ones((), dtype=F64),
    )
    torch.testing.assert_close(sum((g[k] * direction[k]).sum() for k in g), fd, rtol=1e-5, atol=1e-8)

    _, pullback = vjp(f, params)
    assert_same(pullback(torch.ones((), dtype=F64))[0], g, rtol=1e-9, atol=1e-12)

    leaves = {k: v.clone().requires_grad_() for k, v in params.items()}
    f(leaves).backward()
    assert_same({k: v.grad for k, v in leaves.items()}, g, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("name", ALGORITHMS)
def test_first_order_maml(name):
    """inner_loop(first_order=True) detaches the inner gradients: the meta-gradient is the
    outer loss's gradient at the adapted params, by torch.func.grad and by autograd. The
    learning rate stays differentiable: without weight decay (which reads the params)
    every update is linear in it, so d loss / d lr = grad . (adapted - params) / lr."""
    skip_unless_steps_on_gradients(name)
    if needs_params(name):
        pytest.skip(
            f"{name}'s update reads the params (needs_params): the first-order meta-gradient is not "
            "the gradient at the adapted params"
        )
    params, x, y = problem()
    hp = {**{k: v for k, v in HYPER[name].items() if k != "weight_decay"}, **weight_decay(name, 0.0)}
    lr = torch.tensor(hp.pop("lr"), dtype=F64)

    def adapt(p, lr, first_order=True):
        tx = make(name, {**hp, "lr": lr})
        return fo.inner_loop(loss_fn, p, tx, [(x, y)] * STEPS, first_order=first_order)[0]

    adapted = adapt(params, lr)
    at_adapted = grad(loss_fn)(adapted, x, y)
    meta = grad(lambda p: loss_fn(adapt(p, lr), x, y))(params)
    assert_same(meta, at_adapted, rtol=1e-9, atol=1e-12)
    second_order = grad(lambda p: loss_fn(adapt(p, lr, first_order=False), x, y))(params)
    if _reads_gradient_values(name, {**hp, "lr": lr}):
        assert (second_order["w"] - meta["w"]).abs().max() > 1e-4
    else:  # steps on the gradients' signs (Rprop): no second-order term
        assert_same(second_order, meta, rtol=1e-9, atol=1e-12)

    leaves = {k: v.clone().requires_grad_() for k, v in params.items()}
    loss_fn(adapt(leaves, lr), x, y).backward()
    assert_same({k: v.grad for k, v in leaves.items()}, at_adapted, rtol=1e-9, atol=1e-12)

    hypergrad = grad(lambda lr: loss_fn(adapt(params, lr), x, y))(lr)
    expected = sum((at_adapted[k] * (adapted[k] - params[k])).sum() for k in params) / lr
    torch.testing.assert_close(hypergrad, expected, rtol=1e-9, atol=1e-12)


def _reads_gradient_values(name, hp):
    """Whether the first update has a nonzero derivative in the gradient (Rprop's, which
    reads the signs only, has none)."""
    params, _, _ = problem()
    tx = make(name, hp)
    state = tx.init(params)
    gen = torch.Generator().manual_seed(1)
    g = {k: torch.randn(v.shape, generator=gen, dtype=v.dtype) for k, v in params.items()}
    _, tangent = jvp(lambda g: tx.update(g, state, params)[0], (g,), (optree.tree_map(torch.ones_like, g),))
    return any(bool(t.abs().max() > 0) for t in optree.tree_leaves(tangent))


@pytest.mark.parametrize("name", ALGORITHMS)
def test_inner_loop_resumes_from_a_state(name):
    """inner_loop(state=...) continues a run: 2 steps, then 3 from the returned params
    and state, equal 5 steps at once (params, state, and the loss before each step), as
    the online-tuning recipe relies on."""
    skip_unless_steps_on_gradients(name)
    params, x, y = problem()
    tx = make(name)
    whole, whole_state, whole_losses = fo.inner_loop(loss_fn, params, tx, [(x, y)] * 5)
    first, state, first_losses = fo.inner_loop(loss_fn, params, tx, [(x, y)] * 2)
    resumed, resumed_state, later_losses = fo.inner_loop(loss_fn, first, tx, [(x, y)] * 3, state=state)
    assert "step" not in resumed_state._fields or int(resumed_state.step["w"]) == 5
    assert_same(resumed, whole, rtol=1e-12, atol=1e-14)
    assert_same(list(resumed_state), list(whole_state), rtol=1e-12, atol=1e-14)
    assert_same(first_losses + later_losses, whole_losses, rtol=1e-12, atol=1e-14)
    assert whole_losses[0] == loss_fn(params, x, y) and whole_losses[-1] > loss_fn(whole, x, y)


def test_maml_through_a_module_with_batchnorm():
    """The documented remedy for BatchNorm (whose in-place running statistics torch.func
    refuses): after replace_all_batch_norm_modules_, the second-order meta-gradient
    through a module's inner loop matches central finite differences."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(4, 6), torch.nn.BatchNorm1d(6), torch.nn.Tanh(), torch.nn.Linear(6, 3)
    ).to(F64)
    torch.func.replace_all_batch_norm_modules_(model)
    params = {k: v.detach() for k, v in model.named_parameters()}
    _, x, y = problem()

    def module_loss(p, x, y):
        return (torch.func.functional_call(model, p, (x,)) - y).pow(2).mean()

    def meta_loss(p):
        adapted, _, _ = fo.inner_loop(module_loss, p, make("NAdam"), [(x, y)] * STEPS)
        return module_loss(adapted, x, y)

    g = grad(meta_loss)(params)
    direction = {k: torch.randn_like(v) for k, v in params.items()}
    along = lambda t: meta_loss({k: params[k] + t * direction[k] for k in params})  # noqa: E731
    fd = central_difference(along, torch.zeros((), dtype=F64), torch.ones((), dtype=F64))
    torch.testing.assert_close(sum((g[k] * direction[k]).sum() for k in g), fd, rtol=1e-5, atol=1e-8)


@pytest.mark.parametrize("first_order", [False, True])
@pytest.mark.parametrize("name", ALGORITHMS)
def test_maml_vmap_over_tasks_equals_loop(name, first_order):
    """MAML as torch.func writes it: the inner loop vmapped over a batch of tasks (params
    shared, so the first update meets unbatched params and batched gradients), the
    meta-gradient through all of it; equal to a Python loop over the tasks."""
    skip_unless_steps_on_gradients(name)
    params, _, _ = problem()
    g = torch.Generator().manual_seed(1)
    xs, ys = torch.randn(5, 16, 4, generator=g, dtype=F64), torch.randn(5, 16, 3, generator=g, dtype=F64)

    def task_loss(p, x, y):
        tx = make(name, HYPER[name])
        adapted, _, _ = fo.inner_loop(loss_fn, p, tx, [(x, y)] * STEPS, first_order=first_order)
        return loss_fn(adapted, x, y)

    batched = grad(lambda p: vmap(task_loss, in_dims=(None, 0, 0))(p, xs, ys).mean())(params)
    looped = grad(lambda p: torch.stack([task_loss(p, x, y) for x, y in zip(xs, ys)]).mean())(params)
    assert_same(batched, looped, rtol=1e-10, atol=1e-12)


VARIANTS = [(n, {}) for n in ALGORITHMS] + [
    ("Adadelta", {"maximize": True}),
    ("Adagrad", {"maximize": True, "eps_root": 1e-8}),
    ("Adamax", {"maximize": True}),
    ("NAdam", {"maximize": True, "decoupled_weight_decay": True, "eps_root": 1e-8}),
]


@pytest.mark.parametrize(
    "name,options", VARIANTS, ids=[f"{n}-{'-'.join(o) or 'default'}" for n, o in VARIANTS]
)
def test_autograd_through_eager_steps_equals_torch_func(name, options):
    """Eager steps that plain autograd records (params that require grad, number
    hyperparameters, a 0-d param among them): gradients of first, second and third
    order through them (the meta-gradient, then a Hessian-vector product of the loss
    after the steps) equal those through torch.func.grad and jvp."""
    skip_unless_steps_on_gradients(name)
    params, x, y = problem()
    params["scale"] = row(torch.tensor(1.5, dtype=F64))
    hp = {**HYPER[name], **options}

    def f(p):
        adapted, _, _ = fo.inner_loop(
            lambda q, x, y: loss_fn(q, x, y * q["scale"]), p, make(name, hp), [(x, y)] * STEPS
        )
        return loss_fn(adapted, x, y)

    direction = {k: torch.randn_like(v) for k, v in params.items()}
    expected = grad(f)(params)
    expected_hvp = jvp(grad(f), (params,), (direction,))[1]

    leaves = {k: v.clone().requires_grad_() for k, v in params.items()}
    grads = dict(zip(leaves, torch.autograd.grad(f(leaves), list(leaves.values()), create_graph=True)))
    hvp = torch.autograd.grad(sum((grads[k] * direction[k]).sum() for k in grads), list(leaves.values()))
    assert_same(grads, expected, rtol=1e-9, atol=1e-12)
    assert_same(dict(zip(leaves, hvp)), expected_hvp, rtol=1e-8, atol=1e-11)


@pytest.mark.parametrize("name", ALGORITHMS)
def test_update_of_module_parameters_records_only_with_grad_enabled(name):
    """A module's Parameters (which require grad) as params, with weight decay, which
    reads them: the update records autograd history (the new state would carry it into
    the next step), and under torch.no_grad() it records none, with the same values as
    an update of detached params (concepts.md)."""
    skip_unless_steps_on_gradients(name)
    model = torch.nn.Linear(4, 3, bias=not MATRICES)
    params = dict(model.named_parameters())
    tx = make(name)
    grads = {k: torch.randn_like(p) for k, p in params.items()}
    state = tx.init(params)
    expected, expected_state = tx.update(grads, state, {k: p.detach() for k, p in params.items()})
    recorded, recorded_state = tx.update(grads, state, params)
    # the updates and the new state record the params where they depend on them: the
    # updates with weight decay (Rprop has none), the new state where the decay is added
    # to the gradient (a decoupled decay, AdamW's, Adafactor's, Muon's, leaves it a
    # function of the gradients alone)
    shifted_updates, shifted = tx.update(grads, state, {k: p.detach() + 1 for k, p in params.items()})
    updates_read = not all(torch.equal(shifted_updates[k], expected[k]) for k in expected)
    assert all((u.grad_fn is not None) == updates_read for u in recorded.values())
    leaves = zip(optree.tree_leaves(shifted), optree.tree_leaves(expected_state))
    reads_params = not all(torch.equal(a, b) for a, b in leaves)
    assert any(t.grad_fn is not None for t in optree.tree_leaves(recorded_state)) == reads_params
    with torch.no_grad():
        updates, new_state = tx.update(grads, state, params)
    assert all(t.grad_fn is None for t in optree.tree_leaves((updates, new_state)))
    assert_same(updates, expected, rtol=0, atol=0)
    assert_same(list(new_state), list(expected_state), rtol=0, atol=0)
    assert_same(recorded, expected, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("name", ALGORITHMS)
def test_autograd_groups_small_tensors_like_one_by_one(name, monkeypatch):
    """Where autograd records, small tensors step in groups with foreach ops: the
    results and the gradients through them equal those of per-tensor ops, bit for bit
    (the same kernels run), for real, complex, float32 and float64 leaves, 0-d ones and
    one shorter than its index in its group (where torch's backward of _foreach_addcdiv
    fails), and which results record (a frozen leaf's do not). Large tensors step one by
    one (torch's foreach ops save twice the memory)."""
    skip_unless_steps_on_gradients(name)
    if creates_at_first_step(name):
        pytest.skip(f"{name}'s first step creates a buffer, for which each param steps by itself")
    if not algorithm(name).per_element:
        pytest.skip(f"{name}'s math looks across a param's elements: each param steps by itself")
    shapes = {"small": ((4, 3), F64), "c64": ((3,), torch.complex64), "f32": ((5,), torch.float32)}
    shapes |= {"scalar": ((), F64), "large": ((130, 130), F64), "one": ((1,), F64), "frozen": ((2,), F64)}
    init = {
        k: torch.randn(s, dtype=d, generator=torch.Generator().manual_seed(i))
        for i, (k, (s, d)) in enumerate(shapes.items())
    }
    hp = {k: v for k, v in HYPER[name].items() if k != "initial_accumulator_value"}

    def run():
        leaves = {k: v.clone().requires_grad_(k != "frozen") for k, v in init.items()}
        params, tx = leaves, make(name, hp)
        state = tx.init(params)
        for _ in range(STEPS):
            grads = {k: torch.sin(v) * 0.1 for k, v in params.items()}  # recorded by autograd
            updates, state = tx.update(grads, state, params)
            params = fo.apply_updates(params, updates)
        loss = sum(
            torch.view_as_real(v).pow(2).sum() if v.is_complex() else v.pow(2).sum() for v in params.values()
        )
        records = [t.requires_grad for t in optree.tree_leaves((params, state))]
        return (
            params,
            state,
            records,
            torch.autograd.grad(loss, [v for k, v in leaves.items() if k != "frozen"]),
        )

    one_by_one = []
    pure_step = fo_algorithm.Algorithm._pure_step

    def recording_pure_step(self, p, *args):
        one_by_one.append(tuple(p.shape))
        return pure_step(self, p, *args)

    monkeypatch.setattr(fo_algorithm.Algorithm, "_pure_step", recording_pure_step)
    grouped = run()
    assert one_by_one == [(130, 130)] * STEPS
    assert not grouped[0]["frozen"].requires_grad and grouped[0]["one"].requires_grad
    monkeypatch.setattr(fo_base, "grouped_under_autograd", lambda t: False)  # apply_updates
    monkeypatch.setattr(inplace, "SMALL", -1)  # the update (inplace.plan)
    assert_same(grouped, run(), rtol=0, atol=0)


@pytest.mark.parametrize("name", ALGORITHMS)
def test_forward_ad_dual_tensors_equal_torch_func_jvp(name):
    """Forward-mode AD with torch.autograd.forward_ad's dual tensors through eager steps
    (small tensors, grouped in plain eager mode, and large ones, computed in fresh
    memory by out= ops; neither has a forward-mode formula) equals torch.func.jvp."""
    skip_unless_steps_on_gradients(name)
    hp = {k: v for k, v in HYPER[name].items() if k != "initial_accumulator_value"}
    gen = torch.Generator().manual_seed(0)
    params = {
        "small": row(torch.randn(5, dtype=F64, generator=gen)),
        "large": torch.randn(300, 300, dtype=F64, generator=gen),
    }
    tangents = {k: torch.randn(v.shape, dtype=F64, generator=gen) for k, v in params.items()}

    def f(p):
        tx = make(name, hp)
        state = tx.init(p)
        for _ in range(STEPS):
            updates, state = tx.update({k: torch.sin(v) for k, v in p.items()}, state, p)
            p = fo.apply_updates(p, updates)
        return p

    expected = jvp(f, (params,), (tangents,))[1]
    with torch.autograd.forward_ad.dual_level():
        out = f({k: torch.autograd.forward_ad.make_dual(v, tangents[k]) for k, v in params.items()})
        tangent = {k: torch.autograd.forward_ad.unpack_dual(v).tangent for k, v in out.items()}
    assert_same(tangent, expected, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name", ALGORITHMS)
def test_gradcheck_through_steps(name):
    """torch.autograd.gradcheck on the final params as a function of the initial params
    and of every hyperparameter, all float64 under the default (float32) dtype: float64
    params get float64 counters, so NAdam's mu_product does not round to float32."""
    skip_unless_steps_on_gradients(name)
    params, x, y = problem()
    keys = list(HYPER[name])

    def f(w, b, *values):
        tx = make(name, dict(zip(keys, values)))
        adapted, _, _ = fo.inner_loop(loss_fn, {"w": w, "b": b}, tx, [(x, y)] * 2)
        return adapted["w"], adapted["b"]

    values = [torch.tensor(HYPER[name][k], dtype=F64, requires_grad=True) for k in keys]
    assert torch.get_default_dtype() == torch.float32
    assert torch.autograd.gradcheck(f, (params["w"].requires_grad_(), params["b"].requires_grad_(), *values))


@pytest.mark.parametrize("name", ALGORITHMS)
def test_forward_over_reverse_through_steps(name):
    """Second derivatives by forward-over-reverse (torch.func.hessian, jvp of grad), as
    implicit differentiation and Hessian-vector products need them: the Hessian of the
    post-adaptation loss in lr, and a Hessian-vector product in the initial params,
    against central differences of the gradient."""
    skip_unless_steps_on_gradients(name)
    params, x, y = problem()

    def f(p, lr):
        return train(name, {**HYPER[name], "lr": lr}, p, x, y)

    lr = torch.tensor(HYPER[name]["lr"], dtype=F64)
    d2 = torch.func.hessian(f, argnums=1)(params, lr)
    torch.testing.assert_close(
        d2, central_difference(lambda t: grad(f, argnums=1)(params, t), lr, 1.0), rtol=1e-5, atol=1e-8
    )

    v = {k: torch.randn_like(t) for k, t in params.items()}
    _, hvp = jvp(lambda p: grad(f)(p, lr), (params,), (v,))
    fd = central_difference(
        lambda t: torch.cat(
            [g.flatten() for g in grad(f)({k: params[k] + t * v[k] for k in params}, lr).values()]
        ),
        torch.zeros((), dtype=F64),
        torch.ones((), dtype=F64),
    )
    torch.testing.assert_close(torch.cat([hvp[k].flatten() for k in params]), fd, rtol=1e-5, atol=1e-8)


@pytest.mark.parametrize("name", ALGORITHMS)
def test_vmap_over_hyperparameters_equals_loop(name):
    """One vmapped run over N settings of several hyperparameters at once = N runs."""
    skip_unless_steps_on_gradients(name)
    params, x, y = problem()
    keys = [k for k in HYPER[name] if k in ("lr", "weight_decay", "beta1", "rho", "lr_decay")]
    n = 5
    values = {
        k: torch.linspace(0.5, 0.95, n, dtype=F64)  # decay rates stay in [0, 1)
        if k in ("beta1", "rho")
        else torch.linspace(0.5, 1.5, n, dtype=F64) * HYPER[name][k]
        for k in keys
    }

    def f(batch):
        return train(name, {**HYPER[name], **batch}, params, x, y)

    batched = vmap(f)(values)
    loop = torch.stack([f({k: v[i] for k, v in values.items()}) for i in range(n)])
    torch.testing.assert_close(batched, loop, rtol=1e-10, atol=1e-12)
    assert len(set(loop.tolist())) == n


@pytest.mark.parametrize("name", ["Adamax", "NAdam"])
def test_vmap_over_pairs_of_betas_in_one_tensor(name):
    """betas may be one tensor of 2 elements, as torch.optim takes them: vmap over an
    (N, 2) tensor of pairs equals N runs, and its gradient is the betas' gradients."""
    params, x, y = problem()
    pairs = torch.tensor([[0.5, 0.9], [0.8, 0.99], [0.9, 0.999]], dtype=F64)

    def f(betas):
        return train(name, {**HYPER[name], "beta1": betas[0], "beta2": betas[1]}, params, x, y)

    def g(betas):  # the pair passed whole
        hp = {k: v for k, v in HYPER[name].items() if k not in ("beta1", "beta2")}
        adapted, _, _ = fo.inner_loop(loss_fn, params, factory(name)(betas=betas, **hp), [(x, y)] * STEPS)
        return loss_fn(adapted, x, y)

    loop = torch.stack([f(b) for b in pairs])
    torch.testing.assert_close(vmap(g)(pairs), loop, rtol=1e-10, atol=1e-12)
    assert len(set(loop.tolist())) == len(pairs)
    torch.testing.assert_close(grad(g)(pairs[1]), grad(f)(pairs[1]), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name", ALGORITHMS)
def test_vmap_over_model_ensemble_equals_loop(name):
    """vmap over an ensemble of initializations (params and state batched)."""
    skip_unless_steps_on_gradients(name)
    inits = [problem(seed)[0] for seed in range(4)]
    _, x, y = problem()
    stacked = {k: torch.stack([p[k] for p in inits]) for k in inits[0]}
    tx = make(name, HYPER[name])

    def run(p):
        adapted, state, _ = fo.inner_loop(loss_fn, p, tx, [(x, y)] * STEPS)
        return adapted, state

    batched, batched_state = vmap(run)(stacked)
    for i, p in enumerate(inits):
        adapted, state = run(p)
        member = optree.tree_map(lambda v, i=i: v[i], (batched, list(batched_state)))  # empty nodes stay
        assert_same(member, (adapted, list(state)), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name", ALGORITHMS)
def test_nested_vmap_over_learning_rates_and_ensemble_equals_loop(name):
    """A grid in one call: vmap over learning rates (in chunks) of vmap over an ensemble
    of initializations equals the double loop."""
    skip_unless_steps_on_gradients(name)
    inits = [problem(seed)[0] for seed in range(3)]
    _, x, y = problem()
    stacked = {k: torch.stack([p[k] for p in inits]) for k in inits[0]}
    lrs = torch.tensor([0.5, 1.0, 2.0, 4.0], dtype=F64) * HYPER[name]["lr"]

    def f(lr, p):
        return train(name, {**HYPER[name], "lr": lr}, p, x, y)

    grid = vmap(vmap(f, in_dims=(None, 0)), in_dims=(0, None), chunk_size=3)(lrs, stacked)
    loop = torch.stack([torch.stack([f(lr, p) for p in inits]) for lr in lrs])
    torch.testing.assert_close(grid, loop, rtol=1e-10, atol=1e-12)
    assert len(set(loop.flatten().tolist())) == loop.numel()


@pytest.mark.parametrize("name", ALGORITHMS)
def test_vmap_over_states_at_different_steps_equals_loop(name):
    """Batched step counters: one vmapped update of states that have taken 1, 2 and 3
    steps gives each its own schedule, as separate updates do. (A counter that a
    transform does not wrap is read in Python; a batched one must stay a tensor.)"""
    skip_unless_steps_on_gradients(name)
    params, x, y = problem()
    tx = make(name, HYPER[name])
    states = [fo.inner_loop(loss_fn, params, tx, [(x, y)] * k)[1] for k in (1, 2, 3)]
    stacked = optree.tree_map(lambda *leaves: torch.stack(leaves), *states)
    grads = grad(loss_fn)(params, x, y)
    updates, new_states = vmap(lambda state: tx.update(grads, state, params))(stacked)
    for i, state in enumerate(states):
        expected_updates, expected_state = tx.update(grads, state, params)
        member = optree.tree_map(lambda t, i=i: t[i], (updates, list(new_states)))
        assert_same(member, (expected_updates, list(expected_state)), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name", ALGORITHMS)
def test_vmap_then_grad_hypergradients_per_setting(name):
    """vmap(grad(...)): one hypergradient per learning rate, in one call."""
    skip_unless_steps_on_gradients(name)
    params, x, y = problem()
    lrs = torch.tensor([0.5, 1.0, 2.0], dtype=F64) * HYPER[name]["lr"]

    def f(lr):
        return train(name, {**HYPER[name], "lr": lr}, params, x, y)

    torch.testing.assert_close(
        vmap(grad(f))(lrs), torch.stack([grad(f)(lr) for lr in lrs]), rtol=1e-10, atol=1e-12
    )


@pytest.mark.parametrize("name", ALGORITHMS)
def test_compile_fullgraph_without_recompiles(name):
    """torch.compile(update, fullgraph=True): no graph break, no recompile across steps
    (counters live in tensors), same result as eager."""
    skip_unless_steps_on_gradients(name)
    params, x, y = problem(dtype=torch.float32)
    grads_seq = [grad(loss_fn)(params, x * (1 + i / 4), y) for i in range(4)]
    (comp_p, comp_s), (eager_p, eager_s) = compiled_and_eager_steps(
        make(name, HYPER[name]), params, grads_seq
    )
    assert_same(comp_p, eager_p, rtol=1e-5, atol=1e-6)
    assert_same(list(comp_s), list(eager_s), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ALGORITHMS)
def test_compiled_update_with_a_skipped_param(name):
    """A None gradient skips its param, whose step counter then no longer shares the
    others': the second step compiles again (documented), later ones do not."""
    skip_unless_steps_on_gradients(name)
    import torch._dynamo

    params, x, y = problem(dtype=torch.float32)
    grads_seq = [{**grad(loss_fn)(params, x * (1 + i / 4), y), "b": None} for i in range(4)]
    tx = make(name, HYPER[name])
    torch._dynamo.reset()
    compiled = torch.compile(tx.update, fullgraph=True, backend="aot_eager")
    comp_s, eager_s = tx.init(params), tx.init(params)
    for i, grads in enumerate(grads_seq):
        with torch._dynamo.config.patch(error_on_recompile=i > 1):
            comp_u, comp_s = compiled(grads, comp_s, params)
        eager_u, eager_s = tx.update(grads, eager_s, params)
        assert comp_u["b"] is None
        assert_same(comp_u["w"], eager_u["w"], rtol=1e-5, atol=1e-6)
    assert_same(list(comp_s), list(eager_s), rtol=1e-5, atol=1e-6)
    assert "step" not in comp_s._fields or int(comp_s.step["w"]) == 4 and int(comp_s.step["b"]) == 0


@pytest.mark.parametrize("name", ALGORITHMS)
def test_compiled_update_with_dynamic_shapes(name):
    """torch.compile(update, dynamic=True): one graph serves params of any size (a
    model grown or swapped between runs) and equals eager on each."""
    skip_unless_steps_on_gradients(name)
    import torch._dynamo

    tx = make(name, HYPER[name])
    torch._dynamo.reset()
    compiled = torch.compile(tx.update, fullgraph=True, dynamic=True, backend="aot_eager")
    for i, n in enumerate((5, 7, 11)):
        base = problem(seed=n, dtype=torch.float32)[0]
        params = {"w": base["w"].repeat(1, n), "b": base["b"].repeat(*[1] * (base["b"].dim() - 1), n)}
        grads = optree.tree_map(torch.cos, params)
        comp_s = eager_s = full_state(tx, params)
        for j in range(2):
            with torch._dynamo.config.patch(error_on_recompile=(i, j) != (0, 0)):
                comp_u, comp_s = compiled(grads, comp_s, params)
            eager_u, eager_s = tx.update(grads, eager_s, params)
            assert_same((comp_u, list(comp_s)), (eager_u, list(eager_s)), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ALGORITHMS)
def test_update_exports(name):
    """torch.export of a module that calls update (the state passed as its leaves, the
    shared step counter among them) gives a program that computes what eager does at
    every step: the schedule is traced from the counters, not baked in as constants."""
    skip_unless_steps_on_gradients(name)
    params, x, y = problem(dtype=torch.float32)
    tx = make(name, HYPER[name])
    spec = optree.tree_structure((params, full_state(tx, params)))

    class Step(torch.nn.Module):
        def forward(self, grads, *leaves):
            params, state = optree.tree_unflatten(spec, list(leaves))
            return tx.update(grads, state, params)

    grads_seq = [grad(loss_fn)(params, x * (1 + i / 4), y) for i in range(4)]
    exported_state = eager_state = full_state(tx, params)
    exported = torch.export.export(
        Step(), (grads_seq[0], *optree.tree_leaves((params, eager_state)))
    ).module()
    for grads in grads_seq:
        updates, exported_state = exported(grads, *optree.tree_leaves((params, exported_state)))
        expected, eager_state = tx.update(grads, eager_state, params)
        assert_same((updates, list(exported_state)), (expected, list(eager_state)), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("mode", ["real", "fake", "symbolic", "jit.trace"])
@pytest.mark.parametrize("name", ALGORITHMS)
def test_update_traces_with_make_fx_or_jit_trace(name, mode):
    """make_fx (the tracer under torch.compile's and export's graphs, used directly by
    graph-capture tools) in each mode, and torch.jit.trace, trace update at the first step
    into a graph that computes what eager does at later steps: the counters are not read
    in Python, which baked the first step's schedule in (make_fx's real mode and
    jit.trace), or failed (the others)."""
    skip_unless_steps_on_gradients(name)
    from torch.fx.experimental.proxy_tensor import make_fx

    params, x, y = problem(dtype=torch.float32)
    tx = make(name, HYPER[name])
    spec = optree.tree_structure((params, params, full_state(tx, params)))  # grads, params, state

    def step(*leaves):
        grads, params, state = optree.tree_unflatten(spec, list(leaves))
        return tuple(optree.tree_leaves(tx.update(grads, state, params)))

    def leaves(grads, state):
        return optree.tree_leaves((grads, params, state))

    example = leaves(grad(loss_fn)(params, x, y), full_state(tx, params))
    if mode == "jit.trace":
        with warnings.catch_warnings():  # it warns of the shape checks, which hold in a trace
            warnings.simplefilter("ignore", torch.jit.TracerWarning)
            traced = torch.jit.trace(step, tuple(example), check_trace=False)
    else:
        traced = make_fx(step, tracing_mode=mode)(*example)
    traced_state = eager_state = full_state(tx, params)
    for i in range(STEPS):
        grads = grad(loss_fn)(params, x * (1 + i / 4), y)
        updates, traced_state = optree.tree_unflatten(
            optree.tree_structure((grads, eager_state)), list(traced(*leaves(grads, traced_state)))
        )
        expected, eager_state = tx.update(grads, eager_state, params)
        assert_same((updates, list(traced_state)), (expected, list(eager_state)), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("name", ALGORITHMS)
def test_update_under_a_fake_tensor_mode(name):
    """Under a FakeTensorMode (shapes and memory estimated without computing), update of
    a stepped state made fake gives tensors of the right shapes and dtypes: it reads no
    counter value, which a fake tensor does not hold."""
    skip_unless_steps_on_gradients(name)
    from torch._subclasses.fake_tensor import FakeTensorMode

    params = {"w": torch.randn(4, 3), "b": row(torch.randn(3, dtype=F64))}
    tx = make(name, HYPER[name])
    _, state = tx.update(params, tx.init(params), params)
    mode = FakeTensorMode()
    fake_params, fake_state = optree.tree_map(mode.from_tensor, (params, state))
    with mode:
        updates, new_state = tx.update(optree.tree_map(torch.ones_like, fake_params), fake_state, fake_params)
    assert {k: (u.shape, u.dtype) for k, u in updates.items()} == {
        k: (p.shape, p.dtype) for k, p in params.items()
    }
    assert [(t.shape, t.dtype) for t in optree.tree_leaves(new_state)] == [
        (t.shape, t.dtype) for t in optree.tree_leaves(state)
    ]


@pytest.mark.parametrize("name", ALGORITHMS)
def test_compiled_vmapped_training_runs(name):
    """torch.compile over a whole vmapped sweep (gradient, update and apply_updates inside,
    several steps), fullgraph: equal to the eager sweep."""
    skip_unless_steps_on_gradients(name)
    import torch._dynamo

    torch._dynamo.reset()
    params, x, y = problem(dtype=torch.float32)

    def final_loss(lr):
        adapted, _, _ = fo.inner_loop(
            loss_fn, params, make(name, {**HYPER[name], "lr": lr}), [(x, y)] * STEPS
        )
        return loss_fn(adapted, x, y)

    lrs = torch.linspace(0.01, 0.1, 4)
    compiled = torch.compile(vmap(final_loss), fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(lrs), vmap(final_loss)(lrs), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ALGORITHMS)
def test_compiled_vmapped_step_from_a_cloned_vmapped_init(name):
    """A sweep stepped from Python: torch.compile(vmap(step)) from the state of
    vmap(tx.init), cloned as documented (vmap returns the unbatched counters expanded, with
    stride 0), compiles once over the steps and equals the eager vmapped steps."""
    skip_unless_steps_on_gradients(name)
    import torch._dynamo

    torch._dynamo.reset()
    params, x, y = problem(dtype=torch.float32)

    def step(lr, params, state):
        tx = make(name, {**HYPER[name], "lr": lr})
        updates, state = tx.update(grad(loss_fn)(params, x, y), state, params)
        return fo.apply_updates(params, updates), state

    lrs = torch.linspace(0.01, 0.1, 3)
    batched = {k: v.expand(3, *v.shape).clone() for k, v in params.items()}
    state = vmap(make(name, HYPER[name]).init)(batched)
    counters = [t for t in optree.tree_leaves(state) if t.ndim == 1]
    assert {t.stride() for t in counters} == ({(0,)} if counters else set())  # (SGD: none)
    state = optree.tree_map(torch.clone, state)
    compiled = torch.compile(vmap(step), fullgraph=True, backend="aot_eager")
    comp, eager = (batched, state), (batched, state)
    again = 1 if creates_at_first_step(name) else 0  # a state made anew at the first step
    for i in range(3):
        with torch._dynamo.config.patch(error_on_recompile=i > again):
            comp = compiled(lrs, *comp)
        eager = vmap(step)(lrs, *eager)
    assert_same((comp[0], list(comp[1])), (eager[0], list(eager[1])), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ALGORITHMS)
def test_compiled_step_with_a_scheduled_lr(name):
    """A schedule: the transformation built inside the compiled step from a 0-d tensor lr
    that changes every step. It compiles once and matches eager steps."""
    skip_unless_steps_on_gradients(name)
    import torch._dynamo

    torch._dynamo.reset()
    params, x, y = problem(dtype=torch.float32)

    def step(params, state, lr):
        updates, state = factory(name)(lr=lr).update(grad(loss_fn)(params, x, y), state, params)
        return fo.apply_updates(params, updates), state

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    eager_p, eager_s = params, factory(name)().init(params)
    comp_p, comp_s = params, factory(name)().init(params)
    for i in range(4):
        lr = torch.tensor(0.1 * 0.5**i, dtype=torch.float32)
        eager_p, eager_s = step(eager_p, eager_s, lr.item())
        with torch._dynamo.config.patch(error_on_recompile=i > 0):
            comp_p, comp_s = compiled(comp_p, comp_s, lr)
    assert_same(comp_p, eager_p, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", ALGORITHMS)
def test_compiled_write_back_matches_pure_steps(name, dtype):
    """The recipe for a compiled in-place step: the pure update's results copied back into
    params and state inside the compiled function (the shared step counter included).
    Under a float64 default dtype the counters are 0-d float64 tensors, whose direct
    in-place writes torch 2.13's compiler can drop; the recipe writes through views."""
    skip_unless_steps_on_gradients(name)
    import optree
    import torch._dynamo

    torch._dynamo.reset()
    torch.set_default_dtype(dtype)  # the fixture restores it
    params, x, y = problem(dtype=dtype)
    tx = make(name, HYPER[name])

    @torch.compile(fullgraph=True, backend="aot_eager")
    def step_in_place(grads, state, params):
        updates, new_state = tx.update(grads, state, params)
        new = (fo.apply_updates(params, updates), new_state)
        # tree_map, which Dynamo runs natively: its emulation of optree.tree_leaves fails
        # on a dict of empty nodes beside leaves (Adam's max_exp_avg_sq without amsgrad)
        optree.tree_map(lambda old, value: old.view(-1).copy_(value.view(-1)), (params, state), new)

    pure_p, pure_s = params, full_state(tx, params)
    in_place_p = {k: v.clone() for k, v in params.items()}
    in_place_s = full_state(tx, in_place_p)
    for i in range(4):
        grads = grad(loss_fn)(pure_p, x, y)
        updates, pure_s = tx.update(grads, pure_s, pure_p)
        pure_p = fo.apply_updates(pure_p, updates)
        with torch._dynamo.config.patch(error_on_recompile=i > 0):
            step_in_place(grads, in_place_s, in_place_p)
    assert_same(in_place_p, pure_p, rtol=1e-5, atol=1e-6)
    assert_same(list(in_place_s), list(pure_s), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ALGORITHMS)
def test_compiled_meta_gradient_matches_eager(name):
    """torch.compile(fullgraph=True) of a whole meta-gradient: torch.func.grad, with
    respect to the initial params and the lr, of the loss after steps of `inner_loop`
    (second order, through each step's update and schedule). One graph, equal to eager."""
    skip_unless_steps_on_gradients(name)
    import torch._dynamo

    torch._dynamo.reset()
    params, x, y = problem(dtype=torch.float32)
    lr = torch.tensor(HYPER[name]["lr"])
    meta_grad = grad(lambda p, lr: train(name, {**HYPER[name], "lr": lr}, p, x, y), argnums=(0, 1))
    compiled = torch.compile(meta_grad, fullgraph=True, backend="aot_eager")
    eager_p, eager_lr = eager = meta_grad(params, lr)
    assert eager_lr != 0 and all(g.abs().sum() > 0 for g in eager_p.values())
    assert_same(compiled(params, lr), eager, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("name", ALGORITHMS)
def test_compiled_training_step_with_weight_decay_matches_eager(name):
    """The real compiler (inductor; the other compile tests use aot_eager) on a whole
    training step: the gradient (a matmul, for the weight) and the update with weight
    decay, in one graph, and NAdam's and Adamax's schedules with `power`. Inductor in
    torch 2.13 rewrites ``add(mm, y, alpha=c)`` into an ``addmm`` that drops `c`, which
    took the weight decay as 1 here; the update must not give it an ``alpha``."""
    skip_unless_steps_on_gradients(name)
    import torch._dynamo

    torch._dynamo.reset()
    params, x, y = problem(dtype=torch.float32)
    tx = make(name, HYPER[name])

    def step(params, state):
        updates, state = tx.update(grad(loss_fn)(params, x, y), state, params)
        return fo.apply_updates(params, updates), state

    compiled = torch.compile(step, fullgraph=True)
    eager_p, eager_s = params, tx.init(params)
    comp_p, comp_s = params, tx.init(params)
    for _ in range(3):
        eager_p, eager_s = step(eager_p, eager_s)
        comp_p, comp_s = compiled(comp_p, comp_s)
    assert_same(comp_p, eager_p, rtol=1e-5, atol=1e-6)
    assert_same(list(comp_s), list(eager_s), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["NAdam", "Adagrad"])
def test_meta_gradients_finite_where_a_gradient_entry_is_zero(name):
    """A gradient entry that is exactly zero (here: an input feature that is always 0)
    made the meta-gradient NaN through sqrt (it does in torch, and needed eps_root);
    funcopt's functional sqrt has derivative 0 at 0: finite without eps_root, and the
    same as with a tiny one."""
    params, x, y = problem()
    x_zero = x.clone()
    x_zero[:, 0] = 0.0  # w[0] never gets a gradient
    hp = {k: v for k, v in HYPER[name].items() if k != "initial_accumulator_value"}
    hp["weight_decay"] = 0.0

    def meta(p, data, eps_root):
        return train(name, {**hp, "eps_root": eps_root}, p, *data)

    without = grad(meta)(params, (x_zero, y), 0.0)
    assert all(torch.isfinite(v).all() for v in without.values())
    assert_same(without, grad(meta)(params, (x_zero, y), 1e-16), rtol=1e-7, atol=1e-10)
    # where no entry is zero, eps_root changes nothing that matters
    assert_same(grad(meta)(params, (x, y), 1e-16), grad(meta)(params, (x, y), 0.0), rtol=1e-7, atol=1e-10)


def test_eps_root_is_validated_and_defaults_to_torch():
    with pytest.raises(ValueError, match="Invalid eps_root value"):
        fo.nadam(eps_root=-1.0)
    params, x, y = problem()
    assert_same(train("NAdam", {"eps_root": 0.0}, params, x, y), train("NAdam", {}, params, x, y))


def test_hypergradient_through_counters_with_autograd():
    """beta1 enters NAdam's mu_product counter: with plain autograd (outside torch.func)
    the gradient must flow through that counter too."""
    params, x, y = problem()
    beta1 = torch.tensor(0.8, dtype=F64, requires_grad=True)
    train("NAdam", {**HYPER["NAdam"], "beta1": beta1}, params, x, y, steps=4).backward()

    def f(b):
        return train("NAdam", {**HYPER["NAdam"], "beta1": b}, params, x, y, steps=4)

    fd = central_difference(f, beta1.detach(), torch.ones((), dtype=F64))
    torch.testing.assert_close(beta1.grad, fd, rtol=1e-5, atol=1e-8)
