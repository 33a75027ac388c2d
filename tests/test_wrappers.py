"""Wrappers (`inject_hyperparams`, `MultiSteps`, `apply_if_finite`, `lookahead`,
`schedule_free`) against optax's, in float64, over several steps; and against torch.optim
where a wrapper drives one of funcopt's algorithms. Each also under torch.compile (one
graph for the whole run), vmap (over params and over a hyperparameter) and grad."""

from __future__ import annotations

import functools
import io
import math
from typing import Any, NamedTuple

import numpy as np
import optree
import pytest
import torch
from helpers import assert_same, compiled_and_eager_steps, set_default_dtype
from torch.func import vmap

import funcopt as fo
from funcopt._src.core.hyperparams import ScheduledState, with_schedules

optax = pytest.importorskip("optax")
jax = pytest.importorskip("jax")
jnp = jax.numpy
jax.config.update("jax_enable_x64", True)

F64 = torch.float64


# ------------------------------------------------------------------ a shared inner optimizer


class TraceState(NamedTuple):
    trace: Any


def sgd(learning_rate: float = 0.1, momentum: float = 0.0) -> fo.GradientTransformation:
    """optax.sgd(learning_rate, momentum)'s math (a trace ``g + momentum * t``, scaled by
    ``-learning_rate``) with funcopt's conventions: hyperparameters may be tensors."""

    def init(params):
        return TraceState(optree.tree_map(torch.zeros_like, params))

    def update(grads, state, params=None):
        trace = optree.tree_map(lambda g, t: g + momentum * t, grads, state.trace)
        return optree.tree_map(lambda t: -learning_rate * t, trace), TraceState(trace)

    return fo.GradientTransformation(init, update)


def optax_sgd(learning_rate, momentum=0.0):
    return optax.sgd(learning_rate, momentum=momentum)


# inner optimizers with optax.sgd's math: the one above (its state keeps its structure), and
# fo.sgd (torch's SGD: no momentum buffer before the first step, so the wrappers choose
# between its states in Python, in these eager runs)
INNERS = {"trace": sgd, "fo.sgd": lambda lr, momentum: fo.sgd(lr=lr, momentum=momentum)}


# ------------------------------------------------------------------------------- helpers


def params_and_grads(steps: int, seed: int = 0, dtype=F64):
    g = torch.Generator().manual_seed(seed)
    params = {"w": torch.randn(3, 2, generator=g, dtype=dtype), "b": torch.randn(2, generator=g, dtype=dtype)}
    grads = [
        optree.tree_map(lambda p: torch.randn(p.shape, generator=g, dtype=dtype), params)
        for _ in range(steps)
    ]
    return params, grads


def row(j, tree):
    """Element `j` of each leaf of a batched tree."""
    return optree.tree_map(lambda t: t[j], tree)


def to_jax(tree):
    return optree.tree_map(lambda t: jnp.asarray(t.detach().numpy()), tree)


def assert_leaves_close(actual: Any, expected: Any, what: str = "", **tol: Any) -> None:
    """The leaves of a torch tree (in optree's order) against a jax tree's (jax's order:
    both sort dict keys and keep NamedTuple fields in order)."""
    a, e = optree.tree_leaves(actual), jax.tree.leaves(expected)
    assert len(a) == len(e), f"{what}: {len(a)} leaves, optax has {len(e)}"
    for i, (x, y) in enumerate(zip(a, e)):
        y = torch.from_numpy(np.array(y))
        torch.testing.assert_close(
            x.detach().to(y.dtype), y, equal_nan=True, msg=lambda m, i=i: f"{what} leaf {i}: {m}", **tol
        )


def run_both(tx, opt, params, grads_seq, check, apply=fo.apply_updates, jax_params=None):
    """Step funcopt's `tx` and optax's `opt` on the same gradients; after each step call
    ``check(step, (updates, state, params), (updates, state, params) of optax)``."""
    state, jstate = tx.init(params), opt.init(to_jax(params) if jax_params is None else jax_params)
    jparams = to_jax(params) if jax_params is None else jax_params
    jax_update = jax.jit(opt.update)  # one trace: optax's lax.cond eagerly costs seconds a step
    for i, grads in enumerate(grads_seq):
        updates, state = tx.update(grads, state, params)
        params = apply(params, updates)
        jupdates, jstate = jax_update(to_jax(grads), jstate, jparams)
        jparams = optax.apply_updates(jparams, jupdates)
        check(i, (updates, state, params), (jupdates, jstate, jparams))
    return params, state


# -------------------------------------------------------------------------- apply_if_finite

NAN, INF = float("nan"), float("inf")


