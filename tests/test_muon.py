"""What is particular to Muon: 2-D params only (torch's check at construction, and at
the step for a param added later), the Newton–Schulz iteration in bfloat16 (or the
funcopt extra `ns_dtype`), the learning rate scaled by the param's shape, a tensor lr
rounding in its dtype, and the functional update under ``vmap`` over a stack of models
(each member's param is 2-D). Everything is compared with ``torch.optim.Muon``."""

from __future__ import annotations

import pytest
import torch
from helpers import assert_same, optim_inputs
from torch.func import grad, jvp, vmap

import funcopt as fo

F64 = torch.float64


def matrices(dtype=torch.float32, seed=0):
    """Wide, tall and square matrices, and a non-contiguous one."""
    g = torch.Generator().manual_seed(seed)
    return [
        torch.randn(6, 4, generator=g).to(dtype),
        torch.randn(3, 7, generator=g).to(dtype),
        torch.randn(5, 5, generator=g).to(dtype),
        torch.randn(8, 3, 2, generator=g)[..., 0].to(dtype),
    ]


def three_ways(kwargs, base, grad_steps, ns_dtype=None):
    """torch.optim.Muon, fo.Muon and fo.muon stepped side by side from `base`; yields
    after every step the three lists of params and the two optimizers."""
    ref_params = [p.clone().requires_grad_() for p in base]
    our_params = [p.clone().requires_grad_() for p in base]
    ref, ours = torch.optim.Muon(ref_params, **kwargs), fo.Muon(our_params, **kwargs)
    tx = fo.muon(**kwargs)
    f_params, f_state = list(base), tx.init(list(base))
    for grads in grad_steps:
        for ps in (ref_params, our_params):
            for p, g in zip(ps, grads):
                p.grad = None if g is None else g.clone()
        ref.step()
        ours.step()
        updates, f_state = tx.update(grads, f_state, f_params)
        f_params = fo.apply_updates(f_params, updates)
        yield ref_params, our_params, f_params, ref, ours, f_state


CASES = optim_inputs("Muon", with_flags=False) + [
    ("no nesterov", {"nesterov": False}),
    ("match_rms_adamw", {"adjust_lr_fn": "match_rms_adamw", "lr": 0.01}),
    ("original", {"adjust_lr_fn": "original", "weight_decay": 0.0}),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16], ids=str)
@pytest.mark.parametrize("desc,kwargs", CASES, ids=[d for d, _ in CASES])
def test_matches_torch(desc, kwargs, dtype):
    """torch's option table and more: the class bit for bit with torch (params and
    state), the functional update to round-off (one rounding more where it adds its
    update), with gradients that are transposed views and steps without some."""
    base = matrices(dtype)
    gen = torch.Generator().manual_seed(1)

    def gradient(i, p):
        if i == 0:  # a transposed view
            return torch.randn(p.shape[1], p.shape[0], generator=gen).to(dtype).t()
        return torch.randn(p.shape, generator=gen).to(dtype)

    steps = [[None if (k == 2 and i % 2) else gradient(i, p) for i, p in enumerate(base)] for k in range(6)]
    tol = {"rtol": 0.02, "atol": 0.02} if dtype == torch.bfloat16 else {}
    for ref_params, our_params, f_params, ref, ours, f_state in three_ways(kwargs, base, steps):
        assert_same(our_params, ref_params, rtol=0, atol=0)
        assert_same(ours.state_dict(), ref.state_dict(), rtol=0, atol=0)
        assert_same(f_params, ref_params, **tol)
        for i, p in enumerate(ref_params):
            assert_same(f_state.momentum_buffer[i], ref.state[p]["momentum_buffer"], **tol)


def test_bfloat16_params_without_nesterov_scale_the_momentum_buffer_as_torch():
    """torch 2.13 scales the Newton–Schulz input in place; for a bfloat16 param without
    Nesterov that input is the momentum buffer itself, which is then kept scaled to a
    norm of 1. funcopt keeps that, in the class and in the functional state."""
    base = matrices(torch.bfloat16)
    grads = [matrices(torch.bfloat16, seed=k + 1) for k in range(3)]
    for ref_params, _, _, ref, ours, f_state in three_ways({"nesterov": False}, base, grads):
        assert_same(ours.state_dict(), ref.state_dict(), rtol=0, atol=0)
        buffer = ref.state[ref_params[0]]["momentum_buffer"]
        torch.testing.assert_close(buffer.float().norm(), torch.tensor(1.0), rtol=0.01, atol=0)
        assert_same(f_state.momentum_buffer[0], buffer, rtol=0.02, atol=0.02)


