"""What is particular to Adam and AdamW: max_exp_avg_sq only with amsgrad, AdamW as Adam
with decoupled weight decay, torch's checks of tensor lr and betas, fused=True, the
differentiable step's bias corrections, and eps_root. Compared with torch.optim."""

from __future__ import annotations

import copy
import re

import pytest
import torch
from helpers import assert_same, compiled_and_eager_steps, set_default_dtype
from torch.func import grad, vmap

import funcopt as fo


def params_and_grads(dtype=torch.float32, steps=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    base = [
        torch.randn(10, 5, generator=g, dtype=dtype),
        torch.randn(6, 4, 2, generator=g, dtype=dtype)[..., 0],
        torch.randn(7, generator=g, dtype=dtype),
        torch.randn((), generator=g, dtype=dtype),
    ]
    grads = [[torch.randn(p.shape, generator=g, dtype=dtype) for p in base] for _ in range(steps)]
    return base, grads


def twin_steps(name, kwargs, base, grads, ours_kwargs=None, ref_kwargs=None):
    """Params and state_dict after steps of torch.optim.<name> and fo.<name>."""
    results = []
    for cls, extra in ((getattr(torch.optim, name), ref_kwargs), (getattr(fo, name), ours_kwargs)):
        params = [p.clone().requires_grad_() for p in base]
        opt = cls(params, **kwargs, **(extra or {}))
        for step in grads:
            for p, g in zip(params, step):
                p.grad = g.clone()
            opt.step()
        results.append(([p.detach() for p in params], opt.state_dict()))
    return results


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.complex64], ids=str)
@pytest.mark.parametrize(
    "kwargs",
    [
        {"amsgrad": True},
        {"amsgrad": True, "weight_decay": 0.1, "maximize": True},
        {"amsgrad": True, "weight_decay": 0.1, "decoupled_weight_decay": True},
        {"amsgrad": False, "lr": 0.1, "betas": (0.5, 0.6), "eps": 1e-3},
    ],
)
def test_steps_equal_torchs_default_step_bit_for_bit(kwargs, dtype):
    base, grads = params_and_grads(dtype)
    (ref, ref_sd), (ours, ours_sd) = twin_steps("Adam", kwargs, base, grads)
    # torch adds complex weight decay with complex arithmetic (an ulp off its real view's)
    exact = {} if dtype.is_complex and kwargs.get("weight_decay") else {"rtol": 0, "atol": 0}
    assert_same(ours, ref, **exact)
    assert_same(ours_sd, ref_sd, **exact)


@pytest.mark.parametrize("amsgrad", [False, True])
def test_max_exp_avg_sq_exists_only_with_amsgrad(amsgrad):
    base, grads = params_and_grads(steps=2)
    (_, ref_sd), (_, ours_sd) = twin_steps("Adam", {"amsgrad": amsgrad}, base, grads)
    keys = ["step", "exp_avg", "exp_avg_sq"] + (["max_exp_avg_sq"] if amsgrad else [])
    assert list(ours_sd["state"][0]) == list(ref_sd["state"][0]) == keys
    # the functional state: an empty node without amsgrad (no None leaf), a tensor with it
    tx = fo.adam(amsgrad=amsgrad)
    params = {"w": base[0]}
    state = tx.init(params)
    if amsgrad:
        assert torch.equal(state.max_exp_avg_sq["w"], torch.zeros_like(base[0]))
    else:
        assert state.max_exp_avg_sq == {"w": fo.MaskedNode()}
    _, state = tx.update({"w": grads[0][0]}, state, params)
    assert isinstance(state.max_exp_avg_sq["w"], torch.Tensor) == amsgrad


def test_amsgrad_state_survives_a_reload_into_torch():
    """A state_dict with max_exp_avg_sq saved by fo.Adam steps on in torch.optim.Adam."""
    base, grads = params_and_grads()
    ours = [p.clone().requires_grad_() for p in base]
    theirs = [p.clone().requires_grad_() for p in base]
    opt = fo.Adam(ours, lr=0.1, amsgrad=True)
    for p, g in zip(ours, grads[0]):
        p.grad = g
    opt.step()
    ref = torch.optim.Adam(theirs, lr=0.1, amsgrad=True)
    with torch.no_grad():
        for p, q in zip(theirs, ours):
            p.copy_(q)
    ref.load_state_dict(copy.deepcopy(opt.state_dict()))  # else both step the same tensors
    for step in grads[1:]:
        for p, q, g in zip(ours, theirs, step):
            p.grad, q.grad = g.clone(), g.clone()
        opt.step()
        ref.step()
    assert_same(ours, theirs, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.complex64], ids=str)