def with_bad(grads_seq, bad: dict[int, float]):
    """`grads_seq` with one element of step i's grads set to `bad[i]`."""
    out = []
    for i, grads in enumerate(grads_seq):
        if i in bad:
            grads = {**grads, "w": grads["w"].clone()}
            grads["w"][1, 0] = bad[i]
        out.append(grads)
    return out


@pytest.mark.parametrize("inner", list(INNERS))
@pytest.mark.parametrize("max_errors", [0, 2])
def test_apply_if_finite_matches_optax(max_errors, inner):
    """Skipped steps give zero updates and keep the inner state; after more than
    max_consecutive_errors in a row the update goes through (its inf/NaN too)."""
    params, grads = params_and_grads(8)
    grads = with_bad(grads, {1: NAN, 3: INF, 4: NAN, 5: -INF})  # steps 3-5: three in a row
    tx = fo.apply_if_finite(INNERS[inner](0.1, momentum=0.9), max_errors)
    opt = optax.apply_if_finite(optax_sgd(0.1, momentum=0.9), max_errors)

    def check(i, ours, theirs):
        (u, s, p), (ju, js, jp) = ours, theirs
        assert_leaves_close(u, ju, f"updates {i}")
        assert_leaves_close(p, jp, f"params {i}")
        for field in ("notfinite_count", "last_finite", "total_notfinite"):
            assert getattr(s, field).dtype == (torch.bool if field == "last_finite" else torch.int32)
            assert getattr(s, field).item() == getattr(js, field).item(), (i, field)
        if inner == "trace":
            assert_leaves_close(s.inner_state, js.inner_state, f"inner state {i}")

    _, state = run_both(tx, opt, params, grads, check)
    assert state.total_notfinite.item() == 4


def test_apply_if_finite_compiles_once_and_vmaps_over_params():
    params, grads = params_and_grads(5, dtype=torch.float32)
    grads = with_bad(grads, {1: NAN, 2: INF})
    tx = fo.apply_if_finite(fo.adamax(lr=0.1), 2)
    (cp, cs), (ep, es) = compiled_and_eager_steps(tx, params, grads)
    assert_same(cp, ep)
    assert_same(cs, es)
    assert cs.total_notfinite.item() == 2 and cs.inner_state.step["w"].item() == 3

    # a batch of two params sets, one of which sees a NaN at step 1: only it skips
    batch = optree.tree_map(lambda p: torch.stack([p, p + 1]), params)
    clean = params_and_grads(5, dtype=torch.float32)[1]
    batched_grads = [optree.tree_map(lambda a, b: torch.stack([a, b]), g, c) for g, c in zip(grads, clean)]

    def run(params, grads_seq):
        state = tx.init(params)
        for g in grads_seq:
            u, state = tx.update(g, state, params)
            params = fo.apply_updates(params, u)
        return params, state

    vp, vs = vmap(run)(batch, batched_grads)
    for j, gs in enumerate((grads, clean)):
        lp, ls = run(row(j, batch), gs)
        assert_same(row(j, vp), lp)
        assert_same(row(j, vs), ls)
    assert vs.total_notfinite.tolist() == [2, 0]


# ------------------------------------------------------------------------------- MultiSteps


@pytest.mark.parametrize(
    "k, use_grad_mean, inner",
    [
        (3, True, "trace"),
        (3, False, "trace"),
        (1, True, "trace"),
        ("schedule", True, "trace"),
        (3, True, "fo.sgd"),
    ],
)
def test_multi_steps_matches_optax(k, use_grad_mean, inner):
    """Zero updates between steps, the mean (or sum) of the mini-steps' gradients at
    each k-th; has_updated, the counters and the accumulator as optax's."""
    params, grads = params_and_grads(9)
    schedule = (lambda step: 2 + step % 2) if k == "schedule" else k  # works on torch and jax
    tx = fo.MultiSteps(INNERS[inner](0.1, momentum=0.5), schedule, use_grad_mean=use_grad_mean)
    opt = optax.MultiSteps(
        optax_sgd(0.1, momentum=0.5), schedule, use_grad_mean=use_grad_mean, accumulator_dtype=jnp.float64
    )
    updated = []

    def check(i, ours, theirs):
        (u, s, p), (ju, js, jp) = ours, theirs
        assert_leaves_close(u, ju, f"updates {i}")
        assert_leaves_close(p, jp, f"params {i}")
        assert s.mini_step.dtype == s.gradient_step.dtype == torch.int32
        assert (s.mini_step.item(), s.gradient_step.item()) == (int(js.mini_step), int(js.gradient_step)), i
        assert_leaves_close(s.acc_grads, js.acc_grads, f"acc_grads {i}")
        if inner == "trace" or i >= 2:  # (fo.sgd's momentum buffer appears at the first step)
            assert_leaves_close(s.inner_opt_state, js.inner_opt_state, f"inner state {i}")
        assert tx.has_updated(s).item() == bool(opt.has_updated(js))
        updated.append(tx.has_updated(s).item())

    run_both(tx, opt, params, grads, check)
    expected = {
        3: [False, False, True] * 3,
        1: [True] * 9,
        "schedule": [False, True, False, False, True] + [False, True, False, False],
    }
    assert updated == expected[k]


