"""Schedule-free as its authors' package, ``schedulefree``, computes it: the drop-in classes
(fo.SGDScheduleFree, fo.AdamWScheduleFree, fo.RAdamScheduleFree) and the functional form
(fo.schedule_free_sgd, fo.schedule_free_adamw) against the package's classes in float64,
over 20 steps with train/eval switches: the params in train mode (y) and in eval mode (x),
and each state_dict loaded into the other class."""

from __future__ import annotations

import copy

import pytest
import torch
from helpers import set_default_dtype

import funcopt as fo

schedulefree = pytest.importorskip("schedulefree")

F64 = torch.float64
STEPS = 20
EVAL_AT = {4, 5, 11, 19}  # after these steps: eval(), compare x, train() again
CASES = {
    "SGD": ("SGDScheduleFree", dict(lr=0.5, momentum=0.8, warmup_steps=3, weight_decay=0.1, r=0.5)),
    "SGD-defaults": ("SGDScheduleFree", dict(lr=0.2)),
    "AdamW": (
        "AdamWScheduleFree",
        dict(lr=0.05, betas=(0.8, 0.99), warmup_steps=4, weight_decay=0.1, r=1.0, weight_lr_power=1.5),
    ),
    "AdamW-defaults": ("AdamWScheduleFree", dict(lr=0.05)),
    "RAdam": ("RAdamScheduleFree", dict(lr=0.05, betas=(0.8, 0.9), weight_decay=0.1, r=0.5)),
    "RAdam-sgd-phase": ("RAdamScheduleFree", dict(lr=0.05, betas=(0.8, 0.9), silent_sgd_phase=False)),
}


def tensors(seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(3, 2, generator=g, dtype=F64), torch.randn(4, generator=g, dtype=F64)]


