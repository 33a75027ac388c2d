"""What is particular to RAdam: the rectification, which starts at the sixth step (rho_t
> 5), chosen in the schedule: in Python doubles as torch's default step, and without a
branch on a tensor's value where the step count is a tensor (compiled, batched,
differentiated). Compared with torch.optim.RAdam and finite differences."""

from __future__ import annotations

import pytest
import torch
from helpers import assert_same, compiled_and_eager_steps
from torch.func import grad, jvp, vmap

import funcopt as fo
from funcopt._src.engine import algorithm

F64 = torch.float64
STEPS = 9  # the rectified branch from the sixth step on (default betas)


def params_and_grads(dtype=torch.float32, steps=STEPS, seed=0):
    g = torch.Generator().manual_seed(seed)
    base_ = [
        torch.randn(10, 5, generator=g, dtype=dtype),
        torch.randn(6, 4, 2, generator=g, dtype=dtype)[..., 0],
        torch.randn(7, generator=g, dtype=dtype),
        torch.randn((), generator=g, dtype=dtype),
    ]
    grads = [[torch.randn(p.shape, generator=g, dtype=dtype) for p in base_] for _ in range(steps)]
    return base_, grads


def torch_run(kwargs, base_, grads, cls=torch.optim.RAdam):
    params = [p.clone().requires_grad_() for p in base_]
    opt = cls(params, **kwargs)
    for step in grads:
        for p, g in zip(params, step):
            p.grad = g.clone()
        opt.step()
    return [p.detach() for p in params], opt.state_dict()


def functional_run(kwargs, base_, grads):
    tx = fo.radam(**kwargs)
    params = dict(enumerate(base_))
    state = tx.init(params)
    for step in grads:
        updates, state = tx.update(dict(enumerate(step)), state, params)
        params = fo.apply_updates(params, updates)
    return list(params.values()), state


def rho(beta2, t):
    rho_inf = 2 / (1 - beta2) - 1
    return rho_inf - 2 * t * beta2**t / (1 - beta2**t)


def test_rectification_starts_at_the_sixth_step():
    assert [rho(0.999, t) > 5 for t in range(1, 8)] == [False] * 5 + [True] * 2


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.complex64], ids=str)
@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"lr": 0.1, "betas": (0.5, 0.9), "eps": 1e-3, "maximize": True},
        {"lr": 0.1, "weight_decay": 0.1, "decoupled_weight_decay": True},
        {"lr": torch.tensor(0.05), "weight_decay": 0.1},
        {"lr": 0.1, "betas": (0.8, 0.6)},  # rho_inf = 4: never rectified
    ],
    ids=["default", "maximize", "decoupled", "tensor lr", "never rectified"],
)
def test_steps_equal_torchs_default_step_bit_for_bit(kwargs, dtype):
    base_, grads = params_and_grads(dtype)
    expected = torch_run(kwargs, base_, grads)
    # torch adds complex weight decay with complex arithmetic (an ulp off its real view's)
    exact = {} if dtype.is_complex and kwargs.get("weight_decay") else {"rtol": 0, "atol": 0}
    assert_same(torch_run(kwargs, base_, grads, fo.RAdam), expected, **exact)
    assert_same(functional_run(kwargs, base_, grads)[0], expected[0])


@pytest.mark.parametrize("kwargs", [{}, {"weight_decay": 0.1, "decoupled_weight_decay": True}])
def test_traced_schedule_is_branch_free_and_matches_torch(kwargs, monkeypatch):
    """With the schedule in float64 tensors (as under torch.func or torch.compile), the
    rectification is chosen by torch.where: the result is torch's, before and after the
    sixth step, and no tensor is read in Python."""
    base_, grads = params_and_grads(F64)
    expected = torch_run(kwargs, base_, grads)
    with monkeypatch.context() as patch:
        patch.setattr(algorithm, "tracer_active", lambda: True)  # schedules in tensors
        for reader in ("item", "__bool__", "__float__"):
            patch.setattr(torch.Tensor, reader, lambda self, r=reader: pytest.fail(f"{r} on a traced step"))
        actual, _ = functional_run(kwargs, base_, grads)
    assert_same(actual, expected[0], rtol=1e-12, atol=1e-14)


def test_compiled_update_is_one_graph_across_the_rectification():
    base_, grads = params_and_grads(torch.float32)
    params = {i: p.contiguous() for i, p in enumerate(base_)}
    grads_seq = [dict(enumerate(g)) for g in grads]
    tx = fo.radam(lr=0.1, weight_decay=0.1)
    (comp_p, comp_s), (eager_p, eager_s) = compiled_and_eager_steps(tx, params, grads_seq)
    assert_same(comp_p, eager_p, rtol=1e-5, atol=1e-6)
    assert_same(list(comp_s), list(eager_s), rtol=1e-5, atol=1e-6)


def test_vmap_over_beta2_equals_torch():
    """A batch of beta2s whose rectification starts at different steps (0.6: never, as
    rho_inf = 4), in one vmap: each member is torch's run."""
    base_, grads = params_and_grads(F64)
    beta2s = torch.tensor([0.6, 0.9, 0.999], dtype=F64)

    def run(beta2):
        return functional_run({"lr": 0.1, "betas": (0.8, beta2), "weight_decay": 0.1}, base_, grads)[0]

    batched = vmap(run)(beta2s)
    for i, beta2 in enumerate(beta2s.tolist()):
        expected, _ = torch_run({"lr": 0.1, "betas": (0.8, beta2), "weight_decay": 0.1}, base_, grads)
        assert_same([b[i] for b in batched], expected, rtol=1e-12, atol=1e-14)