def test_multi_steps_accumulates_the_mean():
    """At the k-th mini-step the inner optimizer gets the mean of the k gradients."""
    params, grads = params_and_grads(4)
    opt = fo.MultiSteps(sgd(1.0), every_k_schedule=4)
    state = opt.init(params)
    for g in grads:
        updates, state = opt.update(g, state, params)
    mean = optree.tree_map(lambda *gs: sum(gs) / len(gs), *grads)
    assert_same(updates, optree.tree_map(torch.neg, mean))
    assert bool(opt.has_updated(state))
    assert_same(state.acc_grads, optree.tree_map(torch.zeros_like, params))


@pytest.mark.parametrize("which", ["not_finite", "large"])
def test_multi_steps_skips_as_optax(which):
    """A skipped mini-step leaves the state as it was (the skip state aside)."""
    params, grads = params_and_grads(7)
    grads = with_bad(grads, {2: NAN, 4: 1e3})  # a NaN, then a large gradient
    if which == "not_finite":
        ours, theirs = fo.skip_not_finite, optax.skip_not_finite
    else:
        ours = functools.partial(fo.skip_large_updates, max_squared_norm=100.0)
        theirs = functools.partial(optax.skip_large_updates, max_squared_norm=100.0)
    tx = fo.MultiSteps(sgd(0.1, momentum=0.5), 2, should_skip_update_fn=ours)
    opt = optax.MultiSteps(
        optax_sgd(0.1, momentum=0.5), 2, should_skip_update_fn=theirs, accumulator_dtype=jnp.float64
    )

    def check(i, ours, theirs):
        (u, s, p), (ju, js, jp) = ours, theirs
        assert_leaves_close(u, ju, f"updates {i}")
        assert_leaves_close(p, jp, f"params {i}")
        assert (s.mini_step.item(), s.gradient_step.item()) == (int(js.mini_step), int(js.gradient_step)), i
        assert_leaves_close(s.acc_grads, js.acc_grads, f"acc_grads {i}")
        assert sorted(s.skip_state) == sorted(js.skip_state)
        assert_leaves_close(s.skip_state, js.skip_state, f"skip state {i}")

    _, state = run_both(tx, opt, params, grads, check)
    assert state.gradient_step.item() == (2 if which == "not_finite" else 1) + 1


def test_multi_steps_compiles_once_vmaps_and_takes_none_grads():
    params, grads = params_and_grads(6, dtype=torch.float32)
    tx = fo.MultiSteps(fo.nadam(lr=0.1), 3).gradient_transformation()
    (cp, cs), (ep, es) = compiled_and_eager_steps(tx, params, grads)
    assert_same(cp, ep)
    assert_same(cs, es)

    # vmap over two params sets, with a param that is None (an empty node in the state)
    state = tx.init({**params, "frozen": None})
    assert isinstance(state.acc_grads["frozen"], fo.MaskedNode)
    batch = optree.tree_map(lambda p: torch.stack([p, 2 * p]), params)
    batched_grads = [optree.tree_map(lambda g: torch.stack([g, -g]), g) for g in grads]

    def run(params, grads_seq):
        params = {**params, "frozen": None}
        state = tx.init(params)
        for g in grads_seq:
            u, state = tx.update({**g, "frozen": None}, state, params)
            params = fo.apply_updates(params, u)
        assert params.pop("frozen") is None
        return params, state.acc_grads, state.mini_step  # (nadam's own state holds None for "frozen")

    batched = vmap(run)(batch, batched_grads)
    for j in range(2):
        assert_same(row(j, batched), run(row(j, batch), [row(j, g) for g in batched_grads]))


def test_multi_steps_none_gradient_skips_its_param():
    """A None gradient leaves its param's accumulator as it is, and its param unchanged."""
    params, grads = params_and_grads(2)
    opt = fo.MultiSteps(fo.adamax(lr=1.0), 2)
    state = opt.init(params)
    _, state = opt.update(grads[0], state, params)
    updates, state = opt.update({**grads[1], "b": None}, state, params)
    assert updates["b"] is None and bool(opt.has_updated(state))
    assert_same(state.acc_grads["b"], grads[0]["b"])  # not restarted
    assert_same(state.acc_grads["w"], torch.zeros(3, 2, dtype=F64))
    assert state.inner_opt_state.step["w"].item() == 1 and state.inner_opt_state.step["b"].item() == 0