@pytest.mark.parametrize("amsgrad", [False, True])
def test_adamw_is_adam_with_decoupled_weight_decay(amsgrad, dtype):
    base, grads = params_and_grads(dtype)
    (ref, ref_sd), (ours, ours_sd) = twin_steps("AdamW", {"amsgrad": amsgrad, "lr": 0.05}, base, grads)
    assert_same((ours, ours_sd), (ref, ref_sd), rtol=0, atol=0)
    assert ours_sd["param_groups"][0]["weight_decay"] == 1e-2
    assert ours_sd["param_groups"][0]["decoupled_weight_decay"] is True
    # the functional factories: adamw is adam(decoupled_weight_decay=True), defaults included
    params = dict(enumerate(base))
    adamw, adam = (
        fo.adamw(amsgrad=amsgrad, lr=0.05),
        fo.adam(amsgrad=amsgrad, lr=0.05, weight_decay=1e-2, decoupled_weight_decay=True),
    )
    for tx in (adamw, adam):
        p, state = params, tx.init(params)
        for step in grads:
            updates, state = tx.update(dict(enumerate(step)), state, p)
            p = fo.apply_updates(p, updates)
        assert_same(list(p.values()), ref)
    assert isinstance(adamw.init(params), fo.AdamWState)
    assert isinstance(fo.AdamW([torch.nn.Parameter(base[0])]), fo.Adam)


def test_adamw_loads_an_adam_state_dict_as_adamw():
    """torch's AdamW sets decoupled_weight_decay on load, whatever the saved groups say."""
    for cls in (torch.optim.AdamW, fo.AdamW):
        p = torch.nn.Parameter(torch.randn(3))
        saved = torch.optim.Adam([p], weight_decay=0.1).state_dict()
        opt = cls([p])
        opt.load_state_dict(saved)
        assert opt.param_groups[0]["decoupled_weight_decay"] is True


TORCH_CHECKS = [
    # torch's errors, in its order: a tensor lr with foreach before any range check
    (
        {"lr": torch.tensor(-1.0), "foreach": True},
        "lr as a Tensor is not supported for capturable=False and foreach=True",
    ),
    ({"lr": torch.tensor([0.1, 0.2])}, "Tensor lr must be 1-element"),
    ({"betas": (0.9, 1)}, "Invalid beta parameter at index 1: 1"),
    ({"betas": (0.9, torch.tensor(0.99))}, "betas must be either both floats or both Tensors"),
    ({"betas": (0, 0.99)}, "betas must be either both floats or both Tensors"),
    (
        {"betas": (torch.tensor(0.9), torch.tensor(0.99)), "foreach": True},
        re.escape("betas[0] as a Tensor is not supported"),
    ),
    ({"betas": (torch.tensor(1.5), torch.tensor(0.99))}, "Invalid beta parameter at index 0"),
]


@pytest.mark.parametrize("name", ["Adam", "AdamW"])
@pytest.mark.parametrize("kwargs,message", TORCH_CHECKS, ids=[m[:30] for _, m in TORCH_CHECKS])
def test_constructor_checks_as_torch(name, kwargs, message):
    for cls in (getattr(torch.optim, name), getattr(fo, name)):
        with pytest.raises(ValueError, match=message):
            cls([torch.nn.Parameter(torch.randn(2))], **kwargs)


