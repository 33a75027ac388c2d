"""The catalogue (optax's blocks, aliases and contrib optimizers) against optax itself:
each run 20 steps in float64 beside optax on JAX, params and updates equal to 1e-9
relative; and each state keeps one tree structure (shapes, dtypes) from init on."""

from __future__ import annotations

import functools
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
    return dict(_tree(seed, scale))  # made once (also outside vmap, where randn may not run)


@functools.cache
def _tree(seed: int, scale: float) -> tuple[tuple[str, torch.Tensor], ...]:
    g = torch.Generator().manual_seed(seed)
    return tuple((k, scale * torch.randn(s, generator=g, dtype=torch.float64)) for k, s in SHAPES.items())


for _seed in [0, *range(100, 180)]:
    tree(_seed, 1.0 if _seed == 0 else 0.5)


def to_jax(t: Any) -> Any:
    return optree.tree_map(lambda x: jnp.asarray(x.detach().numpy()), t)


def loss(params: Any, lib: Any) -> Any:
    """A loss both libraries compute from their params: ``0.5 |p|^2 + 1``."""
    return 0.5 * sum(lib.sum(p * p) for p in optree.tree_leaves(params)) + 1.0


def grads_at(params: Any, step: int, lib: Any) -> Any:
    """The gradient of `loss` plus fixed noise (the same in both libraries)."""
    noise = tree(100 + step, 0.5)
    return {k: params[k] + (lib.asarray(noise[k].numpy()) if lib is jnp else noise[k]) for k in params}