# -------------------------------------------------------------------------- inject_hyperparams


def test_inject_hyperparams_matches_optax_with_a_schedule_and_a_replaced_value():
    params, grads = params_and_grads(6)
    schedule = lambda count: 0.1 / (1 + count)  # noqa: E731  (torch and jax alike)
    tx = fo.inject_hyperparams(sgd)(learning_rate=schedule, momentum=0.9)
    opt = optax.inject_hyperparams(optax_sgd)(learning_rate=schedule, momentum=0.9)
    state, jstate = tx.init(params), opt.init(to_jax(params))
    assert state.count.dtype == torch.int32 and state.hyperparams["momentum"].dtype == F64
    jparams = to_jax(params)
    for i, g in enumerate(grads):
        if i == 3:  # replace a value between steps, in both
            state = state._replace(
                hyperparams={**state.hyperparams, "momentum": torch.tensor(0.5, dtype=F64)}
            )
            jstate.hyperparams["momentum"] = jnp.asarray(0.5)
        updates, state = tx.update(g, state, params)
        params = fo.apply_updates(params, updates)
        jupdates, jstate = opt.update(to_jax(g), jstate, jparams)
        jparams = optax.apply_updates(jparams, jupdates)
        assert_leaves_close(params, jparams, f"params {i}")
        assert state.count.item() == int(jstate.count)
        assert sorted(state.hyperparams) == sorted(jstate.hyperparams)
        for k in state.hyperparams:
            assert_leaves_close(state.hyperparams[k], jstate.hyperparams[k], f"{k} {i}")
        assert_leaves_close(state.inner_state, jstate.inner_state, f"inner state {i}")


def torch_adamax_steps(params, grads, lrs, betas):
    """torch.optim.Adamax (weight_decay=0.01) with the group's lr and betas set before each step."""
    ps = {k: v.clone() for k, v in params.items()}
    opt = torch.optim.Adamax(list(ps.values()), weight_decay=0.01)
    for g, lr, beta in zip(grads, lrs, betas):
        opt.param_groups[0]["lr"], opt.param_groups[0]["betas"] = lr, beta
        for k, p in ps.items():
            p.grad = g[k]
        opt.step()
    return ps


def test_inject_and_with_schedules_drive_funcopt_algorithms_as_torch_param_groups():
    """A scheduled lr and a scheduled beta1 (in a pair) give torch.optim.Adamax's steps
    with the group's values changed before each step."""
    params, grads = params_and_grads(5)
    lr = lambda count: 0.1 * 0.8**count  # noqa: E731
    beta1 = lambda count: 0.9 - 0.1 * count  # noqa: E731
    hps = {"lr": lr, "betas": (beta1, 0.99), "weight_decay": 0.01}
    expected = torch_adamax_steps(
        params, grads, [lr(t) for t in range(5)], [(beta1(t), 0.99) for t in range(5)]
    )
    for tx in (fo.inject_hyperparams(fo.adamax)(**hps), with_schedules(fo.adamax, hps)):
        p, state = params, tx.init(params)
        for g in grads:
            u, state = tx.update(g, state, p)
            p = fo.apply_updates(p, u)
        assert_same(p, expected)
        assert state.count.item() == 5
    assert isinstance(state, ScheduledState)
    injected = fo.inject_hyperparams(fo.adamax)(**hps).init(params).hyperparams
    assert_same(
        injected,
        {
            "lr": torch.tensor(0.1, dtype=F64),
            "betas": (torch.tensor(0.9, dtype=F64), torch.tensor(0.99, dtype=F64)),
            "eps": torch.tensor(1e-8, dtype=F64),
            "weight_decay": torch.tensor(0.01, dtype=F64),
        },
    )
    # no schedule: the factory's own transformation
    assert type(with_schedules(fo.adamax, {"lr": 0.1}).init(params)) is fo.AdamaxState