def test_functional_factory_takes_one_tensor_beta():
    """The functional API takes a tensor for either beta alone (to differentiate or batch
    over it), which torch's class refuses; the result is the float one."""
    base, grads = params_and_grads(steps=3)
    params = dict(enumerate(base))
    results = []
    for betas in ((0.8, 0.9), (torch.tensor(0.8), 0.9), (0.8, torch.tensor(0.9))):
        tx = fo.adam(lr=0.1, betas=betas)
        p, state = params, tx.init(params)
        for step in grads:
            updates, state = tx.update(dict(enumerate(step)), state, p)
            p = fo.apply_updates(p, updates)
        results.append(p)
    assert_same(results[1], results[0])
    assert_same(results[2], results[0])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_tensor_betas_are_kept_0d_as_torch(dtype):
    """torch squeezes 1-element tensor betas in its defaults; a tensor lr and tensor betas
    then step as torch's default step does, bit for bit (float64 ones for float32 params
    too: torch rounds beta1 to the param's dtype before its 1 - beta1)."""
    betas = (torch.tensor([[[0.8]]], dtype=dtype), torch.tensor([0.9], dtype=dtype))
    kwargs = {"lr": torch.tensor(0.05, dtype=dtype), "betas": betas}
    p = torch.nn.Parameter(torch.randn(3))
    assert_same(fo.Adam([p], **kwargs).defaults, torch.optim.Adam([p], **kwargs).defaults)
    # no 0-d param: torch computes its ops with 0-d float64 tensors in float64 there
    base, grads = params_and_grads()
    base, grads = base[:3], [g[:3] for g in grads]
    (ref, ref_sd), (ours, ours_sd) = twin_steps("Adam", {**kwargs, "weight_decay": 0.1}, base, grads)
    assert_same((ours, ours_sd), (ref, ref_sd), rtol=0, atol=0)


@pytest.mark.parametrize("name", ["Adam", "AdamW"])
def test_tensor_lr_with_foreach_set_later_fails_at_step_as_torch(name):
    outcomes = []
    for cls in (getattr(torch.optim, name), getattr(fo, name)):
        p = torch.nn.Parameter(torch.randn(3))
        p.grad = torch.randn(3)
        opt = cls([p], foreach=True)
        opt.param_groups[0]["lr"] = torch.tensor(0.1)
        with pytest.raises(RuntimeError) as error:
            opt.step()
        outcomes.append(str(error.value))
    assert outcomes[0] == outcomes[1]


@pytest.mark.parametrize("name", ["Adam", "AdamW"])
def test_sparse_gradient_error_as_torch(name):
    outcomes = []
    for cls in (getattr(torch.optim, name), getattr(fo, name)):
        p = torch.nn.Parameter(torch.randn(4))
        p.grad = torch.randn(4).to_sparse()
        with pytest.raises(RuntimeError) as error:
            cls([p]).step()
        outcomes.append(str(error.value))
    assert (
        outcomes[0]
        == outcomes[1]
        == "Adam does not support sparse gradients, please consider SparseAdam instead"
    )


@pytest.mark.parametrize("name", ["Adam", "AdamW"])
@pytest.mark.parametrize("amsgrad", [False, True])
def test_fused_steps_as_torch(name, amsgrad):
    """fused=True on the CPU: torch's state layout (a float32 step on the param's device);
    torch's default step and its fused kernel within round-off (funcopt's fused step is a
    kernel that inductor generates, see fused.py)."""
    base, grads = params_and_grads(torch.float64)
    kwargs = {"lr": 0.1, "weight_decay": 0.1, "amsgrad": amsgrad}
    (ref, ref_sd), (ours, ours_sd) = twin_steps(name, kwargs, base, grads, ours_kwargs={"fused": True})
    assert ours_sd["state"][0]["step"].dtype == torch.float32
    assert_same(ours, ref)
    (fused, fused_sd), (ours, ours_sd) = twin_steps(name, {**kwargs, "fused": True}, base, grads)
    assert_same((ours, ours_sd), (fused, fused_sd))
    assert ours_sd["param_groups"][0]["fused"] is True


