"""The building blocks (optax's names, arguments and math) against optax itself: each
one, and chains of them, step for step in float64, with tensor hyperparameters too;
then what funcopt adds: vmap and grad over a hyperparameter, torch.compile, extra
arguments through chain and named_chain, None leaves, dtypes."""

from __future__ import annotations

import functools
import pickle
from typing import Any

import numpy as np
import optree
import pytest
import torch
from helpers import as_tensors, assert_same, compiled_and_eager_steps, run

import funcopt as fo

optax = pytest.importorskip("optax")
jax = pytest.importorskip("jax")
jnp = jax.numpy
jax.config.update("jax_enable_x64", True)

TOL = {"rtol": 1e-12, "atol": 1e-14}


def schedule(count: Any) -> Any:
    """A schedule both libraries can run: on a torch tensor and on a jax array (in
    float64: ``0.8 ** count`` of an int32 tensor is float32 in torch)."""
    if isinstance(count, torch.Tensor):
        count = count.double()
    return 0.5 * 0.8**count


# (name, hyperparameters): each runs in both libraries with the same arguments
CASES: list[tuple[str, dict[str, Any]]] = [
    ("identity", {}),
    ("set_to_zero", {}),
    ("scale", {"step_size": -0.3}),
    ("scale_by_learning_rate", {"learning_rate": 0.3}),
    ("scale_by_learning_rate", {"learning_rate": 0.3, "flip_sign": False}),
    ("scale_by_learning_rate", {"learning_rate": schedule}),
    ("scale_by_schedule", {"step_size_fn": schedule}),
    ("add_decayed_weights", {"weight_decay": 0.1}),
    ("add_decayed_weights", {"weight_decay": schedule}),
    ("add_decayed_weights", {"weight_decay": 0.1, "mask": {"w": True, "b": False, "s": True, "k": False}}),
    ("trace", {"decay": 0.8}),
    ("trace", {"decay": 0.8, "nesterov": True}),
    ("ema", {"decay": 0.8}),
    ("ema", {"decay": 0.8, "debias": False}),
    ("scale_by_adam", {"b1": 0.8, "b2": 0.9, "eps": 1e-3, "eps_root": 1e-4}),
    ("scale_by_adam", {"b1": 0.8, "b2": 0.9, "eps": 1e-3, "nesterov": True}),
    ("scale_by_rms", {"decay": 0.8, "eps": 1e-3, "initial_scale": 0.1}),
    ("scale_by_rms", {"decay": 0.8, "eps": 1e-3, "eps_in_sqrt": False}),
    ("scale_by_rms", {"decay": 0.8, "eps": 1e-3, "bias_correction": True}),
    ("scale_by_sign", {}),
    ("clip", {"max_delta": 0.5}),
    ("clip_by_global_norm", {"max_norm": 2.0}),  # the grads' norm is about 5: clipped
    ("clip_by_global_norm", {"max_norm": 100.0}),  # not clipped
    ("clip_by_block_rms", {"threshold": 0.7}),
    ("adaptive_grad_clip", {"clipping": 0.3, "eps": 1e-3}),
    ("centralize", {}),
    ("zero_nans", {}),
]
STEPS = 4


def case_id(case: tuple[str, dict[str, Any]]) -> str:
    name, hp = case
    flags = [k for k, v in hp.items() if v is True or v is False or callable(v) or isinstance(v, dict)]
    return "-".join([name, *flags])


def numeric(hp: dict[str, Any]) -> list[str]:
    """The names of the hyperparameters that may be tensors (numbers, not flags)."""
    return [k for k, v in hp.items() if isinstance(v, float)]


def params_and_grads(
    dtype: torch.dtype = torch.float64, seed: int = 0, nans: bool = False
) -> tuple[Any, list[Any]]:
    """Params of the shapes the blocks tell apart (a matrix, a vector, a scalar, a 4-d
    kernel) and one gradient tree per step."""
    g = torch.Generator().manual_seed(seed)
    shapes = {"w": (3, 4), "b": (4,), "s": (), "k": (2, 2, 3, 2)}

    def tree(scale: float) -> dict[str, torch.Tensor]:
        return {
            k: (scale * torch.randn(s, generator=g, dtype=torch.float64)).to(dtype) for k, s in shapes.items()
        }

    params = tree(1.0)
    grads = [tree(0.7) for _ in range(STEPS)]
    if nans:
        grads[1]["w"][0, 1] = float("nan")
        grads[2]["k"][1, 0, 2, 1] = float("nan")
    return params, grads