def amplifying_run(cls, options, reload=False):
    """40 steps of a bias-free MLP on a problem that amplifies a difference of rounding;
    with `reload`, in float64, the state reloaded at step 5."""
    torch.manual_seed(0)
    dtype = F64 if reload else torch.float32
    m = torch.nn.Sequential(
        torch.nn.Linear(8, 16, bias=False), torch.nn.Tanh(), torch.nn.Linear(16, 1, bias=False)
    ).to(dtype)
    x, y = torch.randn(64, 8, dtype=dtype), torch.randn(64, 1, dtype=dtype)
    opt = cls(m.parameters(), **options)
    for i in range(40):
        if reload and i == 5:
            sd = opt.state_dict()
            opt = cls(m.parameters(), **options)
            opt.load_state_dict(sd)
        opt.zero_grad()
        torch.nn.functional.mse_loss(m(x), y).backward()
        opt.step()
    return [p.detach() for p in m.parameters()], opt.state_dict()["state"]


AMPLIFYING = [(d, k, False) for d, k in optim_inputs("Muon", with_flags=False)] + [
    ("reload", {}, True),
    ("float64 tensor lr", {"lr": torch.tensor(0.013, dtype=F64), "weight_decay": 0.37}, False),
    ("tensor momentum", {"momentum": torch.tensor(0.83), "nesterov": False}, False),
]


@pytest.mark.parametrize("desc,kwargs,reload", AMPLIFYING, ids=[d for d, _, _ in AMPLIFYING])
def test_bit_for_bit_with_torch_over_many_steps(desc, kwargs, reload):
    """Tall (16 x 8) and wide (1 x 16) layers; a tensor lr rounds ``lr * ratio`` and
    ``1 - lr * weight_decay`` in its dtype, as torch's step does."""
    options = {"lr": 0.01, **kwargs}
    assert_same(
        amplifying_run(fo.Muon, options, reload),
        amplifying_run(torch.optim.Muon, options, reload),
        rtol=0,
        atol=0,
    )


def test_only_2d_params_as_torch_checks():
    vector = torch.nn.Parameter(torch.randn(3))
    for cls in (torch.optim.Muon, fo.Muon):
        with pytest.raises(
            ValueError,
            match=r"^Muon only supports 2D parameters whereas we found a parameter with size: torch\.Size\(\[3\]\)$",
        ):
            cls([torch.nn.Parameter(torch.randn(2, 2)), vector])
        # a param group added later is not checked; its step fails (after the others')
        opt = cls([torch.nn.Parameter(torch.randn(2, 2))])
        opt.add_param_group({"params": [vector]})
        vector.grad = torch.randn(3)
        with pytest.raises(ValueError, match="^Param gradient must be a 2D matrix"):
            opt.step()
    # the functional init refuses it, as torch's constructor does (issue 62)
    tx = fo.muon()
    params = {"w": torch.randn(3, 2), "b": torch.randn(2)}
    with pytest.raises(
        ValueError,
        match=r"^Muon only supports 2D parameters whereas we found a parameter with size: "
        r"torch\.Size\(\[2\]\) \(leaf 0 of the params\)\. Give the others another optimizer",
    ):
        tx.init(params)
    # under vmap, each member is a matrix
    stacked = {"w": torch.randn(4, 3, 2)}
    assert torch.func.vmap(tx.init)(stacked).momentum_buffer["w"].shape == (4, 3, 2)
    with pytest.raises(ValueError, match="Muon only supports 2D parameters"):
        torch.func.vmap(tx.init)({"w": torch.randn(4, 3)})