def test_inject_hyperparams_compiles_once_for_a_schedule_and_a_replaced_value():
    from torch._dynamo.testing import CompileCounter

    params, grads = params_and_grads(6, dtype=torch.float32)
    tx = fo.inject_hyperparams(fo.nadam)(lr=lambda count: 0.1 / (1 + count), weight_decay=0.01)
    torch._dynamo.reset()
    counter = CompileCounter()

    def step(grads, state, params):
        updates, state = tx.update(grads, state, params)
        return fo.apply_updates(params, updates), state

    compiled = torch.compile(step, backend=counter, fullgraph=True)
    states = [tx.init(params), tx.init(params)]
    ps = [params, params]
    for i, g in enumerate(grads):
        if i == 3:
            for j in range(2):
                states[j] = states[j]._replace(
                    hyperparams={**states[j].hyperparams, "weight_decay": torch.tensor(0.5)}
                )
        ps[0], states[0] = compiled(g, states[0], ps[0])
        ps[1], states[1] = step(g, states[1], ps[1])
    assert counter.frame_count == 1
    assert_same(ps[0], ps[1], rtol=1e-6, atol=1e-6)
    assert_same(states[0], states[1], rtol=1e-6, atol=1e-6)
    assert states[0].hyperparams["lr"].item() == pytest.approx(0.1 / 6)


def test_with_schedules_compiles_once():
    params, grads = params_and_grads(4, dtype=torch.float32)
    tx = with_schedules(
        fo.nadam, {"lr": fo.linear_schedule(0.1, 0.01, 3), "betas": (fo.linear_schedule(0.5, 0.9, 3), 0.99)}
    )
    (cp, cs), (ep, es) = compiled_and_eager_steps(tx, params, grads)
    assert_same(cp, ep)
    assert_same(cs, es)
    assert cs.count.item() == 4


def test_inject_hyperparams_vmap_over_lr_equals_a_loop():
    params, grads = params_and_grads(4, dtype=torch.float32)
    lrs = torch.tensor([0.01, 0.1, 0.3])

    def run(lr):
        tx = fo.inject_hyperparams(fo.adamax)(lr=lr, betas=(0.8, 0.9))
        p, state = params, tx.init(params)
        for g in grads:
            u, state = tx.update(g, state, p)
            p = fo.apply_updates(p, u)
        return p, state

    batched, states = vmap(run)(lrs)
    for j, lr in enumerate(lrs.tolist()):
        p, _ = run(lr)
        assert_same(row(j, batched), p)
    assert_same(states.hyperparams["lr"], lrs)


def test_inject_hyperparams_hypergradient_matches_jax():
    """d(loss after 4 steps)/d(lr, momentum), through inject_hyperparams, as jax.grad's."""
    params, grads = params_and_grads(4)

    def ours(lr, momentum):
        tx = fo.inject_hyperparams(sgd)(learning_rate=lr, momentum=momentum)
        p, state = params, tx.init(params)
        for g in grads:
            u, state = tx.update(g, state, p)
            p = fo.apply_updates(p, u)
        return sum((x**2).sum() for x in optree.tree_leaves(p))

    def theirs(lr, momentum):
        opt = optax.inject_hyperparams(optax_sgd)(learning_rate=lr, momentum=momentum)
        p = to_jax(params)
        state = opt.init(p)
        for g in to_jax(grads):
            u, state = opt.update(g, state, p)
            p = optax.apply_updates(p, u)
        return sum((x**2).sum() for x in jax.tree.leaves(p))

    got = torch.func.grad(ours, argnums=(0, 1))(torch.tensor(0.1, dtype=F64), torch.tensor(0.5, dtype=F64))
    expected = jax.grad(theirs, argnums=(0, 1))(0.1, 0.5)
    for a, b in zip(got, expected):
        assert a.item() == pytest.approx(float(b), rel=1e-10)


def test_inject_hyperparams_passes_static_args_and_checks_them():
    def factory(lr: float = 0.1, mask=None, nesterov: bool = False, name: str = "x"):
        assert callable(mask) and nesterov is True and name == "y"
        return sgd(lr)

    tx = fo.inject_hyperparams(factory, static_args="mask")(lr=0.2, mask=lambda p: p, nesterov=True, name="y")
    state = tx.init({"w": torch.zeros(1)})
    assert list(state.hyperparams) == ["lr"]
    with pytest.raises(ValueError, match=r"static_args \['nope'\] are not arguments of factory"):
        fo.inject_hyperparams(factory, static_args=["nope"])
    with pytest.raises(TypeError, match=r"inject_hyperparams\(adamax\): .*'learning_rate'"):
        fo.inject_hyperparams(fo.adamax)(learning_rate=0.1)
    with pytest.raises(ValueError, match="Invalid learning rate"):  # the factory's own check, up front
        fo.inject_hyperparams(fo.adamax)(lr=-1.0)


def test_inject_hyperparams_dtype_follows_params_or_hyperparam_dtype():
    params = {"w": torch.zeros(2)}
    assert fo.inject_hyperparams(fo.adamax)(lr=1).init(params).hyperparams["lr"].dtype == torch.float32
    tx = fo.inject_hyperparams(fo.adamax, hyperparam_dtype=F64)(lr=0.1)
    assert tx.init(params).hyperparams["lr"].dtype == F64