@pytest.mark.parametrize("name", ["Adam", "AdamW"])
def test_fused_with_grad_scaler_as_torchs_fused(name):
    """A GradScaler hands the fused step its scale and inf flag, as torch's fused class
    (``_step_supports_amp_scaling``): the overflowing step changes nothing, the others
    step on unscaled gradients."""

    def scenario(cls):
        torch.manual_seed(0)
        m = torch.nn.Linear(4, 3)
        opt = cls(m.parameters(), lr=0.1, fused=True)
        assert opt._step_supports_amp_scaling
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
        calls = []
        opt.register_step_post_hook(lambda *_: calls.append(1))
        for i in range(4):
            opt.zero_grad()
            loss = m(torch.randn(2, 4)).square().sum()
            scaler.scale(loss * (float("inf") if i == 1 else 1.0)).backward()
            scaler.step(opt)
            scaler.update()
        return [p.detach() for p in m.parameters()], opt.state_dict()["state"], len(calls), scaler.get_scale()

    assert_same(scenario(getattr(fo, name)), scenario(getattr(torch.optim, name)))


def test_fused_does_not_step_if_found_inf():
    for cls in (torch.optim.Adam, fo.Adam):
        p = torch.nn.Parameter(torch.ones(3))
        p.grad = torch.ones(3)
        opt = cls([p], fused=True)
        opt.grad_scale, opt.found_inf = torch.ones(()), torch.ones(())
        opt.step()
        assert_same((p.detach(), opt.state[p]["step"]), (torch.ones(3), torch.zeros(())))


@pytest.mark.parametrize(
    "kwargs", [{"fused": True, "differentiable": True}, {"fused": True, "foreach": True}]
)
def test_fused_conflicts_as_torch(kwargs):
    outcomes = []
    for cls in (torch.optim.Adam, fo.Adam):
        with pytest.raises(RuntimeError) as error:
            cls([torch.nn.Parameter(torch.randn(2))], **kwargs)
        outcomes.append(str(error.value))
    assert outcomes[0] == outcomes[1]


def test_fused_rejects_complex_params_as_torch():
    outcomes = []
    for cls in (torch.optim.Adam, fo.Adam):
        p = torch.nn.Parameter(torch.randn(2, dtype=torch.complex64))
        p.grad = torch.randn_like(p)
        with pytest.raises(RuntimeError) as error:
            cls([p], fused=True).step()
        outcomes.append(str(error.value))
    assert outcomes[0] == outcomes[1]


@pytest.mark.parametrize("name", ["Adam", "AdamW"])
def test_differentiable_step_rounds_its_bias_corrections_as_torch(name):
    """torch's differentiable step computes its bias corrections from the float32 step
    tensor (the default step: in Python doubles); fo's differentiable step does too, so
    float64 params agree to float64 round-off, and hypergradients with them. (Without
    amsgrad: torch 2.13's differentiable amsgrad step fails in the backward pass after a
    few steps, having written max_exp_avg_sq in place.)"""
    base, grads = params_and_grads(torch.float64)
    results = []
    for cls in (getattr(torch.optim, name), getattr(fo, name)):
        params = [p.clone().requires_grad_().clone() for p in base]
        lr = torch.tensor(0.01, dtype=torch.float64, requires_grad=True)
        opt = cls(params, lr=lr, weight_decay=0.1, differentiable=True)
        for step in grads:
            for p, g in zip(params, step):
                p.grad = g.clone()
            opt.step()
        loss = sum(p.square().sum() for p in params)
        results.append((params, torch.autograd.grad(loss, lr)))
    assert_same(results[1], results[0], rtol=1e-12, atol=1e-14)


def test_meta_gradients_are_finite_where_a_gradient_entry_is_zero():
    """A gradient entry that is exactly zero made the meta-gradient through sqrt NaN (it
    does in torch, whose derivative of sqrt at 0 is infinite); funcopt's functional sqrt
    has derivative 0 there. The zero row's update is 0 whatever the lr, so the
    meta-gradient is that of a smooth function: finite differences agree, with or
    without eps_root."""
    w0 = torch.tensor([[1.0, 0.0], [2.0, -1.0]], dtype=torch.float64)
    x = torch.tensor([[1.0, 0.0]], dtype=torch.float64)  # no gradient for w's second row

    def loss(params):
        return (x @ params["w"]).square().sum()

    def meta(lr, eps_root):
        adapted, _, _ = fo.inner_loop(loss, {"w": w0}, fo.adam(lr=lr, eps_root=eps_root), [()] * 3)
        return loss(adapted) + adapted["w"].sum()

    lr = torch.tensor(0.1, dtype=torch.float64)
    for eps_root in (0.0, 1e-16):
        g = grad(meta)(lr, eps_root)
        fd = (meta(lr + 1e-6, eps_root) - meta(lr - 1e-6, eps_root)) / 2e-6
        torch.testing.assert_close(g, fd, rtol=1e-6, atol=1e-9)
    with pytest.raises(ValueError, match="Invalid eps_root value"):
        fo.adam(eps_root=-1.0)