def to_jax(tree: Any) -> Any:
    return optree.tree_map(lambda t: jnp.asarray(t.detach().numpy()), tree)


def from_jax(tree: Any) -> Any:
    """A jax tree (of arrays) as torch tensors, with the same structure."""
    return jax.tree.map(lambda a: torch.from_numpy(np.array(a)), tree)


def assert_like_optax(ours: Any, theirs: Any, what: str, **tol: Any) -> None:
    """Leaf by leaf (both libraries flatten dicts in key order and NamedTuples by field)."""
    mine = optree.tree_leaves(ours)
    other = [torch.from_numpy(np.array(a)) for a in jax.tree.leaves(theirs)]
    assert len(mine) == len(other), f"{what}: {len(mine)} leaves, optax {len(other)}"
    for i, (a, b) in enumerate(zip(mine, other)):
        torch.testing.assert_close(a.detach(), b, msg=lambda m, i=i: f"{what}, leaf {i}: {m}", **(tol or TOL))


def optax_of(name: str, hp: dict[str, Any]) -> Any:
    return getattr(optax, name)(**hp)


def run_both(
    tx: fo.GradientTransformation, otx: Any, params: Any, grads_seq: list[Any], **extra: Any
) -> list[tuple[Any, Any, Any, Any]]:
    """Each step's (updates, state) of `tx` and of the optax `otx`."""
    state, ostate = tx.init(params), otx.init(to_jax(params))
    steps = [("init", state, None, ostate)]
    for grads in grads_seq:
        updates, state = tx.update(grads, state, params, **extra)
        oupdates, ostate = otx.update(to_jax(grads), ostate, to_jax(params))
        steps.append((updates, state, oupdates, ostate))
        params = fo.apply_updates(params, updates)
    return steps


@pytest.mark.parametrize("tensors", [False, True], ids=["numbers", "tensors"])
@pytest.mark.parametrize("case", CASES, ids=map(case_id, CASES))
def test_matches_optax(case, tensors):
    """Updates and state at every step equal optax's, with the hyperparameters as
    numbers or as 0-d float64 tensors; an extra keyword argument is ignored."""
    name, hp = case
    params, grads = params_and_grads(nans=name == "zero_nans")
    ours = as_tensors(hp, torch.float64, numeric(hp)) if tensors else hp
    steps = run_both(getattr(fo, name)(**ours), optax_of(name, hp), params, grads, value=torch.tensor(1.0))
    for i, (updates, state, oupdates, ostate) in enumerate(steps):
        if i:
            assert_like_optax(updates, oupdates, f"updates of step {i}")
            assert all(u.dtype == torch.float64 for u in optree.tree_leaves(updates))
        assert_like_optax(state, ostate, f"state after step {i}")
        assert type(state).__name__ == type(ostate).__name__


COMPLEX = [case for case in CASES if case[0] not in ("clip", "zero_nans")]  # clip orders numbers


@pytest.mark.parametrize("case", COMPLEX, ids=map(case_id, COMPLEX))
def test_complex_params_match_optax(case):
    """Complex params as optax steps them (squares as |g|^2)."""
    name, hp = case
    params, grads = params_and_grads()
    params2, grads2 = params_and_grads(seed=1)
    to_complex = lambda a, b: optree.tree_map(torch.complex, a, b)  # noqa: E731
    params = to_complex(params, params2)
    grads = [to_complex(a, b) for a, b in zip(grads, grads2)]
    for i, (updates, state, oupdates, ostate) in enumerate(
        run_both(getattr(fo, name)(**hp), optax_of(name, hp), params, grads)
    ):
        if i:
            assert_like_optax(updates, oupdates, f"updates of step {i}")
        assert_like_optax(state, ostate, f"state after step {i}")


@pytest.mark.parametrize("axis", [0, (0, 1), -1])
def test_adaptive_grad_clip_over_an_axis_matches_optax(axis):
    params, grads = params_and_grads()
    params, grads = ({k: tree[k] for k in ("w", "k")} for tree in (params, grads[0]))  # 2-d and 4-d
    tx, otx = fo.adaptive_grad_clip(0.3, axis=axis), optax.adaptive_grad_clip(0.3, axis=axis)
    (_, _, _, _), (updates, state, oupdates, ostate) = run_both(tx, otx, params, [grads])
    assert_like_optax(updates, oupdates, "updates")


