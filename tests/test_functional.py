"""The functional API: purity, pytrees, tensor hyperparameters, dtypes, chain, clipping,
and the generic `fo.Optimizer` adapter."""

from __future__ import annotations

import copy
from typing import NamedTuple

import optree
import pytest
import torch
from helpers import (
    ALGORITHMS,
    HYPER,
    algorithm,
    as_tensors,
    assert_same,
    factory,
    full_state,
    hypergradients_both_ways,
    is_empty,
    kwargs_of,
    make,
    matrices_for,
    matrices_only,
    run,
    set_default_dtype,
    skip_if_needs_params,
    skip_unless_steps_on_gradients,
    skip_without_counters,
    supports_complex,
    takes,
    torch_cls,
    weight_decay,
)

import funcopt as fo
from funcopt._src.engine import inplace
from funcopt._src.engine.algorithm import Algorithm


def params_and_grads(dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    params = {"w": torch.randn(4, 3, generator=g, dtype=dtype), "b": torch.randn(3, generator=g, dtype=dtype)}
    grads = [{k: torch.randn(v.shape, generator=g, dtype=dtype) for k, v in params.items()} for _ in range(5)]
    return params, grads


@pytest.mark.parametrize("path", ["default", "segments", "lists"])
@pytest.mark.parametrize("name", ALGORITHMS)
def test_inputs_are_never_mutated(name, path, monkeypatch):
    """Pure ops, or the eager paths that compute in place in fresh memory: on flat
    segments (made tiny here), or with `ForEach` ops on groups (the GPUs' path)."""
    skip_unless_steps_on_gradients(name)
    if path == "segments":
        monkeypatch.setattr(inplace, "SMALL", 4)
        monkeypatch.setattr(inplace, "SEGMENT", 5)
    if path == "lists":
        monkeypatch.setattr(inplace, "use_lists", lambda device: True)
    params, grads = matrices_for(name, params_and_grads())
    tx = make(name)
    state = tx.init(params)
    state = tx.update(grads[0], state, params)[1]  # a non-trivial state
    inputs = (params, grads[1], state)
    snapshot = optree.tree_map(torch.clone, inputs)
    versions = [t._version for t in optree.tree_leaves(inputs)]
    updates, new_state = tx.update(*[grads[1], state, params])
    fo.apply_updates(params, updates)
    assert_same(list(optree.tree_leaves(inputs)), list(optree.tree_leaves(snapshot)))
    assert [t._version for t in optree.tree_leaves(inputs)] == versions
    for old, new in zip(optree.tree_leaves(state), optree.tree_leaves(new_state)):
        assert new is not old, "the new state must be new tensors"


@pytest.mark.parametrize("path", ["default", "segments", "pure"])
@pytest.mark.parametrize("name", ALGORITHMS)
def test_update_without_params(name, path, monkeypatch):
    """Without weight decay the params are optional: ``update(grads, state)`` takes the
    same eager paths (the math never reads them) and gives the same result, bit for bit."""
    skip_unless_steps_on_gradients(name)
    skip_if_needs_params(name)
    params, grads = matrices_for(name, params_and_grads())
    maximize = {"maximize": True} if takes(name, "maximize") else {}  # (Muon has none, as torch's)
    tx = make(name, {**HYPER[name], **weight_decay(name, 0.0), **maximize})
    with_params = without = full_state(tx, params)  # SGD's first step, which creates a buffer, aside
    if path == "segments":  # blocks of fresh memory for the 4x3 leaf, foreach ops for the other
        monkeypatch.setattr(inplace, "SMALL", 4)
        monkeypatch.setattr(inplace, "SEGMENT", 5)
    if path != "pure" and not algorithm(name).per_element:
        pytest.skip(f"{name}'s math looks across a param's elements: its update takes the pure path only")
    if path != "pure":

        def no_pure_step(*args, **kwargs):
            raise AssertionError("took the out-of-place path")

        monkeypatch.setattr(Algorithm, "_pure_step", no_pure_step)
    for g in grads:
        if path == "pure":  # autograd on: out-of-place ops only
            g = {k: v.clone().requires_grad_() for k, v in g.items()}
        updates, with_params = tx.update(g, with_params, params)
        same_updates, without = tx.update(g, without)
        assert_same(same_updates, updates, rtol=0, atol=0)
    assert_same(without, with_params, rtol=0, atol=0)


@pytest.mark.parametrize("tensor_dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", ALGORITHMS)
def test_tensor_hyperparameters_equal_floats(name, tensor_dtype):
    """0-d tensor hyperparameters give the float result, and never promote: a float32
    param with float64 hyperparameters keeps float32 updates and state."""
    skip_unless_steps_on_gradients(name)
    params, grads = matrices_for(name, params_and_grads())
    tensors = as_tensors(kwargs_of(HYPER[name]), tensor_dtype)
    expected, expected_state = run(make(name), params, grads)
    actual, actual_state = run(factory(name)(**tensors), params, grads)
    assert_same(actual, expected)
    assert_same(list(actual_state), list(expected_state))  # dtypes checked too


@pytest.mark.parametrize("name", ALGORITHMS)
def test_counters_are_float64_for_float64_params(name):
    """init shares one counter per dtype: torch's float32 for float32, bfloat16 and
    complex64 params, float64 for float64 and complex128 ones. Each leaf then steps as
    it would alone, float64 leaves with float64 counters."""
    skip_unless_steps_on_gradients(name)
    g = torch.Generator().manual_seed(0)
    dtypes = {
        "a": torch.float32,
        "b": torch.float64,
        "c": torch.bfloat16,
        "d": torch.complex128,
        "e": torch.complex64,
    }
    if not supports_complex(name):  # (Adafactor and Muon refuse them, as torch's)
        del dtypes["d"], dtypes["e"]
    params = matrices_for(name, {k: torch.randn(3, generator=g, dtype=d) for k, d in dtypes.items()})
    grads = matrices_for(name, {k: torch.randn(3, generator=g, dtype=d) for k, d in dtypes.items()})
    tx = make(name)
    state = tx.init(params)
    skip_without_counters(state)
    steps = state.step
    expected = {
        "a": torch.float32, "b": torch.float64, "c": torch.float32, "d": torch.float64, "e": torch.float32
    }  # fmt: skip
    assert {k: steps[k].dtype for k in dtypes} == {k: expected[k] for k in dtypes}
    assert steps["a"] is steps["c"] is steps.get("e", steps["a"]) and steps["b"] is steps.get("d", steps["b"])
    for _ in range(3):
        updates, state = tx.update(grads, state, params)
    for k in dtypes:
        alone = tx.init({k: params[k]})
        for _ in range(3):
            expected, alone = tx.update({k: grads[k]}, alone, {k: params[k]})
        assert_same(updates[k], expected[k], rtol=0, atol=0)
        assert_same([f[k] for f in state], [f[k] for f in alone], rtol=0, atol=0)


@pytest.mark.parametrize("name", ALGORITHMS)
def test_counter_dtype_does_not_promote(name):
    """A float64 step counter (default dtype float64 at init) does not promote float32."""
    skip_unless_steps_on_gradients(name)
    params, grads = matrices_for(name, params_and_grads())
    with set_default_dtype(torch.float64):
        state = factory(name)().init(params)
    skip_without_counters(state)
    assert state.step["w"].dtype == torch.float64
    updates, new_state = factory(name)().update(grads[0], state, params)
    assert updates["w"].dtype == torch.float32
    assert new_state.step["w"].dtype == torch.float64
    # (an absent buffer, RMSprop's momentum_buffer without momentum, is an empty node: no leaves)
    assert all(t.dtype == torch.float32 for t in optree.tree_leaves(list(new_state[1:])) if t.dim() > 0)


class Layer(NamedTuple):
    weight: torch.Tensor
    bias: torch.Tensor | None


def nested_params_and_grads():
    """dicts, lists, a tuple and NamedTuples, with a None param (and its None gradient)."""
    torch.manual_seed(0)
    params = {
        "layers": [Layer(torch.randn(3, 2), None), Layer(torch.randn(2, 2), torch.randn(2))],
        "scale": (torch.randn(()),),
    }
    grads = optree.tree_map(lambda p: None if p is None else torch.randn_like(p), params, none_is_leaf=True)
    return params, grads


@pytest.mark.parametrize("name", ALGORITHMS)
def test_any_pytree_and_state_mirrors_params(name):
    """dicts, lists, nested tuples and NamedTuples; each state field mirrors the params,
    so the buffer of a param is found by the param's own path."""
    skip_unless_steps_on_gradients(name)
    params, grads = matrices_for(name, nested_params_and_grads())
    tx = factory(name)(**weight_decay(name, 0.1))
    state = tx.init(params)
    for field in state:  # an absent buffer (SGD's before its first step) an empty node
        assert optree.tree_structure(field, none_is_leaf=True, is_leaf=is_empty) == optree.tree_structure(
            params, none_is_leaf=True
        )
    updates, state = tx.update(grads, state, params)
    new = fo.apply_updates(params, updates)
    assert new["layers"][0].bias is None and isinstance(new["layers"][1], Layer)
    # same result as a flat list of the same tensors
    flat = [p for p in optree.tree_leaves(params)]
    flat_updates, _ = tx.update(optree.tree_leaves(grads), tx.init(flat), flat)
    assert_same(optree.tree_leaves(updates), flat_updates)


@pytest.mark.parametrize("name", ALGORITHMS)
def test_compiled_update_keeps_any_pytree(name):
    """Under torch.compile the pytrees are taken apart and rebuilt another way (with
    optree.tree_map, which Dynamo runs natively): the same structures, None leaves
    included, and the eager values, for an algorithm and for a chain with clipping."""
    skip_unless_steps_on_gradients(name)
    import torch._dynamo

    params, grads = matrices_for(name, nested_params_and_grads())
    grads["layers"][1] = Layer(grads["layers"][1].weight, None)  # a param without a gradient
    for tx in (
        factory(name)(**weight_decay(name, 0.1)),
        fo.chain(fo.clip_by_global_norm(0.5), factory(name)()),
    ):

        def step(grads, state, params, tx=tx):
            updates, state = tx.update(grads, state, params)
            return fo.apply_updates(params, updates), state

        torch._dynamo.reset()
        compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
        expected, got = step(grads, tx.init(params), params), compiled(grads, tx.init(params), params)
        assert optree.tree_structure(got, none_is_leaf=True) == optree.tree_structure(
            expected, none_is_leaf=True
        )
        assert_same(optree.tree_leaves(got), optree.tree_leaves(expected), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("name", ALGORITHMS)
def test_saved_state_loads_with_weights_only(name):
    """A state saved with torch.save loads with torch.load's default (weights_only=True),
    a chain's too, and steps as the original does."""
    skip_unless_steps_on_gradients(name)
    import io

    params, grads = matrices_for(name, params_and_grads())
    for tx in (make(name), fo.chain(fo.clip_by_global_norm(0.5), factory(name)())):
        _, state = run(tx, params, grads[:2])
        buffer = io.BytesIO()
        torch.save(state, buffer)
        buffer.seek(0)
        loaded = torch.load(buffer)
        assert type(loaded) is type(state)
        assert_same(
            list(tx.update(grads[2], loaded, params)),
            list(tx.update(grads[2], state, params)),
            rtol=0,
            atol=0,
        )


def is_matrix(tree):
    """A mask function that pickles: defined at module level."""
    return optree.tree_map(lambda p: p.ndim > 1, tree)


@pytest.mark.parametrize("name", ALGORITHMS)
def test_transformations_pickle(name):
    """Every transformation pickles (a chain, a clip, masked and partition too, with a
    mask that pickles), so torch.save of an `fo.Optimizer` works; the copy steps as the
    original does."""
    skip_unless_steps_on_gradients(name)
    import pickle

    params, grads = matrices_for(name, params_and_grads())
    f = factory(name)
    transforms = [
        f(lr=torch.tensor(0.05)),
        fo.chain(fo.clip_by_global_norm(torch.tensor(0.5)), f()),
        fo.masked(f(**weight_decay(name, 0.1)), is_matrix),
        fo.masked(f(), {"w": False, "b": True}),
        fo.partition({"m": f(lr=0.05), "v": fo.clip_by_global_norm(1.0)}, {"w": "m", "b": "v"}),
    ]
    for tx in transforms:
        copy_ = pickle.loads(pickle.dumps(tx))
        assert_same(
            optree.tree_leaves(run(copy_, params, grads[:3])), optree.tree_leaves(run(tx, params, grads[:3]))
        )
    model = torch.nn.Linear(3, 2, bias=not matrices_only(name))  # Muon steps no bias
    opt = fo.Optimizer(model.parameters(), transforms[1])
    model(torch.ones(3)).sum().backward()
    opt.step()
    copy_ = pickle.loads(pickle.dumps(opt))
    for opt_ in (opt, copy_):
        for p in opt_.param_groups[0]["params"]:
            p.grad = torch.ones_like(p)
        opt_.step()
    assert_same(copy_.param_groups[0]["params"], opt.param_groups[0]["params"], rtol=0, atol=0)


@pytest.mark.parametrize("name", ALGORITHMS)
def test_state_with_separate_counters(name):
    """init shares one counter tensor among the leaves; a state moved with tree_map has
    one per leaf. Its next update gives the same results, and its leaves share their
    new counters again, so that later updates compute the schedule once and step small
    tensors in groups."""
    skip_unless_steps_on_gradients(name)
    params, grads = matrices_for(name, params_and_grads())
    tx = make(name)
    _, state = run(tx, params, grads[:2])
    skip_without_counters(state)
    assert state.step["w"] is state.step["b"]
    moved = optree.tree_map(torch.clone, state)
    assert moved.step["w"] is not moved.step["b"]
    updates, new = tx.update(grads[2], moved, params)
    expected_updates, expected_state = tx.update(grads[2], state, params)
    assert_same([updates, *new], [expected_updates, *expected_state], rtol=0, atol=0)
    counters = [f for f in new._fields if not is_empty(leaf := getattr(new, f)["w"]) and leaf.dim() == 0]
    assert counters and all(getattr(new, c)["w"] is getattr(new, c)["b"] for c in counters)


@pytest.mark.parametrize("name", ALGORITHMS)
def test_none_gradient_skips_the_leaf(name):
    """A None gradient: its update is None and its state, counters included, is kept."""
    skip_unless_steps_on_gradients(name)
    params, grads = matrices_for(name, params_and_grads())
    tx = factory(name)()
    _, state = tx.update(grads[0], tx.init(params), params)
    updates, new_state = tx.update({"w": None, "b": grads[1]["b"]}, state, params)
    assert updates["w"] is None
    for old, new in zip(state, new_state):
        # an absent entry stays so (SGD's momentum_buffer without momentum, Adafactor's
        # row_var of a vector)
        assert [is_empty(new[k]) for k in ("w", "b")] == [is_empty(old[k]) for k in ("w", "b")]
        assert is_empty(old["w"]) or new["w"] is old["w"]
        assert is_empty(old["b"]) or new["b"] is not old["b"]
    if "step" in state._fields:
        assert int(new_state.step["b"]) == 2 and int(new_state.step["w"]) == 1


@pytest.mark.parametrize("name", ALGORITHMS)
def test_meta_device_params_give_the_shapes_of_a_real_step(name):
    """Params on the meta device (a model built without memory, to plan it) step like
    real ones, with no value read: updates, params and state of the same shapes,
    dtypes and structure, on the meta device."""
    skip_unless_steps_on_gradients(name)
    params, grads = matrices_for(name, params_and_grads())
    tx = make(name)
    real = run(tx, params, grads[:2])
    meta = run(tx, *optree.tree_map(lambda t: t.to("meta"), (params, grads[:2])))
    assert optree.tree_structure(meta) == optree.tree_structure(real)
    for m, r in zip(optree.tree_leaves(meta), optree.tree_leaves(real)):
        assert m.is_meta and (m.shape, m.dtype) == (r.shape, r.dtype)


@pytest.mark.parametrize("name", ALGORITHMS)
def test_bfloat16(name):
    skip_unless_steps_on_gradients(name)
    params, grads = matrices_for(name, params_and_grads(torch.bfloat16))
    new, state = run(make(name), params, grads)
    assert all(p.dtype == torch.bfloat16 for p in new.values())
    ref, _ = run(make(name), *matrices_for(name, params_and_grads(torch.float32)))
    for k in new:  # bf16 has ~3 significant digits
        torch.testing.assert_close(new[k].float(), ref[k], rtol=0.05, atol=0.05)


def test_apply_updates():
    params = {"a": torch.ones(2, dtype=torch.float16), "b": torch.ones(2), "c": torch.ones(1)}
    new = fo.apply_updates(
        params, {"a": torch.full((2,), 0.5, dtype=torch.float32), "b": None, "c": torch.ones(1)}
    )
    assert new["a"].dtype == torch.float16 and torch.equal(
        new["a"], torch.full((2,), 1.5, dtype=torch.float16)
    )
    assert new["b"] is params["b"]
    assert torch.equal(params["c"], torch.ones(1))  # not mutated
    assert torch.equal(new["c"], torch.full((1,), 2.0))


def test_apply_updates_and_update_on_empty_params():
    assert fo.apply_updates({}, {}) == {}
    tx = fo.adamax()
    updates, state = tx.update({}, tx.init({}), {})
    assert updates == {} and fo.apply_updates([], []) == []


@pytest.mark.parametrize("autograd", [False, True])
def test_apply_updates_eager_and_under_autograd(autograd):
    """Plain tensors of one dtype are added by one foreach call; under autograd each leaf
    is added by itself, and the gradient flows to params and updates."""
    params = [torch.randn(3), torch.randn(2, dtype=torch.float64), torch.randn(4), torch.randn(1)]
    updates = [torch.randn(3), torch.randn(2), None, torch.randn(1)]
    if autograd:
        params = [p.requires_grad_() for p in params]
        updates = [u if u is None else u.requires_grad_() for u in updates]
    new = fo.apply_updates(params, updates)
    expected = [p if u is None else (p + u).to(p.dtype) for p, u in zip(params, updates)]
    assert_same(new, expected, rtol=0, atol=0)
    assert new[2] is params[2]
    if autograd:
        sum(t.sum() for t in new).backward()
        assert all(torch.equal(t.grad, torch.ones_like(t)) for t in [*params, *updates] if t is not None)


@pytest.mark.parametrize("max_norm", [0.0, 0.5, 100.0])
def test_clip_by_global_norm_matches_torch(max_norm):
    torch.manual_seed(0)
    grads = [torch.randn(3, 4), torch.randn(5), torch.randn((), dtype=torch.float64)]
    clipped, state = fo.clip_by_global_norm(max_norm).update([*grads, None], fo.EmptyState())
    ps = [torch.nn.Parameter(torch.zeros_like(g)) for g in grads]
    for p, g in zip(ps, grads):
        p.grad = g.clone()
    torch.nn.utils.clip_grad_norm_(ps, max_norm)
    assert_same(clipped[:3], [p.grad for p in ps])
    assert clipped[3] is None and state == fo.EmptyState()


def test_chain_equals_clip_then_torch_nadam():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    tx = fo.chain(fo.clip_by_global_norm(0.1), fo.nadam(lr=0.01))
    state = tx.init(params)
    opt = torch.optim.NAdam(model.parameters(), lr=0.01)
    x = torch.randn(16, 4)
    for _ in range(5):
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        grads = {k: v.grad.clone() for k, v in model.named_parameters()}
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1)
        opt.step()
        updates, state = tx.update(grads, state, params)
        params = fo.apply_updates(params, updates)
    assert_same(list(params.values()), [p.detach() for p in model.parameters()])
    with pytest.raises(ValueError, match="chain of 2"):
        tx.update(grads, state[:1], params)


# -- the generic adapter ------------------------------------------------------------


def train(opt, model, steps, scheduler=None, clip=None):
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randn(16, 4, generator=gen), torch.randn(16, 3, generator=gen)
    for _ in range(steps):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        if scheduler is not None:
            scheduler.step()


@pytest.mark.parametrize("name", ALGORITHMS)
def test_optimizer_with_a_factory_equals_torch(name):
    skip_unless_steps_on_gradients(name)
    torch.manual_seed(0)
    bias = not matrices_only(name)  # Muon steps no bias
    a, b = torch.nn.Linear(4, 3, bias=bias), torch.nn.Linear(4, 3, bias=bias)
    b.load_state_dict(a.state_dict())
    train(torch_cls(name)(a.parameters(), lr=0.05), a, 6)
    opt = fo.Optimizer(b.parameters(), factory(name), lr=0.05)
    train(opt, b, 6)
    assert_same(list(b.parameters()), list(a.parameters()))
    assert list(opt.state[next(b.parameters())]) == list(factory(name)().init([torch.zeros(1, 1)])._fields)


def test_optimizer_differentiable_hypergradients_of_a_chain():
    """fo.Optimizer with differentiable=True and tensor lr and weight_decay that require
    grad: the hypergradients through three steps of a chain equal the functional inner
    loop's (the step reads copies of what it then writes into, see adapter.py)."""

    def chain(lr, weight_decay):
        return fo.chain(fo.clip_by_global_norm(1.0), fo.nadam(lr=lr, weight_decay=weight_decay))

    ours, expected = hypergradients_both_ways(
        lambda params, hp: fo.Optimizer(params, chain, **hp, differentiable=True),
        lambda hp: chain(**hp),
        {"lr": 0.05, "weight_decay": 0.1},
    )
    assert_same(ours, expected)


def test_optimizer_chain_with_scheduler_and_checkpoint():
    """A chain as a torch optimizer: lr driven by a scheduler through the factory; its
    state_dict round-trips and training resumes identically."""
    torch.manual_seed(0)
    a, b = torch.nn.Linear(4, 3), torch.nn.Linear(4, 3)
    b.load_state_dict(a.state_dict())
    ref = torch.optim.NAdam(a.parameters(), lr=0.05)
    ref_sched = torch.optim.lr_scheduler.StepLR(ref, step_size=2, gamma=0.5)

    def make(lr):
        return fo.chain(fo.clip_by_global_norm(0.5), fo.nadam(lr=lr))

    opt = fo.Optimizer(b.parameters(), make, lr=0.05)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    train(ref, a, 4, ref_sched, clip=0.5)
    train(opt, b, 4, sched)
    assert_same(list(b.parameters()), list(a.parameters()))

    saved = copy.deepcopy(opt.state_dict())
    assert set(saved["state"][0]) == {"1.step", "1.mu_product", "1.exp_avg", "1.exp_avg_sq"}
    c = copy.deepcopy(b)
    opt2 = fo.Optimizer(c.parameters(), make, lr=0.05)
    opt2.load_state_dict(saved)
    train(opt, b, 3)
    train(opt2, c, 3)
    assert_same(list(c.parameters()), list(b.parameters()))
    assert_same(opt2.state_dict(), opt.state_dict())


def test_optimizer_runs_the_transformation_per_param_group():
    """Each param group steps on its own, as in torch: a global-norm clip in the chain sees
    one group's gradients. One group with `fo.partition` for per-part learning rates clips
    over all params, as ``clip_grad_norm_(model.parameters())`` does."""
    torch.manual_seed(0)
    a, b, c = (torch.nn.Linear(4, 3) for _ in range(3))
    b.load_state_dict(a.state_dict())
    c.load_state_dict(a.state_dict())
    x = torch.randn(16, 4)

    def torch_steps(model, clip_groups):
        opt = torch.optim.NAdam([{"params": [model.weight], "lr": 0.2}, {"params": [model.bias]}], lr=0.05)
        for _ in range(4):
            opt.zero_grad()
            model(x).pow(2).mean().backward()
            for group in clip_groups(opt.param_groups):
                torch.nn.utils.clip_grad_norm_(group, 0.1)
            opt.step()

    def fo_steps(model, opt):
        for _ in range(4):
            opt.zero_grad()
            model(x).pow(2).mean().backward()
            opt.step()

    def clipped(lr):
        return fo.chain(fo.clip_by_global_norm(0.1), fo.nadam(lr=lr))

    fo_steps(b, fo.Optimizer([{"params": [b.weight], "lr": 0.2}, {"params": [b.bias]}], clipped, lr=0.05))
    ref = copy.deepcopy(a)
    torch_steps(ref, lambda groups: [g["params"] for g in groups])
    assert_same(list(b.parameters()), list(ref.parameters()))

    def global_clip(lr):
        labels = lambda tree: optree.tree_map(lambda p: "w" if p.ndim > 1 else "b", tree)  # noqa: E731
        parts = fo.partition({"w": fo.nadam(lr=lr * 4), "b": fo.nadam(lr=lr)}, labels)
        return fo.chain(fo.clip_by_global_norm(0.1), parts)

    fo_steps(c, fo.Optimizer(c.parameters(), global_clip, lr=0.05))
    torch_steps(a, lambda groups: [[p for g in groups for p in g["params"]]])
    assert_same(list(c.parameters()), list(a.parameters()))
    assert not torch.allclose(a.weight, b.weight)  # the two clips differ here


def _scale_by_count() -> fo.GradientTransformation:
    """Divides the updates by the number of steps taken: a state shared by all params
    (one global count, as optax's schedules keep), not one per param."""

    def update(updates, count, params=None):
        count = count + 1
        return optree.tree_map(lambda u: u / count, updates), count

    return fo.GradientTransformation(lambda params: torch.zeros(()), update)


def _run_both_ways(tx, init, has_grad):
    """`tx` run by fo.Optimizer (one group) and by the functional API, on the same
    gradients, None where a param's name is missing from that step's `has_grad`."""
    grads = [{k: torch.randn_like(v) if k in keys else None for k, v in init.items()} for keys in has_grad]
    params, state = dict(init), tx.init(init)
    for g in grads:
        updates, state = tx.update(g, state, params)
        params = fo.apply_updates(params, updates)
    ps = {k: torch.nn.Parameter(v.clone()) for k, v in init.items()}
    opt = fo.Optimizer(list(ps.values()), tx)
    for g in grads:
        for k, p in ps.items():
            p.grad = g[k]
        opt.step()
    assert_same([p.detach() for p in ps.values()], list(params.values()))
    return opt, list(ps.values())


LATE_A = [("b", "c"), ("b",), ("a", "b", "c"), ("a",), ("a", "b", "c")]  # "a" comes late


def test_optimizer_state_shared_by_all_params_advances_with_the_group():
    """A global count advances at every step of the group, as in the functional API with
    None gradient leaves: for a param without a gradient at a step, and for one whose
    first gradient comes late, while per-param state (NAdam's) skips, as in torch."""
    torch.manual_seed(0)
    init = {k: torch.randn(3) for k in "abc"}
    opt, ps = _run_both_ways(fo.chain(_scale_by_count(), fo.nadam(lr=0.1)), init, LATE_A)
    assert [float(opt.state[p]["0"]) for p in ps] == [5.0, 5.0, 5.0]
    assert [float(opt.state[p]["1.step"]) for p in ps] == [3.0, 4.0, 3.0]


@pytest.mark.parametrize(
    "make",
    [
        lambda: fo.chain(fo.clip_by_global_norm(0.5), fo.adamax(lr=0.05)),
        lambda: fo.masked(fo.adagrad(lr=0.1), lambda t: optree.tree_map(lambda p: p.ndim > 1, t)),
        lambda: fo.chain(_scale_by_count(), _decay_on_weights(0.05)),
    ],
    ids=["clip", "masked", "count-partition"],
)
def test_optimizer_equals_the_functional_api_with_none_gradients(make):
    """fo.Optimizer on one group steps as the functional API does with None gradient
    leaves, parts by shape included, with a param whose first gradient comes late."""
    torch.manual_seed(0)
    _run_both_ways(make(), {"a": torch.randn(4, 3), "b": torch.randn(3), "c": torch.randn(2, 2)}, LATE_A)


def _clipped_nadam(lr):
    return fo.chain(fo.clip_by_global_norm(0.5), fo.nadam(lr=lr))


def _decay_on_weights(lr):  # a part of its own for the weights: masked state is None for the biases
    labels = lambda tree: optree.tree_map(lambda p: "decay" if p.ndim > 1 else "rest", tree)  # noqa: E731
    return fo.partition({"decay": fo.nadam(lr=lr, weight_decay=0.1), "rest": fo.nadam(lr=lr)}, labels)


@pytest.mark.parametrize("make", [_clipped_nadam, _decay_on_weights])
def test_compiled_optimizer_compiles_once_without_graph_breaks(make):
    """torch.compile(step) of a transformation's adapter: the eager step's results, no
    graph break, no recompile after the first step (its state, too, is created outside
    the traced code)."""
    import torch._dynamo

    torch._dynamo.reset()
    torch.manual_seed(0)
    a, b = torch.nn.Linear(4, 3), torch.nn.Linear(4, 3)
    b.load_state_dict(a.state_dict())
    eager, compiled = fo.Optimizer(a.parameters(), make, lr=0.05), fo.Optimizer(b.parameters(), make, lr=0.05)
    # what train() calls; fullgraph: a graph break raises, as in test_adapter's compiled steps
    compiled.step = torch.compile(compiled.step, fullgraph=True, backend="aot_eager")
    for i in range(3):
        train(eager, a, 1)
        with torch._dynamo.config.patch(error_on_recompile=i > 0):
            train(compiled, b, 1)
    assert_same(list(b.parameters()), list(a.parameters()), rtol=1e-5, atol=1e-6)
    assert_same(compiled.state_dict(), eager.state_dict(), rtol=1e-5, atol=1e-6)


def test_optimizer_with_a_fixed_transformation():
    torch.manual_seed(0)
    a, b = torch.nn.Linear(4, 3), torch.nn.Linear(4, 3)
    b.load_state_dict(a.state_dict())
    train(torch.optim.Adamax(a.parameters(), lr=0.01), a, 4)
    train(fo.Optimizer(b.parameters(), fo.adamax(lr=0.01)), b, 4)
    assert_same(list(b.parameters()), list(a.parameters()))


def test_optimizer_skips_params_without_grad():
    torch.manual_seed(0)
    used, unused = torch.nn.Parameter(torch.randn(3)), torch.nn.Parameter(torch.randn(3))
    opt = fo.Optimizer(
        [used, unused], lambda lr: fo.chain(fo.clip_by_global_norm(1.0), fo.nadam(lr=lr)), lr=0.1
    )
    used.grad = torch.ones(3)
    before = unused.detach().clone()
    opt.step()
    assert torch.equal(unused.detach(), before) and unused not in opt.state
    assert float(opt.state[used]["1.step"]) == 1


@pytest.mark.parametrize("name", ["Adagrad", "Adamax"])
@pytest.mark.parametrize("numel", [7, 40_000], ids=["grouped", "alone"])
def test_update_under_autograd_rounds_as_torch_step(name, numel):
    """Where autograd records (an inner loop), the update and apply_updates round as
    torch's ``param.addcdiv_(a, b, value=-clr)``, which multiplies before it divides:
    ``(g / std) * -clr`` differed by an ulp a step, which a normalised step amplifies."""
    torch.manual_seed(0)
    w0 = torch.randn(numel)
    grads = [torch.randn(numel) * 10.0 ** torch.randint(-3, 3, (numel,)) for _ in range(6)]
    expected = w0.clone()
    opt = torch_cls(name)([expected], lr=0.3)
    tx = factory(name)(lr=0.3)
    w = w0.clone().requires_grad_(True)
    state = tx.init([w.detach()])
    for g in grads:
        expected.grad = g.clone()
        opt.step()
        updates, state = tx.update([g.clone().requires_grad_(True)], state, [w])
        (w,) = fo.apply_updates([w], updates)
    assert torch.equal(w.detach(), expected)