def problem(seed=0):
    g = torch.Generator().manual_seed(seed)
    params = {"w": torch.randn(4, 3, generator=g, dtype=F64), "b": torch.randn(3, generator=g, dtype=F64)}
    x, y = torch.randn(16, 4, generator=g, dtype=F64), torch.randn(16, 3, generator=g, dtype=F64)
    return params, x, y


def loss_fn(params, x, y):
    return (torch.tanh(x @ params["w"] + params["b"]) - y).pow(2).mean()


HP = {"lr": 0.05, "beta1": 0.8, "beta2": 0.9, "eps": 1e-3, "weight_decay": 0.05}


def train(hp, params, x, y, steps=8):
    hp = dict(hp)
    betas = (hp.pop("beta1"), hp.pop("beta2"))
    tx = fo.radam(**hp, betas=betas)
    adapted, _, _ = fo.inner_loop(loss_fn, params, tx, [(x, y)] * steps)
    return loss_fn(adapted, x, y)


@pytest.mark.parametrize("key", list(HP))
def test_hypergradients_through_the_rectified_steps_match_finite_differences(key):
    """Eight steps, three of them rectified: every hyperparameter (beta2 and eps enter the
    step only there) has a gradient, which matches central differences, and jvp."""
    params, x, y = problem()

    def f(value):
        return train({**HP, key: value}, params, x, y)

    value = torch.tensor(HP[key], dtype=F64)
    g = grad(f)(value)
    fd = (f(value + 1e-6) - f(value - 1e-6)) / 2e-6
    torch.testing.assert_close(g, fd, rtol=1e-5, atol=1e-8)
    assert g.abs() > 0
    _, tangent = jvp(f, (value,), (torch.ones((), dtype=F64),))
    torch.testing.assert_close(tangent, g, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("beta2", [0.5, 0.6, 0.9])
def test_hypergradients_are_finite_where_the_rectification_is_undefined(beta2):
    """Before rectification (and for a beta2 whose rho_inf is at most 5, never), torch's
    rectification term is the root of a negative number, or divides by zero (rho_inf =
    2 or 4): it is unused, and must not make the gradient NaN through torch.where."""
    params, x, y = problem()
    hp = {k: torch.tensor(v, dtype=F64) for k, v in {**HP, "beta2": beta2}.items()}
    grads = grad(lambda hp: train(hp, params, x, y), argnums=0)(hp)
    assert all(torch.isfinite(g) for g in grads.values()), grads


def test_eps_root_keeps_meta_gradients_finite():
    w0 = torch.tensor([[1.0, 0.0], [2.0, -1.0]], dtype=F64)
    x = torch.tensor([[1.0, 0.0]], dtype=F64)  # no gradient for w's second row

    def loss(params):
        return (x @ params["w"]).square().sum()

    def meta(lr, eps_root):
        tx = fo.radam(lr=lr, eps=0.0, eps_root=eps_root)
        adapted, _, _ = fo.inner_loop(loss, {"w": w0}, tx, [()] * 7)
        return loss(adapted) + adapted["w"].sum()

    lr = torch.tensor(0.1, dtype=F64)
    assert not torch.isfinite(grad(meta)(lr, 0.0))
    assert torch.isfinite(grad(meta)(lr, 1e-16))
    with pytest.raises(ValueError, match="Invalid eps_root value"):
        fo.radam(eps_root=-1.0)


def test_differentiable_class_matches_torch():
    """torch's differentiable RAdam reads its step as a float, as the default step."""
    base_, grads = params_and_grads(F64)
    results = []
    for cls in (torch.optim.RAdam, fo.RAdam):
        params = [p.clone().requires_grad_().clone() for p in base_]
        lr = torch.tensor(0.01, dtype=F64, requires_grad=True)
        opt = cls(params, lr=lr, weight_decay=0.1, differentiable=True)
        for step in grads:
            for p, g in zip(params, step):
                p.grad = g.clone()
            opt.step()
        loss = sum(p.square().sum() for p in params)
        results.append((params, torch.autograd.grad(loss, lr)))
    assert_same(results[1], results[0], rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("kwargs", [{}, {"lr": torch.tensor(0.01, dtype=F64), "weight_decay": 0.1}])
def test_capturable_step_computes_its_schedule_as_torch(kwargs, monkeypatch):
    """torch's capturable step (a GPU's; here on the CPU, with both sides' device checks
    lifted) computes rho_t and the rectification from the float32 step tensor, branch-free:
    so does fo's, and float64 params agree with torch's bit for bit."""
    import sys

    from funcopt._src.torch import adapter

    monkeypatch.setattr(
        sys.modules["torch.optim.radam"],
        "_get_capturable_supported_devices",
        lambda supports_xla=True: ["cpu"],
    )
    monkeypatch.setattr(adapter, "_check_capturable", lambda params, name="": None)
    base_, grads = params_and_grads(F64)
    kwargs = {**kwargs, "capturable": True}
    assert_same(
        torch_run(kwargs, base_, grads, fo.RAdam)[0], torch_run(kwargs, base_, grads)[0], rtol=0, atol=0
    )