@pytest.mark.parametrize("amsgrad", [False, True])
def test_compiled_update_equals_eager_without_recompiles(amsgrad):
    """One graph for every step, also with max_exp_avg_sq absent (an empty node)."""
    base, grads = params_and_grads(torch.float32, steps=3)
    params = {i: p.contiguous() for i, p in enumerate(base)}  # as the updated params will be
    grads_seq = [dict(enumerate(g)) for g in grads]
    tx = fo.adamw(lr=0.1, amsgrad=amsgrad)
    (comp_p, comp_s), (eager_p, eager_s) = compiled_and_eager_steps(tx, params, grads_seq)
    assert_same(comp_p, eager_p, rtol=1e-5, atol=1e-6)
    assert_same(list(comp_s), list(eager_s), rtol=1e-5, atol=1e-6)


def test_vmap_over_beta2_with_amsgrad_equals_loop():
    with set_default_dtype(torch.float64):
        base, grads = params_and_grads(torch.float64, steps=4)
    params = dict(enumerate(base))
    beta2s = torch.tensor([0.5, 0.9, 0.999], dtype=torch.float64)

    def run(beta2):
        tx = fo.adam(lr=0.1, betas=(0.8, beta2), amsgrad=True, weight_decay=0.1)
        p, state = params, tx.init(params)
        for step in grads:
            updates, state = tx.update(dict(enumerate(step)), state, p)
            p = fo.apply_updates(p, updates)
        return p, state.max_exp_avg_sq

    batched = vmap(run)(beta2s)
    for i, beta2 in enumerate(beta2s):
        assert_same(
            [{k: v[i] for k, v in tree.items()} for tree in batched],
            list(run(float(beta2))),
            rtol=1e-12,
            atol=1e-14,
        )


@pytest.mark.parametrize("name", ["Adam", "AdamW"])
def test_group_amsgrad_makes_its_params_state(name):
    """torch makes a param's state from its group's amsgrad, not the constructor's."""

    def scenario(cls):
        torch.manual_seed(0)
        m = torch.nn.Linear(3, 2)
        opt = cls([{"params": [m.weight], "amsgrad": True}, {"params": [m.bias]}], lr=0.1)
        for _ in range(3):
            opt.zero_grad()
            m(torch.randn(4, 3)).square().sum().backward()
            opt.step()
        return [p.detach() for p in m.parameters()], opt.state_dict()

    ours, expected = scenario(getattr(fo, name)), scenario(getattr(torch.optim, name))
    assert "max_exp_avg_sq" in ours[1]["state"][0] and "max_exp_avg_sq" not in ours[1]["state"][1]
    assert_same(ours, expected, rtol=0, atol=0)


@pytest.mark.parametrize("name", ["Adam", "AdamW"])
@pytest.mark.parametrize(
    "kwargs", [{"weight_decay": 0.1, "amsgrad": True}, {"lr": torch.tensor(0.01, dtype=torch.float64)}]
)
def test_capturable_step_rounds_its_bias_corrections_as_torch(name, kwargs, monkeypatch):
    """torch's capturable step (a GPU's; here on the CPU, with both sides' device checks
    lifted) computes its bias corrections from the float32 step tensor: fo's rounds them
    so too, and float64 params agree to far below float32 round-off."""
    import sys

    from funcopt._src.torch import adapter

    monkeypatch.setattr(
        sys.modules["torch.optim.adam"],
        "_get_capturable_supported_devices",
        lambda supports_xla=True: ["cpu"],
    )
    monkeypatch.setattr(adapter, "_check_capturable", lambda params, name="": None)
    base, grads = params_and_grads(torch.float64)
    (ref, _), (ours, _) = twin_steps(name, {**kwargs, "capturable": True}, base, grads)
    assert_same(ours, ref, rtol=1e-8, atol=1e-10)