def grads_seq(seed: int = 1) -> list[list[torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [[torch.randn(t.shape, generator=g, dtype=F64) for t in tensors()] for _ in range(STEPS)]


def assert_params(actual: list[torch.Tensor], expected: list[torch.Tensor], what: str) -> None:
    for i, (a, e) in enumerate(zip(actual, expected)):
        torch.testing.assert_close(a.detach(), e.detach(), rtol=1e-13, atol=1e-14, msg=f"{what}, param {i}")


def step(opt: torch.optim.Optimizer, params: list[torch.Tensor], grads: list[torch.Tensor]) -> None:
    for p, g in zip(params, grads):
        p.grad = g.clone()  # a copy: the package's step overwrites p.grad
    opt.step()


def run_pair(ours, theirs, ours_params, their_params, grads, start: int = 0) -> None:
    """Step both on the same gradients; compare y after each step and x at EVAL_AT."""
    for i, g in enumerate(grads, start=start):
        step(ours, ours_params, g)
        step(theirs, their_params, g)
        assert_params(ours_params, their_params, f"y after step {i + 1}")
        if i in EVAL_AT:
            ours.eval()
            theirs.eval()
            assert_params(ours_params, their_params, f"x after step {i + 1}")
            ours.train()
            theirs.train()
            assert_params(ours_params, their_params, f"y back after step {i + 1}")


def make(cls_name: str, kwargs: dict, module) -> tuple[torch.optim.Optimizer, list[torch.nn.Parameter]]:
    params = [torch.nn.Parameter(t) for t in tensors()]
    return getattr(module, cls_name)(params, **kwargs), params


@pytest.mark.parametrize("foreach", [True, False])
@pytest.mark.parametrize("case", list(CASES))
def test_class_matches_the_authors(case, foreach):
    cls_name, kwargs = CASES[case]
    ours, ours_params = make(cls_name, {**kwargs, "foreach": foreach}, fo)
    theirs, their_params = make(cls_name, {**kwargs, "foreach": foreach}, schedulefree)
    assert isinstance(ours, torch.optim.Optimizer)
    ours.train()
    theirs.train()
    run_pair(ours, theirs, ours_params, their_params, grads_seq())
    for group, their_group in zip(ours.param_groups, theirs.param_groups):
        assert {k: v for k, v in group.items() if k != "params"} == {
            k: v for k, v in their_group.items() if k != "params"
        }
    for p, q in zip(ours_params, their_params):
        assert ours.state[p].keys() == theirs.state[q].keys()
        for key in ours.state[p]:
            torch.testing.assert_close(ours.state[p][key], theirs.state[q][key], rtol=1e-13, atol=1e-14)


@pytest.mark.parametrize("direction", ["theirs into ours", "ours into theirs"])
@pytest.mark.parametrize("case", ["SGD", "AdamW", "RAdam"])
def test_state_dicts_load_both_ways(case, direction):
    """A checkpoint (saved in eval mode, as the package asks) made by one class resumes in
    the other, and the two runs go on alike."""
    cls_name, kwargs = CASES[case]
    first, second = (schedulefree, fo) if direction == "theirs into ours" else (fo, schedulefree)
    saver, saver_params = make(cls_name, kwargs, first)
    saver.train()
    grads = grads_seq()
    for g in grads[:8]:
        step(saver, saver_params, g)
    saver.eval()
    checkpoint = copy.deepcopy(saver.state_dict())
    loader, loader_params = make(cls_name, kwargs, second)
    with torch.no_grad():
        for p, q in zip(loader_params, saver_params):
            p.copy_(q)  # the model's weights (x, in eval mode) come from the checkpoint too
    loader.load_state_dict(checkpoint)
    assert loader.state_dict()["param_groups"] == checkpoint["param_groups"]
    saver.train()
    loader.train()
    assert_params(loader_params, saver_params, "y after loading")
    run_pair(loader, saver, loader_params, saver_params, grads[8:], start=8)


FUNCTIONAL = {
    "SGD": ("schedule_free_sgd", "SGDScheduleFree"),
    "AdamW": ("schedule_free_adamw", "AdamWScheduleFree"),
}


def functional_kwargs(case: str) -> dict:
    """The class's arguments in the functional form's (optax's) names."""
    _, kwargs = CASES[case]
    out = {"learning_rate": kwargs["lr"]}
    for key in ("warmup_steps", "weight_decay", "r", "weight_lr_power", "eps"):
        if key in kwargs:
            out[key] = kwargs[key]
    if "momentum" in kwargs:
        out["b1"] = kwargs["momentum"]
    if "betas" in kwargs:
        out["b1"], out["b2"] = kwargs["betas"]
    return out


@pytest.mark.parametrize("case", ["SGD", "SGD-defaults", "AdamW", "AdamW-defaults"])
def test_functional_form_matches_the_authors(case):
    """The pure form's params (y) and eval params (x) after every step, float64 round-off.
    (A schedule of a tensor count, the warmup here, computes in the default dtype.)"""
    factory, cls_name = FUNCTIONAL[case.split("-")[0]]
    tx = getattr(fo, factory)(**functional_kwargs(case))
    theirs, their_params = make(cls_name, CASES[case][1], schedulefree)
    theirs.train()
    params = tensors()
    state = tx.init(params)
    for i, g in enumerate(grads_seq()):
        with set_default_dtype(F64):
            updates, state = tx.update(g, state, params)
        params = fo.apply_updates(params, updates)
        step(theirs, their_params, g)
        assert_params(params, their_params, f"y after step {i + 1}")
        theirs.eval()
        assert_params(fo.schedule_free_eval_params(state, params), their_params, f"x after step {i + 1}")
        theirs.train()


def test_no_warmup_means_no_warmup():
    """warmup_steps=0 (the authors' default) takes full steps from the first; optax's
    warmup of 0 steps would hold the learning rate at 0."""
    params = [torch.ones(2, dtype=F64)]
    for factory in (fo.schedule_free_sgd, fo.schedule_free_adamw):
        tx = factory(learning_rate=0.1, warmup_steps=0)
        updates, _ = tx.update([torch.ones(2, dtype=F64)], tx.init(params), params)
        assert (updates[0] < 0).all(), factory.__name__


def test_the_gradients_are_left_as_they_are():
    """The package's step overwrites p.grad with its direction; funcopt's does not."""
    p = torch.nn.Parameter(torch.ones(3, dtype=F64))
    opt = fo.AdamWScheduleFree([p], lr=0.1, weight_decay=0.1)
    opt.train()
    p.grad = torch.full((3,), 2.0, dtype=F64)
    opt.step()
    assert torch.equal(p.grad, torch.full((3,), 2.0, dtype=F64))


def test_errors():
    p = [torch.nn.Parameter(torch.ones(2))]
    opt = fo.SGDScheduleFree(p)
    p[0].grad = torch.ones(2)
    with pytest.raises(RuntimeError, match=r"eval mode; call optimizer.train\(\)"):
        opt.step()  # a new optimizer is in eval mode, as the package's
    bad = [
        (fo.SGDScheduleFree, {"momentum": 0.0}, "momentum must be in"),
        (fo.SGDScheduleFree, {"lr": -1.0}, "lr must be >= 0"),
        (fo.SGDScheduleFree, {"lr": float("nan")}, "lr must be >= 0"),
        (fo.SGDScheduleFree, {"weight_decay": -0.1}, "weight_decay must be >= 0"),
        (fo.AdamWScheduleFree, {"warmup_steps": -1}, "warmup_steps must be an int >= 0"),
        (fo.AdamWScheduleFree, {"warmup_steps": 2.5}, "warmup_steps must be an int >= 0"),
        (fo.AdamWScheduleFree, {"betas": (0.0, 0.999)}, r"betas\[0\] must be in \(0, 1\)"),
        (fo.RAdamScheduleFree, {"betas": (0.9, 1.0)}, r"betas\[1\] must be in \[0, 1\)"),
        (fo.RAdamScheduleFree, {"eps": -1e-8}, "eps must be >= 0"),
    ]
    for cls, kwargs, message in bad:
        with pytest.raises(ValueError, match=f"{cls.__name__}: {message}"):
            cls(p, **kwargs)
    sparse = torch.nn.Parameter(torch.ones(2))
    opt = fo.SGDScheduleFree([sparse])
    opt.train()
    sparse.grad = torch.ones(2).to_sparse()
    with pytest.raises(RuntimeError, match="does not support sparse gradients"):
        opt.step()


def test_a_param_group_added_later_counts_its_own_steps():
    """As the package's: each group has its own step count, weights and warmup."""
    ours_a, ours_b = (torch.nn.Parameter(t) for t in tensors())
    theirs_a, theirs_b = (torch.nn.Parameter(t) for t in tensors())
    ours = fo.AdamWScheduleFree([ours_a], lr=0.05, warmup_steps=3)
    theirs = schedulefree.AdamWScheduleFree([theirs_a], lr=0.05, warmup_steps=3)
    ours.train()
    theirs.train()
    grads = grads_seq()
    for g in grads[:4]:
        step(ours, [ours_a], g[:1])
        step(theirs, [theirs_a], g[:1])
    ours.add_param_group({"params": [ours_b], "lr": 0.1})
    theirs.add_param_group({"params": [theirs_b], "lr": 0.1})
    ours.train()
    theirs.train()
    run_pair(ours, theirs, [ours_a, ours_b], [theirs_a, theirs_b], grads[4:], start=4)
    assert [g["k"] for g in ours.param_groups] == [STEPS, STEPS - 4]
    assert [g["k"] for g in theirs.param_groups] == [STEPS, STEPS - 4]