def test_complex_params_are_rejected_as_torch_rejects_them():
    p = torch.nn.Parameter(torch.randn(2, 3, dtype=torch.complex64))
    for cls in (torch.optim.Muon, fo.Muon):
        opt = cls([p])
        p.grad = torch.randn_like(p)
        with pytest.raises(RuntimeError, match="^Muon does not support complex parameters$"):
            opt.step()
    with pytest.raises(RuntimeError, match="^Muon does not support complex parameters$"):
        fo.muon().init({"p": p.detach()})


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"ns_steps": 100}, "Number of steps must be less than 100 for computational efficiency"),
        ({"ns_coefficients": (3.4, -4.7)}, "Coefficients must be a tuple of exactly 3 values"),
    ],
)
def test_newton_schulz_arguments_are_checked_at_the_step_as_torch(kwargs, message):
    for make in (torch.optim.Muon, fo.Muon):
        p = torch.nn.Parameter(torch.randn(3, 2))
        opt = make([p], **kwargs)  # accepted at construction
        p.grad = torch.randn(3, 2)
        with pytest.raises(ValueError, match=f"^{message}$"):
            opt.step()
    tx = fo.muon(**kwargs)
    params = {"w": torch.randn(3, 2)}
    with pytest.raises(ValueError, match=f"^{message}$"):
        tx.update(params, tx.init(params), params)


def test_range_checks_in_torchs_words():
    for kwargs, message in [
        ({"lr": -1.0}, "Learning rate should be >= 0 but is: -1.0"),
        ({"momentum": -1.0}, "momentum should be >= 0 but is: -1.0"),
        ({"weight_decay": -1.0}, "weight decay should be >= 0 but is: -1.0"),
        ({"adjust_lr_fn": "other"}, "Adjust learning rate function other is not supported"),
    ]:
        for make in (
            lambda kwargs=kwargs: torch.optim.Muon([torch.nn.Parameter(torch.ones(2, 2))], **kwargs),
            lambda kwargs=kwargs: fo.Muon([torch.nn.Parameter(torch.ones(2, 2))], **kwargs),
            lambda kwargs=kwargs: fo.muon(**kwargs),
        ):
            with pytest.raises(ValueError, match=f"^{message}$"):
                make()


def loss_fn(params, x, y):
    return (torch.tanh(x @ params["w1"]) @ params["w2"] - y).pow(2).mean()


def problem(seed=0, dtype=F64):
    g = torch.Generator().manual_seed(seed)
    params = {
        "w1": torch.randn(6, 8, generator=g, dtype=dtype),
        "w2": torch.randn(8, 3, generator=g, dtype=dtype),
    }
    return params, torch.randn(16, 6, generator=g, dtype=dtype), torch.randn(16, 3, generator=g, dtype=dtype)


def train(tx, params, x, y, steps=3):
    adapted, state, _ = fo.inner_loop(loss_fn, params, tx, [(x, y)] * steps)
    return adapted, state


@pytest.mark.parametrize("ns_dtype", [F64, torch.float32, torch.bfloat16], ids=str)
def test_vmap_over_a_stack_of_models_equals_a_loop(ns_dtype):
    """vmap(update) over an ensemble: inside vmap each member's param is 2-D. In float64
    and float32 the members equal a loop to round-off. In bfloat16 (torch's) they agree
    to its round-off only: vmap computes ``torch.addmm`` as a product and a sum, each
    rounded, where the unbatched step rounds once."""
    _, x, y = problem()
    inits = [problem(seed)[0] for seed in range(4)]
    stacked = {k: torch.stack([p[k] for p in inits]) for k in inits[0]}
    tx = fo.muon(lr=0.05, ns_dtype=ns_dtype)
    batched, batched_state = vmap(lambda p: train(tx, p, x, y))(stacked)
    tol = {F64: 1e-12, torch.float32: 1e-5, torch.bfloat16: 0.05}[ns_dtype]
    for i, p in enumerate(inits):
        adapted, state = train(tx, p, x, y)
        for k in adapted:
            moved = (adapted[k] - p[k]).norm()  # relative to the distance moved
            assert (batched[k][i] - adapted[k]).norm() <= tol * moved
            buffer = state.momentum_buffer[k]
            assert (batched_state.momentum_buffer[k][i] - buffer).norm() <= tol * buffer.norm()