# -------------------------------------------------------------------------------- lookahead


@pytest.mark.parametrize("inner", list(INNERS))
@pytest.mark.parametrize("reset_state", [False, True])
def test_lookahead_matches_optax(reset_state, inner):
    params, grads = params_and_grads(7)
    tx = fo.lookahead(
        INNERS[inner](0.1, momentum=0.9), sync_period=3, slow_step_size=0.4, reset_state=reset_state
    )
    opt = optax.lookahead(
        optax_sgd(0.1, momentum=0.9), sync_period=3, slow_step_size=0.4, reset_state=reset_state
    )
    start = fo.LookaheadParams.init_synced(params)

    def check(i, ours, theirs):
        (u, s, p), (_, js, jp) = ours, theirs
        assert isinstance(u, fo.LookaheadParams) and isinstance(p, fo.LookaheadParams)
        assert_leaves_close(p.fast, jp.fast, f"fast {i}")
        assert_leaves_close(p.slow, jp.slow, f"slow {i}")
        assert s.steps_since_sync.item() == int(js.steps_since_sync)
        if inner == "trace":  # (fo.sgd restarts without a momentum buffer; optax's trace at zeros)
            assert_leaves_close(s.fast_state, js.fast_state, f"fast state {i}")

    p, _ = run_both(
        tx, opt, start, grads, check, jax_params=optax.LookaheadParams.init_synced(to_jax(params))
    )
    assert not torch.equal(p.fast["w"], p.slow["w"])  # step 7 is one past a sync


def test_lookahead_compiles_once_and_differentiates_as_jax():
    params, grads = params_and_grads(5, dtype=torch.float32)
    tx = fo.lookahead(fo.adamax(lr=0.1), sync_period=2, slow_step_size=0.5, reset_state=True)
    (cp, cs), (ep, es) = compiled_and_eager_steps(tx, fo.LookaheadParams.init_synced(params), grads)
    assert_same(cp, ep)
    assert_same(cs, es)

    params, grads = params_and_grads(5)

    def loss(p, alpha, lr, *, ours):
        if ours:
            tx, apply, leaves = fo.lookahead(sgd(lr, 0.5), 2, alpha), fo.apply_updates, optree.tree_leaves
            p = fo.LookaheadParams.init_synced(p)
            gs = grads
        else:
            tx, apply, leaves = (
                optax.lookahead(optax_sgd(lr, 0.5), 2, alpha),
                optax.apply_updates,
                jax.tree.leaves,
            )
            p = optax.LookaheadParams.init_synced(p)
            gs = to_jax(grads)
        state = tx.init(p)
        for g in gs:
            u, state = tx.update(g, state, p)
            p = apply(p, u)
        return sum((x**3).sum() for x in leaves(p.slow)) + sum(x.sum() for x in leaves(p.fast))

    ours = torch.func.grad(functools.partial(loss, ours=True), argnums=(1, 2))(
        params, torch.tensor(0.5, dtype=F64), torch.tensor(0.1, dtype=F64)
    )
    theirs = jax.grad(functools.partial(loss, ours=False), argnums=(1, 2))(to_jax(params), 0.5, 0.1)
    for a, b in zip(ours, theirs):
        assert a.item() == pytest.approx(float(b), rel=1e-10)


def test_lookahead_errors():
    tx = fo.lookahead(sgd(0.1), 2, 0.5)
    params = {"w": torch.zeros(2)}
    state = tx.init(fo.LookaheadParams.init_synced(params))
    with pytest.raises(TypeError, match="params must be the LookaheadParams"):
        tx.update(params, state, params)
    with pytest.raises(ValueError, match="sync_period must be >= 1"):
        fo.lookahead(sgd(0.1), 0, 0.5)
    with pytest.warns(UserWarning, match="not a LookaheadParams"):
        tx.init(params)


# ---------------------------------------------------------------------------- schedule_free