def test_clip_by_global_norm_of_zero_updates_is_zero():
    """A zero update stays zero, and its gradient has no NaN (no division by a zero norm)."""
    grads = [torch.zeros(3, dtype=torch.float64, requires_grad=True)]
    (clipped,), _ = fo.clip_by_global_norm(1.0).update(grads, fo.EmptyState())
    assert torch.equal(clipped, grads[0])
    clipped.sum().backward()
    assert torch.equal(grads[0].grad, torch.ones(3, dtype=torch.float64))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", ["trace", "ema", "scale_by_adam"])
def test_accumulator_dtype_matches_optax(name, dtype):
    """mu_dtype / accumulator_dtype: the stored moment has that dtype, as optax's."""
    key = "mu_dtype" if name == "scale_by_adam" else "accumulator_dtype"
    jdtype = jnp.float32 if dtype == torch.float32 else jnp.bfloat16
    params, grads = params_and_grads()
    tx, otx = getattr(fo, name)(0.8, **{key: dtype}), getattr(optax, name)(0.8, **{key: jdtype})
    for i, (updates, state, oupdates, ostate) in enumerate(run_both(tx, otx, params, grads)):
        field = getattr(state, {"trace": "trace", "ema": "ema", "scale_by_adam": "mu"}[name])
        assert all(t.dtype == dtype for t in optree.tree_leaves(field))
        tol = {"rtol": 1e-2, "atol": 1e-2} if dtype == torch.bfloat16 else {"rtol": 1e-6, "atol": 1e-7}
        if i:
            assert_like_optax(updates, oupdates, f"updates of step {i}", **tol)
        wide = optree.tree_map(lambda t: t.double(), state)
        assert_like_optax(wide, jax.tree.map(lambda a: a.astype(jnp.float64), ostate), "state", **tol)


# ---------------------------------------------------------------- chains


def adamw_recipe(
    learning_rate: Any, weight_decay: float = 0.05, mask: Any = None
) -> fo.GradientTransformation:
    return fo.chain(
        fo.scale_by_adam(b1=0.8, b2=0.9, eps=1e-3),
        fo.add_decayed_weights(weight_decay, mask),
        fo.scale_by_learning_rate(learning_rate),
    )


@pytest.mark.parametrize("mask", [None, {"w": True, "b": False, "s": False, "k": True}], ids=["all", "mask"])
@pytest.mark.parametrize("learning_rate", [0.1, schedule], ids=["number", "schedule"])
def test_adamw_recipe_matches_optax_adamw(learning_rate, mask):
    params, grads = params_and_grads()
    otx = optax.adamw(learning_rate, b1=0.8, b2=0.9, eps=1e-3, weight_decay=0.05, mask=mask)
    for i, (updates, state, oupdates, ostate) in enumerate(
        run_both(adamw_recipe(learning_rate, mask=mask), otx, params, grads)
    ):
        if i:
            assert_like_optax(updates, oupdates, f"updates of step {i}")
        assert_like_optax(state, ostate, f"state after step {i}")


def everything() -> list[tuple[str, fo.GradientTransformation]]:
    """Every building block once, in an order that keeps the updates finite."""
    return [
        ("nans", fo.zero_nans()),
        ("centralize", fo.centralize()),
        ("agc", fo.adaptive_grad_clip(0.3)),
        ("block", fo.clip_by_block_rms(0.7)),
        ("global", fo.clip_by_global_norm(2.0)),
        ("clip", fo.clip(0.5)),
        ("trace", fo.trace(0.5, nesterov=True)),
        ("ema", fo.ema(0.7)),
        ("rms", fo.scale_by_rms(0.8, eps=1e-3, bias_correction=True)),
        ("adam", fo.scale_by_adam(0.8, 0.9, eps=1e-3)),
        ("sign", fo.scale_by_sign()),
        ("identity", fo.identity()),
        ("wd", fo.add_decayed_weights(schedule)),
        ("schedule", fo.scale_by_schedule(schedule)),
        ("scale", fo.scale(0.5)),
        ("lr", fo.scale_by_learning_rate(0.1)),
    ]