def test_vmap_over_hyperparameters_equals_a_loop():
    params, x, y = problem()
    values = {
        "lr": torch.tensor([0.01, 0.05, 0.1], dtype=F64),
        "momentum": torch.tensor([0.5, 0.8, 0.95], dtype=F64),
    }

    def f(hp):
        adapted, _ = train(fo.muon(ns_dtype=F64, weight_decay=0.05, **hp), params, x, y)
        return loss_fn(adapted, x, y)

    loop = torch.stack([f({k: v[i] for k, v in values.items()}) for i in range(3)])
    torch.testing.assert_close(vmap(f)(values), loop, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("key", ["lr", "weight_decay", "momentum", "eps"])
def test_hypergradients_match_finite_differences(key):
    """In float64 (ns_dtype), where the steps are smooth: bfloat16 rounding makes them
    a step function of the gradients."""
    params, x, y = problem()
    hp = {"lr": 0.05, "weight_decay": 0.05, "momentum": 0.8, "eps": 5.0}  # eps: a bound that binds

    def f(value):
        adapted, _ = train(fo.muon(ns_dtype=F64, **{**hp, key: value}), params, x, y)
        return loss_fn(adapted, x, y)

    value = torch.tensor(hp[key], dtype=F64)
    g = grad(f)(value)
    h = 1e-6
    torch.testing.assert_close(g, (f(value + h) - f(value - h)) / (2 * h), rtol=1e-5, atol=1e-9)
    assert g.abs() > 0
    _, tangent = jvp(f, (value,), (torch.ones((), dtype=F64),))
    torch.testing.assert_close(tangent, g, rtol=1e-9, atol=1e-12)


def test_compiled_update_without_graph_breaks_or_recompiles():
    """torch.compile(fullgraph=True) of update and apply: one graph across steps, and
    the params and state of eager steps (to float32 round-off: the compiled step adds
    its update as a product and a sum, see `ops.Pure.add`)."""
    import torch._dynamo

    torch._dynamo.reset()
    params, x, y = problem(dtype=torch.float32)
    tx = fo.muon(lr=0.05, momentum=torch.tensor(0.9))

    def step(grads, state, params):
        updates, state = tx.update(grads, state, params)
        return fo.apply_updates(params, updates), state

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    eager_p, eager_s = params, tx.init(params)
    comp_p, comp_s = params, tx.init(params)
    for i in range(3):
        grads = grad(loss_fn)(eager_p, x * (1 + i / 4), y)
        eager_p, eager_s = step(grads, eager_s, eager_p)
        with torch._dynamo.config.patch(error_on_recompile=i > 0):
            comp_p, comp_s = compiled(grads, comp_s, comp_p)
    assert_same(comp_p, eager_p, rtol=1e-6, atol=1e-7)
    assert_same(list(comp_s), list(eager_s), rtol=1e-6, atol=1e-7)


def test_compiled_class_step_matches_torch_eager():
    import torch._dynamo

    def scenario(cls):
        torch._dynamo.reset()
        torch.manual_seed(0)
        m = torch.nn.Sequential(
            torch.nn.Linear(3, 4, bias=False), torch.nn.Tanh(), torch.nn.Linear(4, 2, bias=False)
        )
        opt = cls(m.parameters(), lr=0.1)
        step = torch.compile(opt.step, fullgraph=True, backend="aot_eager") if cls is fo.Muon else opt.step
        x, y = torch.randn(8, 3), torch.randn(8, 2)
        for i in range(3):
            opt.zero_grad()
            torch.nn.functional.mse_loss(m(x), y).backward()
            with torch._dynamo.config.patch(error_on_recompile=i > 0):
                step()
        return [p.detach() for p in m.parameters()], opt.state_dict()["state"]

    assert_same(scenario(fo.Muon), scenario(torch.optim.Muon), rtol=1e-6, atol=1e-7)


def test_newton_schulz_of_a_stack_equals_each_matrix_in_float64():
    from funcopt._src.algorithms.muon import newton_schulz

    stack = torch.randn(5, 7, 4, dtype=F64)
    batched, _ = vmap(lambda m: newton_schulz(m, (3.4445, -4.775, 2.0315), 5, 1e-7, F64))(stack)
    loop = torch.stack([newton_schulz(m, (3.4445, -4.775, 2.0315), 5, 1e-7, F64)[0] for m in stack])
    torch.testing.assert_close(batched, loop, rtol=1e-12, atol=1e-12)
    # nearly orthogonal columns (singular values near 1, within the quintic's band)
    singular = torch.linalg.svdvals(loop)
    assert singular.min() > 0.5 and singular.max() < 1.5