@pytest.mark.parametrize("scheduled", [False, True])
def test_schedule_free_matches_optax(scheduled):
    """Params (y), the state's z and the eval params (x) as optax.contrib's; with a
    warmup schedule, which both the base optimizer and the averaging weights see. funcopt
    reads the schedule at the count from 0 for both, where optax's wrapper reads it one
    step later than its base optimizer (docs/wrappers.md): optax given the schedule one
    step back for its wrapper computes funcopt's steps."""
    params, grads = params_and_grads(6)
    if scheduled:  # (a schedule of an int32 count computes in the default dtype, as jax's in its)
        lr = lambda count: 0.2 * (count + 1) / (count + 3.0)  # noqa: E731
        base, jbase = with_schedules(sgd, {"learning_rate": lr}), optax_sgd(lr)
        jlr = lambda step: lr(step - 1)  # noqa: E731
    else:
        lr = jlr = 0.2
        base, jbase = sgd(lr), optax_sgd(lr)
    tx = fo.schedule_free(base, lr, b1=0.8, weight_lr_power=1.5)
    opt = optax.contrib.schedule_free(jbase, jlr, b1=0.8, weight_lr_power=1.5)

    def check(i, ours, theirs):
        (_, s, p), (_, js, jp) = ours, theirs
        assert_leaves_close(p, jp, f"params {i}")
        assert_leaves_close(s.z, js.z, f"z {i}")
        for field in ("b1", "weight_sum", "max_lr"):
            assert getattr(s, field).item() == pytest.approx(float(getattr(js, field)), rel=1e-12), field
        assert s.step_count.item() == int(js.step_count)
        assert_leaves_close(
            fo.schedule_free_eval_params(s, p), optax.contrib.schedule_free_eval_params(js, jp), f"eval {i}"
        )

    with set_default_dtype(F64):
        run_both(tx, opt, params, grads, check)


@pytest.mark.parametrize("warmup_steps", [None, 0])
@pytest.mark.parametrize("name", ["schedule_free_sgd", "schedule_free_adamw"])
def test_schedule_free_shortcuts_match_optax(name, warmup_steps):
    """Without warmup (0, the authors' default, means none, as optax's None). With a
    warmup, funcopt follows the authors, whose warmup is optax's one step earlier:
    tests/test_schedule_free.py compares it with theirs."""
    params, grads = params_and_grads(6)
    kwargs = dict(learning_rate=0.3, b1=0.8, weight_decay=0.1)
    tx = getattr(fo, name)(**kwargs, warmup_steps=warmup_steps)
    opt = getattr(optax.contrib, name)(**kwargs)

    def check(i, ours, theirs):
        (_, s, p), (_, js, jp) = ours, theirs
        assert_leaves_close(p, jp, f"params {i}")
        assert_leaves_close(
            fo.schedule_free_eval_params(s, p), optax.contrib.schedule_free_eval_params(js, jp), f"eval {i}"
        )

    run_both(tx, opt, params, grads, check)


def test_schedule_free_float32_compiles_once_and_vmaps_over_lr():
    params, grads = params_and_grads(4, dtype=torch.float32)
    tx = fo.schedule_free(fo.adagrad(lr=0.05), 0.05)  # a base optimizer without momentum
    (cp, cs), (ep, es) = compiled_and_eager_steps(tx, params, grads)
    assert_same(cp, ep)
    assert_same(cs, es)
    assert cs.max_lr.dtype == torch.float32 and cp["w"].dtype == torch.float32

    def run(lr):
        tx = fo.schedule_free(fo.adagrad(lr=lr), lr)
        p, state = params, tx.init(params)
        for g in grads:
            u, state = tx.update(g, state, p)
            p = fo.apply_updates(p, u)
        return fo.schedule_free_eval_params(state, p)

    lrs = torch.tensor([0.01, 0.05])
    batched = vmap(run)(lrs)
    for j, lr in enumerate(lrs.tolist()):
        assert_same(row(j, batched), run(lr))


def test_schedule_free_errors():
    with pytest.raises(ValueError, match="b1 must be > 0"):
        fo.schedule_free(sgd(0.1), 0.1, b1=0.0)
    for bad in (-1, 2.0, 0.0, True, False):
        with pytest.raises(ValueError, match="warmup_steps must be an int >= 0"):
            fo.schedule_free_sgd(0.1, warmup_steps=bad)
    tx = fo.schedule_free(sgd(0.1), 0.1)
    params = {"w": torch.zeros(2)}
    state = tx.init(params)
    with pytest.raises(ValueError, match="pass the params"):
        tx.update(params, state)
    with pytest.raises(ValueError, match="needs the ScheduleFreeState"):
        fo.schedule_free_eval_params(state.base_optimizer_state, params)


# ------------------------------------------------------------------------------ all wrappers


def wrappers(inner):
    return {
        "apply_if_finite": fo.apply_if_finite(inner, 2),
        "MultiSteps": fo.MultiSteps(inner, 2).gradient_transformation(),
        "inject_hyperparams": fo.inject_hyperparams(lambda lr=0.1: inner)(),
        "with_schedules": with_schedules(lambda lr: inner, {"lr": lambda c: c}),
        "lookahead": fo.lookahead(inner, 2, 0.5),
        "schedule_free": fo.schedule_free(inner, 0.1),
    }