def optax_everything() -> list[tuple[str, Any]]:
    return [
        ("nans", optax.zero_nans()),
        ("centralize", optax.centralize()),
        ("agc", optax.adaptive_grad_clip(0.3)),
        ("block", optax.clip_by_block_rms(0.7)),
        ("global", optax.clip_by_global_norm(2.0)),
        ("clip", optax.clip(0.5)),
        ("trace", optax.trace(0.5, nesterov=True)),
        ("ema", optax.ema(0.7)),
        ("rms", optax.scale_by_rms(0.8, eps=1e-3, bias_correction=True)),
        ("adam", optax.scale_by_adam(0.8, 0.9, eps=1e-3)),
        ("sign", optax.scale_by_sign()),
        ("identity", optax.identity()),
        ("wd", optax.add_decayed_weights(schedule)),
        ("schedule", optax.scale_by_schedule(schedule)),
        ("scale", optax.scale(0.5)),
        ("lr", optax.scale_by_learning_rate(0.1)),
    ]


def test_chain_of_everything_matches_optax():
    params, grads = params_and_grads(nans=True)
    tx = fo.chain(*(t for _, t in everything()))
    otx = optax.chain(*(t for _, t in optax_everything()))
    for i, (updates, state, oupdates, ostate) in enumerate(run_both(tx, otx, params, grads)):
        if i:
            assert_like_optax(updates, oupdates, f"updates of step {i}")
        assert_like_optax(state, ostate, f"state after step {i}")


def test_named_chain_state_by_name_matches_optax():
    params, grads = params_and_grads(nans=True)
    tx, otx = fo.named_chain(*everything()), optax.named_chain(*optax_everything())
    names = [name for name, _ in everything()]
    for i, (updates, state, oupdates, ostate) in enumerate(run_both(tx, otx, params, grads)):
        assert type(state) is dict and list(state) == names  # in order, as optax's OrderedDict
        assert isinstance(state["adam"], fo.ScaleByAdamState) and isinstance(state["nans"], fo.ZeroNansState)
        if i:
            assert_like_optax(updates, oupdates, f"updates of step {i}")
        for name in names:
            assert_like_optax(state[name], ostate[name], f"state {name!r} after step {i}")


def test_named_chain_rejects_bad_arguments():
    with pytest.raises(ValueError, match="a name of its own"):
        fo.named_chain(("a", fo.identity()), ("a", fo.scale(2.0)))
    with pytest.raises(TypeError, match=r"argument 0\): expected a pair"):
        fo.named_chain(fo.identity())
    with pytest.raises(TypeError, match="call it"):
        fo.named_chain(("a", fo.identity))
    tx = fo.named_chain(("a", fo.identity()))
    with pytest.raises(ValueError, match=r"got a state with keys \['b'\]"):
        tx.update([torch.ones(1)], {"b": fo.EmptyState()})


def recorder(seen: list[dict[str, Any]]) -> fo.GradientTransformation:
    """A transformation that records the extra keyword arguments of each update."""

    def update(updates: Any, state: Any, params: Any = None, **extra_args: Any) -> Any:
        seen.append(extra_args)
        return updates, state

    return fo.GradientTransformation(lambda params: fo.EmptyState(), update)


@pytest.mark.parametrize("combine", ["chain", "named_chain"])
def test_extra_args_pass_through_chains(combine):
    """Extra keyword arguments reach each transformation, nested chains included; the
    blocks ignore them; with none given, an algorithm (which takes none) chains too."""
    seen: list[dict[str, Any]] = []

    def make(*txs: fo.GradientTransformation) -> fo.GradientTransformation:
        return (
            fo.chain(*txs)
            if combine == "chain"
            else fo.named_chain(*((str(i), t) for i, t in enumerate(txs)))
        )

    tx = make(fo.scale_by_adam(), recorder(seen), make(fo.clip(1.0), recorder(seen)), fo.scale(-0.1))
    params = [torch.ones(2)]
    value_fn = lambda p: p[0].sum()  # noqa: E731
    updates, state = tx.update([torch.ones(2)], tx.init(params), params, value=3.0, value_fn=value_fn)
    assert seen == [{"value": 3.0, "value_fn": value_fn}] * 2
    assert_same(updates, [torch.full((2,), -0.1)], rtol=1e-6, atol=0)
    tx = make(fo.clip_by_global_norm(1.0), fo.adamax(lr=0.1))
    updates, _ = tx.update([torch.ones(2)], tx.init(params), params)
    assert_same(updates, [torch.full((2,), -0.1)], rtol=1e-6, atol=0)