def run_both(
    tx: Any, otx: Any, with_value: bool = False, steps: int = STEPS, extra: Any = None, tol: Any = None
) -> None:
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
                params[k],
                torch.from_numpy(np.array(oparams[k])),
                msg=lambda m, k=k, s=step: f"step {s}, {k}: {m}",
                **(tol or TOL),
            )
            # updates: relative to the largest (an element near zero is a difference of rounded terms)
            expected = torch.from_numpy(np.array(oupdates[k]))
            utol = dict(tol or TOL)
            utol["atol"] = max(utol["atol"], utol["rtol"] * float(expected.abs().max()))
            torch.testing.assert_close(
                updates[k], expected, msg=lambda m, k=k, s=step: f"step {s}, update {k}: {m}", **utol
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
    ("scale_by_lion", {}),
    ("scale_by_lion", {"b1": 0.5, "b2": 0.8, "mode": "smooth", "smooth_beta": 3.0}),
    ("scale_by_lion", {"mode": "refined"}),
    ("scale_by_amsgrad", {"b2": 0.9, "eps_root": 1e-3}),
    ("scale_by_amsgrad", {"bias_correction_mu": False, "bias_correction_nu": False}),
    ("scale_by_adamax", {}),
    ("scale_by_adan", {}),
    ("scale_by_adan", {"eps_root": 1e-4}),
    ("scale_by_novograd", {}),
    ("scale_by_novograd", {"weight_decay": 0.1, "b2": 0.5}),
    ("scale_by_stddev", {}),
    (
        "scale_by_stddev",
        {"decay": 0.8, "eps": 1e-2, "eps_in_sqrt": False, "bias_correction": True, "initial_scale": 1.0},
    ),
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


SCALING: list[tuple[str, dict[str, Any]]] = [
    ("scale_by_trust_ratio", {}),
    ("scale_by_trust_ratio", {"min_norm": 0.5, "trust_coefficient": 0.1, "eps": 1e-3}),
    ("scale_by_param_block_norm", {}),
    ("scale_by_param_block_rms", {"min_scale": 0.5}),
    ("normalize_by_update_norm", {"scale_factor": 2.0}),
    ("scale_by_distance_over_gradients", {"param_dtype": "float64"}),
    ("scale_by_distance_over_gradients", {"reps_rel": 1e-2, "global_scale": 0.5, "param_dtype": "float64"}),
    ("scale_by_factored_rms", {"min_dim_size_to_factor": 2, "decay_rate_fn": "fixed"}),
    ("scale_by_factored_rms", {"factored": False, "decay_rate_fn": "fixed", "step_offset": 2}),
    ("scale_by_factored_rms", {"min_dim_size_to_factor": 2}),
]


def fixed_rate(i: Any, rate: Any) -> Any:
    """A factored-rms decay both libraries compute in float64."""
    return 1.0 - 0.5 * rate ** (i + 1.0)


def in_lib(hp: dict[str, Any], lib: Any) -> dict[str, Any]:
    out = dict(hp)
    if "param_dtype" in out:
        out["param_dtype"] = torch.float64 if lib is torch else jnp.float64
    if out.get("decay_rate_fn") == "fixed":
        out["decay_rate_fn"] = (
            (lambda i, r: fixed_rate(i.double(), r))
            if lib is torch
            else (lambda i, r: fixed_rate(i.astype(jnp.float64), r))
        )
    return out


@pytest.mark.parametrize("case", SCALING, ids=map(case_id, SCALING))
def test_scaling_block_matches_optax(case):
    name, hp = case
    tx, otx = getattr(fo, name)(**in_lib(hp, torch)), getattr(optax, name)(**in_lib(hp, jnp))
    tol = (
        {} if hp.get("decay_rate_fn") or name != "scale_by_factored_rms" else {"rtol": 1e-5, "atol": 1e-7}
    )  # float32 decay, as optax
    run_both(fo.chain(tx, fo.scale(-0.05)), optax.chain(otx, optax.scale(-0.05)), tol=tol)


def test_trust_ratio_gradient_at_a_zero_update():
    """The trust ratio (Lars's, algorithms/catalogue_more.py) is 1 where the update's norm
    is 0, and its gradient there finite: the division it does not take is guarded."""
    p, u = torch.tensor([3.0, 4.0], requires_grad=True), torch.zeros(2, requires_grad=True)
    out = fo.scale_by_trust_ratio(eps=0.0).update([u], fo.EmptyState(), [p])[0][0]
    p_grad, u_grad = torch.autograd.grad(out.sum(), (p, u))
    assert torch.equal(p_grad, torch.zeros(2)) and torch.equal(u_grad, torch.ones(2))


@pytest.mark.parametrize("variant", ["sps", "sps+"])
def test_polyak_matches_optax(variant):
    hp = {"f_min": 0.5, "max_learning_rate": 0.3, "eps": 1e-3, "variant": variant}
    run_both(
        fo.chain(fo.scale_by_polyak(**hp), fo.scale(-1.0)),
        optax.chain(optax.scale_by_polyak(**hp), optax.scale(-1.0)),
        with_value=True,
    )


def test_keep_params_nonnegative_matches_optax():
    run_both(
        fo.chain(fo.scale(-0.5), fo.keep_params_nonnegative()),
        optax.chain(optax.scale(-0.5), optax.keep_params_nonnegative()),
    )


def test_apply_every_matches_optax():
    run_both(
        fo.chain(fo.apply_every(3), fo.scale(-0.1)), optax.chain(optax.apply_every(3), optax.scale(-0.1))
    )


def test_freeze_selective_multi_transform_match_optax():
    mask = {"w": True, "b": False, "k": True}
    labels = {"w": "a", "b": "b", "k": "b"}
    run_both(
        fo.chain(fo.freeze(mask), fo.scale_by_yogi(), fo.scale(-0.1)),
        optax.chain(optax.freeze(mask), optax.scale_by_yogi(), optax.scale(-0.1)),
    )
    run_both(
        fo.chain(fo.selective_transform(fo.scale_by_yogi(), freeze_mask=mask), fo.scale(-0.1)),
        optax.chain(optax.selective_transform(optax.scale_by_yogi(), freeze_mask=mask), optax.scale(-0.1)),
    )
    run_both(
        fo.multi_transform({"a": fo.scale_by_adan(), "b": fo.scale(-0.1)}, labels),
        optax.multi_transform({"a": optax.scale_by_adan(), "b": optax.scale(-0.1)}, labels),
    )


def test_inject_stateful_hyperparams_matches_optax():
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        otx = optax.inject_stateful_hyperparams(optax.scale_by_yogi)(b1=lambda c: 0.5 + 0.4 * 0.9**c, b2=0.99)
    tx = fo.inject_stateful_hyperparams(fo.scale_by_yogi)(b1=lambda c: 0.5 + 0.4 * 0.9 ** c.double(), b2=0.99)
    run_both(fo.chain(tx, fo.scale(-0.1)), optax.chain(otx, optax.scale(-0.1)))


class LossScale:
    """A stateful schedule: the step size follows the last loss (a `StatefulSchedule`)."""

    def init(self) -> Any:
        return torch.tensor(0.0, dtype=torch.float64)

    def update(self, state: Any, value: Any = None, **extra: Any) -> Any:
        return torch.as_tensor(value, dtype=torch.float64)

    def __call__(self, state: Any, value: Any = None, **extra: Any) -> Any:
        return -0.1 * (state if value is None else torch.as_tensor(value, dtype=torch.float64))


def test_inject_stateful_schedule_sees_extra_args():
    tx = fo.chain(fo.inject_stateful_hyperparams(fo.scale)(step_size=LossScale()))
    g = [torch.ones(2, dtype=torch.float64)]
    s = tx.init(g)
    spec = structure(s)
    u, s = tx.update(g, s, g, value=torch.tensor(3.0, dtype=torch.float64))
    assert structure(s) == spec
    torch.testing.assert_close(u[0], torch.full((2,), -0.3, dtype=torch.float64))
    assert float(s[0].hyperparams_states["step_size"]) == 3.0


def test_schedules_match_optax():
    cases = [
        ("warmup_constant_schedule", {"init_value": 0.1, "peak_value": 1.0, "warmup_steps": 7}),
        (
            "piecewise_interpolate_schedule",
            {
                "interpolate_type": "linear",
                "init_value": 1.0,
                "boundaries_and_scales": {3: 0.5, 8: 2.0, 12: 0.1},
            },
        ),
        (
            "piecewise_interpolate_schedule",
            {"interpolate_type": "cosine", "init_value": 2.0, "boundaries_and_scales": {4: 0.5, 9: 0.2}},
        ),
        ("piecewise_interpolate_schedule", {"interpolate_type": "linear", "init_value": 2.0}),
    ]
    for name, hp in cases:
        ours, theirs = getattr(fo, name)(**hp), getattr(optax, name)(**hp)
        for c in range(16):
            expected = float(theirs(jnp.asarray(c)))
            assert ours(c) == pytest.approx(expected, rel=1e-12, abs=1e-15), (name, c)
            assert float(ours(torch.tensor(c, dtype=torch.int32))) == pytest.approx(
                expected, rel=1e-6, abs=1e-7
            )  # float32


def test_tree_updates_match_optax():
    new, old = tree(1), tree(2)
    for steps in (4, 5):
        out = fo.periodic_update(new, old, torch.tensor(steps), 2)
        ref = optax.periodic_update(to_jax(new), to_jax(old), jnp.asarray(steps), 2)
        for k in new:
            torch.testing.assert_close(out[k], torch.from_numpy(np.array(ref[k])))
    out = fo.incremental_update(new, old, 0.3)
    ref = optax.incremental_update(to_jax(new), to_jax(old), 0.3)
    for k in new:
        torch.testing.assert_close(out[k], torch.from_numpy(np.array(ref[k])), **TOL)
    batched = {k: torch.stack([tree(i)[k] * (i + 0.1) for i in range(5)]) for k in SHAPES}
    out, n = fo.per_example_global_norm_clip(batched, 3.0)
    ref, on = optax.per_example_global_norm_clip(to_jax(batched), 3.0)
    assert int(n) == int(on) and 0 < int(n) < 5
    for k in batched:
        torch.testing.assert_close(out[k], torch.from_numpy(np.array(ref[k])), **TOL)


def test_snapshot_keeps_measurement():
    tx = fo.chain(
        fo.snapshot("norm", lambda t: torch.sqrt(sum((x * x).sum() for x in t.values()))), fo.scale(-0.1)
    )
    params = tree(0)
    s = tx.init(params)
    spec = structure(s)
    g = tree(5)
    _, s = tx.update(g, s, params)
    assert structure(s) == spec
    torch.testing.assert_close(s[0].measurement["norm"], torch.sqrt(sum((x * x).sum() for x in g.values())))


def test_add_noise_statistics_and_purity():
    """The noise has the variance ``eta / count**gamma``; the same key gives the same noise."""
    tx = fo.add_noise(eta=0.04, gamma=0.55, key=7)
    g = {"a": torch.zeros(20000, dtype=torch.float64), "b": torch.zeros(3, 3, dtype=torch.float64)}
    s0 = tx.init(g)
    spec = structure(s0)
    u1, s1 = tx.update(g, s0)
    u2, s2 = tx.update(g, s1)
    assert structure(s1) == structure(s2) == spec
    assert abs(u1["a"].std().item() - 0.2) < 0.005 and abs(u1["a"].mean().item()) < 0.005
    assert abs(u2["a"].std().item() - 0.2 / 2**0.275) < 0.005
    assert not torch.equal(u1["a"], u2["a"]) and not torch.equal(u1["a"][:9], u1["b"].flatten())
    torch.testing.assert_close(tx.update(g, s0)[0]["a"], u1["a"], rtol=0, atol=0)
    batched = torch.func.vmap(lambda key: tx.update(g, s0._replace(rng_key=key))[0]["b"])(torch.arange(3))
    assert batched.shape == (3, 3, 3) and not torch.equal(batched[0], batched[1])


ALIASES: list[tuple[str, dict[str, Any]]] = [
    ("adabelief", {"learning_rate": 0.01}),
    ("adabelief", {"learning_rate": schedule, "nesterov": True}),
    ("adamaxw", {"learning_rate": 0.01, "weight_decay": 0.1}),
    ("adamaxw", {"learning_rate": 0.01, "mask": {"w": True, "b": False, "k": True}}),
    ("adan", {"learning_rate": 0.01, "weight_decay": 0.05}),
    ("amsgrad", {"learning_rate": schedule}),
    ("fromage", {"learning_rate": 0.05}),
    ("fromage", {"learning_rate": schedule}),
    ("lamb", {"learning_rate": 0.01, "weight_decay": 0.1}),
    ("lamb", {"learning_rate": schedule, "weight_decay": 0.1, "mask": {"w": True, "b": False, "k": True}}),
    ("lars", {"learning_rate": 0.1, "weight_decay": 0.01}),
    (
        "lars",
        {
            "learning_rate": 0.1,
            "weight_decay": 0.01,
            "nesterov": True,
            "trust_ratio_mask": {"w": True, "b": False, "k": True},
        },
    ),
    ("nadamw", {"learning_rate": 0.01, "weight_decay": 0.1}),
    ("novograd", {"learning_rate": 0.01, "weight_decay": 0.1}),
    ("optimistic_gradient_descent", {"learning_rate": 0.01, "alpha": 0.5, "beta": 2.0}),
    ("optimistic_adam", {"learning_rate": 0.01}),
    ("optimistic_adam", {"learning_rate": 0.01, "optimism": 0.1, "nesterov": False}),
    ("polyak_sgd", {"max_learning_rate": 0.5, "f_min": 0.2}),
    ("polyak_sgd", {"scaling": schedule, "variant": "sps+", "eps": 1e-3}),
    ("sign_sgd", {"learning_rate": 0.01}),
    ("signum", {"learning_rate": 0.01}),
    ("sm3", {"learning_rate": 0.1}),
    ("yogi", {"learning_rate": 0.01}),
]


@pytest.mark.parametrize("case", ALIASES, ids=map(case_id, ALIASES))
def test_alias_matches_optax(case):
    import warnings

    name, hp = case
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        tx, otx = both(name, **hp)
    run_both(tx, otx, with_value=name == "polyak_sgd")


def quarter(count: Any) -> Any:
    return (count.double() if isinstance(count, torch.Tensor) else count) ** 0.25


CONTRIB: list[tuple[str, dict[str, Any]]] = [
    ("adopt", {"learning_rate": 0.01}),
    ("adopt", {"learning_rate": schedule, "nesterov": True, "b2": 0.9}),
    ("adopt", {"learning_rate": 0.01, "use_clipping": False}),
    ("ademamix", {"learning_rate": 0.01, "weight_decay": 0.1}),
    ("ademamix", {"learning_rate": 0.01, "b3": schedule, "alpha": schedule, "eps_root": 1e-4}),
    ("simplified_ademamix", {"learning_rate": 0.01, "alpha": 2.0, "weight_decay": 0.1}),
    ("simplified_ademamix", {"learning_rate": schedule, "alpha": schedule}),
    ("cocob", {}),
    ("cocob", {"learning_rate": 0.5, "alpha": 10.0, "weight_decay": 0.01}),
    ("dog", {}),
    ("dog", {"init_step": ("learning_rate", 0.01), "weight_decay": 0.01}),
    ("dog", {"init_step": ("distance", 0.1), "learning_rate": schedule}),
    ("dowg", {}),
    ("dowg", {"init_estim_sq_dist": 0.1, "weight_decay": 0.01, "learning_rate": 0.5}),
    ("madgrad", {"learning_rate": 0.01}),
    ("madgrad", {"learning_rate": schedule, "momentum": 0.5, "weight_decay": 0.1}),
    ("dadapt_adamw", {}),
    (
        "dadapt_adamw",
        {"learning_rate": schedule, "betas": (0.8, 0.99), "weight_decay": 0.1, "estim_lr0": 1e-3},
    ),
    ("prodigy", {}),
    ("prodigy", {"learning_rate": schedule, "beta3": 0.9, "weight_decay": 0.1, "estim_lr_coef": 0.5}),
    ("prodigy", {"safeguard_warmup": True, "estim_lr0": 1e-3}),
    ("momo", {}),
    (
        "momo",
        {
            "learning_rate": 0.5,
            "beta": 0.5,
            "lower_bound": 0.5,
            "weight_decay": 0.1,
            "adapt_lower_bound": True,
        },
    ),
    ("momo", {"learning_rate": schedule, "adapt_lower_bound": True}),
    ("momo_adam", {}),
    ("momo_adam", {"learning_rate": 0.1, "lower_bound": 1.0, "weight_decay": 0.1, "adapt_lower_bound": True}),
    ("reduce_on_plateau", {"patience": 2}),
    (
        "reduce_on_plateau",
        {
            "factor": 0.5,
            "patience": 1,
            "cooldown": 2,
            "accumulation_size": 2,
            "min_scale": 0.1,
            "rtol": 0.0,
            "atol": 0.5,
        },
    ),
]


@pytest.mark.parametrize("case", CONTRIB, ids=map(case_id, CONTRIB))
def test_contrib_matches_optax(case):
    name, hp = case
    tx, otx = both(name, **hp)
    # optax takes MADGRAD's sqrt(k + 1) in float32, funcopt in float64
    tol = {"rtol": 1e-5, "atol": 1e-7} if name == "madgrad" else None
    run_both(tx, otx, with_value=name in ("momo", "momo_adam", "reduce_on_plateau"), tol=tol)


def separable_loss(lib: Any, p: Any) -> Any:
    return sum(lib.sum(x**4) / 4 + lib.sum(x * x) / 2 for x in optree.tree_leaves(p))


OBJ_FN = {lib: functools.partial(separable_loss, lib) for lib in (torch, jnp)}  # one each: jax traces it once


def obj_fn(lib: Any) -> Any:
    """A separable loss (its Hessian is diagonal: Hutchinson's estimate is exact)."""
    return OBJ_FN[lib]


@pytest.mark.parametrize(
    "hp",
    [
        {},
        {"update_interval": 3, "clip_threshold": 0.5, "weight_decay": 0.0},
        {"learning_rate": schedule, "clip_threshold": None, "gamma": 0.5},
    ],
)
def test_sophia_matches_optax(hp):
    hp = {"learning_rate": 0.05, **hp}
    tx, otx = both("sophia", **hp)
    # optax's update jitted, with its obj_fn closed over (eager jax retraces lax.cond at every step)
    jitted = jax.jit(lambda g, s, p: otx.update(g, s, p, obj_fn=obj_fn(jnp)))
    ojit = optax.GradientTransformation(otx.init, lambda g, s, p, **extra: jitted(g, s, p))
    run_both(tx, ojit, extra=lambda params, step, lib: {"obj_fn": obj_fn(lib)})


def test_sophia_under_vmap_takes_both_sides():
    """Inside a torch.func transform the count cannot be read: the Hessian refresh is
    computed and picked, with the same result."""
    tx = fo.sophia(0.05, update_interval=2)
    params = tree(0)
    s = tx.init(params)
    g = grads_at(params, 0, torch)
    fn = obj_fn(torch)
    eager = [tx.update(g, s, params, obj_fn=fn)]
    eager.append(tx.update(g, eager[0][1], params, obj_fn=fn))
    batched = torch.func.vmap(lambda lr: tx.update(g, eager[0][1], params, obj_fn=fn)[0]["w"] * lr)(
        torch.ones(2, dtype=torch.float64)
    )
    torch.testing.assert_close(batched[0], eager[1][0]["w"])


@pytest.mark.parametrize("reset", [True, False])
@pytest.mark.parametrize("sync_period", [2, 3])
def test_sam_transparent_matches_optax(sync_period, reset):
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tx = fo.sam(
            fo.adabelief(0.05),
            fo.chain(fo.normalize(), fo.scale(-0.1)),
            sync_period=sync_period,
            reset_state=reset,
        )
        otx = optax.contrib.sam(
            optax.adabelief(0.05),
            optax.chain(optax.contrib.normalize(), optax.sgd(0.1)),
            sync_period=sync_period,
            reset_state=reset,
        )
    run_both(tx, otx)


@pytest.mark.parametrize("sync_period", [2, 4])
def test_sam_opaque_matches_optax(sync_period):
    tx = fo.sam(
        fo.yogi(0.05), fo.chain(fo.normalize(), fo.scale(-0.1)), sync_period=sync_period, opaque_mode=True
    )
    otx = optax.contrib.sam(
        optax.yogi(0.05),
        optax.chain(optax.contrib.normalize(), optax.sgd(0.1)),
        sync_period=sync_period,
        opaque_mode=True,
    )

    def grad_fn(lib: Any, step: int) -> Any:
        return lambda p, i: grads_at(p, 50 + step + i, lib)

    run_both(tx, otx, extra=lambda params, step, lib: {"grad_fn": grad_fn(lib, step)})


# ---------------------------------------------------------------- torch.func, compile, masks


def _extra(name: str) -> Any:
    def make(params: Any, step: int, lib: Any) -> dict[str, Any]:
        if name in ("polyak_sgd", "momo", "momo_adam", "reduce_on_plateau", "scale_by_polyak"):
            return {"value": loss(params, lib)}
        if name == "sophia":
            return {"obj_fn": obj_fn(lib)}
        if name == "sam":
            return {"grad_fn": lambda p, i: grads_at(p, 50 + step + i, lib)}
        return {}

    return make


def build(name: str, lr: Any) -> Any:
    """`name` with the learning rate `lr` (a number or a 0-d tensor)."""
    blocks = {n for n, _ in BLOCKS + SCALING} | {"scale_by_polyak", "add_noise"}
    if name in blocks:
        block = fo.add_noise(0.01, 0.55) if name == "add_noise" else getattr(fo, name)()
        return fo.chain(block, fo.scale(-lr))
    if name == "sam":
        return fo.sam(fo.adabelief(lr), fo.chain(fo.normalize(), fo.scale(-0.1)), opaque_mode=True)
    if name == "sm3":
        return fo.sm3(lr)
    if name == "reduce_on_plateau":
        return fo.chain(fo.scale(-lr), fo.reduce_on_plateau(patience=1))
    if name in ("polyak_sgd",):
        return fo.polyak_sgd(max_learning_rate=lr)
    if name in ("optimistic_adam",):
        return fo.optimistic_adam(lr)
    return getattr(fo, name)(learning_rate=lr)


ALL = sorted(
    {n for n, _ in BLOCKS + SCALING + ALIASES + CONTRIB} | {"scale_by_polyak", "add_noise", "sophia", "sam"}
)


def steps_of(tx: Any, name: str, params: Any, n: int = 3) -> Any:
    state = tx.init(params)
    for step in range(n):
        updates, state = tx.update(
            grads_at(params, step, torch), state, params, **_extra(name)(params, step, torch)
        )
        params = fo.apply_updates(params, updates)
    return params, state


@pytest.mark.parametrize("name", ALL)
def test_vmap_over_learning_rate(name):
    """A vmap over learning rates equals the loop of runs, state structure included."""
    lrs = torch.tensor([0.01, 0.03], dtype=torch.float64)
    batched = torch.func.vmap(lambda lr: steps_of(build(name, lr), name, tree(0)))(lrs)
    for i in range(2):
        single = steps_of(build(name, float(lrs[i])), name, tree(0))
        for a, b in zip(optree.tree_leaves(batched[0]), optree.tree_leaves(single[0])):
            torch.testing.assert_close(a[i], b, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("name", ["lamb", "prodigy", "adan", "momo", "scale_by_sm3", "sophia"])
def test_grad_through_steps(name):
    """torch.func.grad of the loss after 3 steps with respect to the learning rate."""

    def final_loss(lr: Any) -> Any:
        return loss(steps_of(build(name, lr), name, tree(0))[0], torch)

    g = torch.func.grad(final_loss)(torch.tensor(0.02, dtype=torch.float64))
    eps = 1e-6
    numeric = (
        final_loss(torch.tensor(0.02 + eps, dtype=torch.float64))
        - final_loss(torch.tensor(0.02 - eps, dtype=torch.float64))
    ) / (2 * eps)
    assert torch.isfinite(g)
    torch.testing.assert_close(g, numeric, rtol=1e-4, atol=1e-8)


@pytest.mark.parametrize(
    "name", ["adabelief", "scale_by_novograd", "lars", "dadapt_adamw", "momo", "scale_by_sm3"]
)
def test_masked_and_none_leaves(name):
    """Under masked (MaskedNode in the state) and with a None gradient, the state keeps
    its structure and the masked-out leaves pass through."""
    tx = fo.masked(build(name, 0.02), {"w": True, "b": False, "k": True})
    params = tree(0)
    state = tx.init(params)
    spec = structure(state)
    for step in range(2):
        grads = grads_at(params, step, torch)
        updates, state = tx.update(grads, state, params, **_extra(name)(params, step, torch))
        assert structure(state) == spec
        torch.testing.assert_close(updates["b"], grads["b"])
    if name in ("adabelief", "scale_by_novograd", "lars"):
        tx = build(name, 0.02)
        state = tx.init(params)
        grads = {**grads_at(params, 0, torch), "b": None}
        updates, new = tx.update(grads, state, params)
        assert updates["b"] is None and structure(new) == structure(state)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["lamb", "prodigy", "sophia", "reduce_on_plateau"])
def test_compiled_step_fullgraph(name):
    tx = build(name, 0.02)
    params = tree(0)
    extra = _extra(name)(params, 0, torch)

    def step(grads: Any, state: Any, params: Any, **kw: Any) -> Any:
        return tx.update(grads, state, params, **kw)

    compiled = torch.compile(step, backend="aot_eager", fullgraph=True)
    state = tx.init(params)
    for s in range(2):
        grads = grads_at(params, s, torch)
        kw = {k: v for k, v in extra.items() if k != "obj_fn"}
        if "obj_fn" in extra:
            out, ref = (
                compiled(grads, state, params, obj_fn=extra["obj_fn"]),
                step(grads, state, params, **extra),
            )
        else:
            out, ref = compiled(grads, state, params, **kw), step(grads, state, params, **kw)
        for a, b in zip(optree.tree_leaves(out), optree.tree_leaves(ref)):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)
        state = ref[1]