@pytest.mark.parametrize("name", list(wrappers(sgd())))
def test_extra_args_reach_the_inner_update_only_when_given(name):
    seen = []

    def update(grads, state, params=None, **extra_args):
        seen.append(extra_args)
        return grads, state

    inner = fo.GradientTransformation(lambda p: fo.EmptyState(), update)
    tx = wrappers(inner)[name]
    params = {"w": torch.zeros(2)}
    if name == "lookahead":
        params = fo.LookaheadParams.init_synced(params)
    state = tx.init(params)
    grads = {"w": torch.ones(2)}
    _, state = tx.update(grads, state, params, loss=torch.tensor(3.0))
    _, state = tx.update(grads, state, params)
    assert len(seen) == 2 and set(seen[0]) == {"loss"} and seen[1] == {}
    # the plain sgd takes no extra arguments: without them, no error
    plain = wrappers(sgd())[name]
    plain.update(grads, plain.init(params), params)


@pytest.mark.parametrize("name", list(wrappers(sgd())))
def test_states_are_tensors_that_save_and_load(name):
    """No None leaf (vmap refuses them), int32 counters, and torch.load(weights_only=True)."""
    tx = wrappers(fo.adamax(lr=0.1))[name]
    params = {"w": torch.zeros(2)}
    if name == "lookahead":
        params = fo.LookaheadParams.init_synced(params)
    state = tx.init(params)
    _, state = tx.update({"w": torch.ones(2)}, state, params)
    leaves = optree.tree_leaves(state, none_is_leaf=True)
    assert all(isinstance(x, torch.Tensor) for x in leaves), leaves
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    assert_same(torch.load(buffer, weights_only=True), state)


@pytest.mark.parametrize("name", list(wrappers(sgd())))
def test_wrong_state_says_which(name):
    tx = wrappers(sgd())[name]
    with pytest.raises(TypeError, match="pass the .*State that init returned"):
        tx.update({"w": torch.ones(2)}, (), {"w": torch.zeros(2)})


def _grows_at_first_step() -> fo.GradientTransformation:
    """A user's transformation whose state is empty until its first update, which keeps
    the gradient there (as torch's lazily made buffers are)."""

    def update(updates, state, params=None):
        return updates, (state or optree.tree_map(torch.clone, updates))

    return fo.GradientTransformation(lambda params: (), update)


def test_a_state_that_changes_structure_is_chosen_in_python_or_refused_under_vmap():
    """A state that appears at the first update: eagerly the wrapper picks the old or the
    new state as a whole; under vmap (or compile) it cannot, and says why."""
    tx = fo.apply_if_finite(_grows_at_first_step(), 3)
    params = {"w": torch.zeros(2)}
    state = tx.init(params)
    _, skipped = tx.update({"w": torch.tensor([NAN, 1.0])}, state, params)
    assert skipped.inner_state == ()
    _, stepped = tx.update({"w": torch.tensor([2.0, 1.0])}, state, params)
    assert_same(stepped.inner_state["w"], torch.tensor([2.0, 1.0]))
    with pytest.raises(ValueError, match="another structure after this step.*take the first steps outside"):
        vmap(lambda g: tx.update({"w": g}, state, params)[0]["w"])(torch.ones(3, 2))
    # fo.sgd's buffer, with a dampening too, is there from init: vmap goes through
    tx = fo.apply_if_finite(fo.sgd(lr=0.1, momentum=0.9, dampening=0.5), 3)
    state = tx.init(params)
    batched = vmap(lambda g: tx.update({"w": g}, state, params)[0]["w"])(torch.ones(3, 2))
    assert_same(batched, torch.full((3, 2), -0.1))


def test_counters_saturate():
    tx = fo.apply_if_finite(sgd(), 1)
    params = {"w": torch.zeros(1)}
    state = tx.init(params)
    top = torch.tensor(torch.iinfo(torch.int32).max, dtype=torch.int32)
    state = state._replace(notfinite_count=top, total_notfinite=top)
    _, state = tx.update({"w": torch.tensor([math.nan])}, state, params)
    assert state.notfinite_count.item() == state.total_notfinite.item() == torch.iinfo(torch.int32).max


def test_multi_steps_checks_its_arguments():
    with pytest.raises(ValueError, match="every_k_schedule must be an int >= 1"):
        fo.MultiSteps(sgd(), 0)
    tx = fo.MultiSteps(sgd(), 2, should_skip_update_fn=lambda u, s, p: (torch.tensor(1), ()))
    with pytest.raises(ValueError, match="must return a 0-d bool tensor"):
        tx.init({"w": torch.zeros(1)})