def test_transformations_pickle():
    """Each block (and chains of them) is built from module-level functions: it pickles,
    as torch.save of an optimizer needs."""
    tx = fo.named_chain(*everything())
    params, grads = params_and_grads()
    again = pickle.loads(pickle.dumps(tx))
    assert_same(run(again, params, grads), run(tx, params, grads))


# ---------------------------------------------------------------- pure, None, dtypes


STATEFUL = ["trace", "ema", "scale_by_adam", "scale_by_rms", "zero_nans"]


@pytest.mark.parametrize("name", STATEFUL)
def test_none_updates_pass_and_keep_their_state(name):
    """A None update stays None and its buffers keep their values (the count, which is
    global, still advances); nothing given is mutated."""
    tx = (
        getattr(fo, name)()
        if name in ("scale_by_adam", "scale_by_rms", "zero_nans")
        else getattr(fo, name)(0.8)
    )
    params, grads = params_and_grads()
    state = tx.init(params)
    updates, state = tx.update(grads[0], state, params)
    before = optree.tree_map(torch.clone, (grads[1], state, params))
    updates, new = tx.update({**grads[1], "b": None}, state, params)
    assert updates["b"] is None
    for field in new._fields:
        if field != "count":
            assert getattr(new, field)["b"] is getattr(state, field)["b"]
            assert (
                not torch.equal(getattr(new, field)["w"], getattr(state, field)["w"]) or name == "zero_nans"
            )
    assert_same((grads[1], state, params), before, rtol=0, atol=0)


def test_state_mirrors_params_with_none():
    params = {"w": torch.ones(2), "frozen": None}
    state = fo.scale_by_adam().init(params)
    assert_same(state.mu, {"w": torch.zeros(2), "frozen": None})
    updates, _ = fo.scale_by_adam().update({"w": torch.ones(2), "frozen": None}, state)
    assert updates["frozen"] is None


@pytest.mark.parametrize("case", CASES, ids=map(case_id, CASES))
def test_float32_stays_float32_with_float64_tensor_hyperparameters(case):
    """A float32 leaf (a 0-d one too) stays float32 in updates and state, and steps as
    the float64 run does, to float32 round-off."""
    name, hp = case
    params, grads = params_and_grads(torch.float32, nans=name == "zero_nans")
    tx = getattr(fo, name)(**as_tensors(hp, torch.float64, numeric(hp)))
    state = tx.init(params)
    p64, g64 = params_and_grads(torch.float64, nans=name == "zero_nans")
    tx64 = getattr(fo, name)(**hp)
    state64 = tx64.init(p64)
    for g, gg in zip(grads, g64):
        updates, state = tx.update(g, state, params)
        updates64, state64 = tx64.update(gg, state64, p64)
        for u in optree.tree_leaves((updates, state)):
            assert u.dtype in (torch.float32, torch.int32, torch.bool), u.dtype
        ours = optree.tree_map(lambda t: t.double() if t.is_floating_point() else t, (updates, state))
        assert_same(ours, (updates64, state64), rtol=1e-4, atol=1e-5)
        params, p64 = fo.apply_updates(params, updates), fo.apply_updates(p64, updates64)


def test_count_saturates_at_the_largest_int32():
    top = torch.tensor(torch.iinfo(torch.int32).max, dtype=torch.int32)
    for tx in (fo.scale_by_schedule(schedule), fo.ema(0.9), fo.scale_by_adam()):
        state = tx.init([torch.ones(2)])._replace(count=top)
        _, state = tx.update([torch.ones(2)], state)
        assert state.count.dtype == torch.int32 and state.count == top


def test_errors_say_what_to_pass():
    params = [torch.ones(2)]
    with pytest.raises(ValueError, match="needs the params"):
        fo.add_decayed_weights(0.1).update(params, fo.EmptyState())
    with pytest.raises(ValueError, match="needs the params"):
        fo.adaptive_grad_clip(0.1).update(params, fo.EmptyState())
    with pytest.raises(TypeError, match="pass the ScaleByAdamState that init returned"):
        fo.scale_by_adam().update(params, fo.EmptyState())
    with pytest.raises(TypeError, match="must be a torch.dtype"):
        fo.trace(0.9, accumulator_dtype="bfloat16")
    with pytest.raises(TypeError, match="function of the step count"):
        fo.scale_by_schedule(0.1)
    with pytest.raises(ValueError, match="non-negative"):
        fo.clip(-1.0)
    with pytest.raises(ValueError, match="no default units"):
        fo.adaptive_grad_clip(0.1).update(
            [torch.ones(1, 2, 1, 2, 1, 2)], fo.EmptyState(), [torch.ones(1, 2, 1, 2, 1, 2)]
        )
    tx = fo.trace(0.9)
    with pytest.raises(ValueError, match="state holds a NoneType"):
        tx.update([torch.ones(2)], tx.init([None]))


# ---------------------------------------------------------------- vmap, grad, compile


# (name, fixed hyperparameters, the one batched and differentiated, its value)
HYPER = [
    ("scale", {}, "step_size", -0.3),
    ("scale_by_learning_rate", {}, "learning_rate", 0.3),
    ("add_decayed_weights", {}, "weight_decay", 0.1),
    ("trace", {"nesterov": True}, "decay", 0.8),
    ("ema", {}, "decay", 0.8),
    ("scale_by_adam", {"b2": 0.9, "eps": 1e-3}, "b1", 0.8),
    ("scale_by_adam", {"b1": 0.8, "eps": 1e-3}, "b2", 0.9),
    ("scale_by_adam", {"eps_root": 1e-3}, "eps", 0.1),
    ("scale_by_rms", {"bias_correction": True, "eps": 1e-3}, "decay", 0.8),
    ("scale_by_rms", {"decay": 0.8}, "eps", 0.1),
    ("scale_by_rms", {"decay": 0.8}, "initial_scale", 0.2),
    ("clip", {}, "max_delta", 0.3),
    ("clip_by_global_norm", {}, "max_norm", 2.0),
    ("clip_by_block_rms", {}, "threshold", 0.4),
    ("adaptive_grad_clip", {}, "clipping", 0.1),
]


PARAMS, GRADS = params_and_grads()


def final_params(name: str, fixed: dict[str, Any], key: str, value: Any) -> Any:
    """The params after the steps of ``chain(block, scale(-0.5))``, or of the block
    alone where it makes the step itself (a learning rate)."""
    params, grads = PARAMS, GRADS
    tx = getattr(fo, name)(**fixed, **{key: value})
    if name not in ("scale", "scale_by_learning_rate"):
        tx = fo.chain(tx, fo.scale(-0.5))
    return run(tx, params, grads)[0]


@pytest.mark.parametrize("name, fixed, key, value", HYPER, ids=[f"{h[0]}-{h[2]}" for h in HYPER])
def test_vmap_over_a_hyperparameter_equals_a_loop(name, fixed, key, value):
    values = torch.tensor([0.7, 1.0, 1.3], dtype=torch.float64) * value
    batched = torch.func.vmap(functools.partial(final_params, name, fixed, key))(values)
    for i, v in enumerate(values):
        expected = final_params(name, fixed, key, v)
        assert_same(optree.tree_map(lambda t, i=i: t[i], batched), expected, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("name, fixed, key, value", HYPER, ids=[f"{h[0]}-{h[2]}" for h in HYPER])
def test_grad_over_a_hyperparameter_equals_finite_differences(name, fixed, key, value):
    weights = params_and_grads(seed=7)[0]  # the loss: a weighted sum of the final params

    def loss(v: torch.Tensor) -> torch.Tensor:
        final = final_params(name, fixed, key, v)
        return sum((final[k] * weights[k]).sum() for k in final)

    v = torch.tensor(value, dtype=torch.float64)
    grad = torch.func.grad(loss)(v)
    h = 1e-6
    expected = (loss(v + h) - loss(v - h)) / (2 * h)
    torch.testing.assert_close(grad, expected, rtol=1e-6, atol=1e-9)
    assert grad != 0  # the hyperparameter matters at this value


@pytest.mark.slow
def test_compiled_steps_equal_eager_without_recompiling():
    """One compiled step of every block in a chain (stateful ones, schedules' counts
    included): fullgraph, no recompile as the counts advance, eager's numbers."""
    params, grads = params_and_grads(torch.float32, nans=True)
    for tx in (fo.chain(*(t for _, t in everything())), fo.named_chain(*everything())):
        compiled, eager = compiled_and_eager_steps(tx, params, grads)
        assert_same(compiled, eager, rtol=1e-5, atol=1e-6)
