"""The drop-in classes that follow timm (fo.Lamb, fo.Lars, fo.Adan, fo.AdaBelief, fo.NovoGrad,
fo.MADGRAD) against timm's classes (Lamb, Lars, Adan, AdaBelief, NvNovoGrad, MADGRAD),
where timm is installed (CI installs it without its dependencies: only its optimizer
modules are loaded): 20 steps in float64, with timm's defaults and with each of its
options, two param groups, the params and every state entry the two share equal to
round-off. The functional forms (fo.lamb, ...) follow optax: tests/test_catalogue.py."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
from helpers import set_default_dtype
from timm_loader import timm_optimizers

import funcopt as fo

timm_optim = timm_optimizers()
if timm_optim is None:
    pytest.skip("timm is not installed (pip install --no-deps timm==1.0.31)", allow_module_level=True)

STEPS = 20
TOLERANCE = 1e-12  # of the largest distance a param moved
TIMM_NAMES = {"NovoGrad": "NvNovoGrad"}

# each class's option sets: timm's defaults (but lr), then each option away from its default
OPTIONS: dict[str, list[dict[str, Any]]] = {
    "Lamb": [
        {"lr": 0.01},
        {"lr": 0.01, "max_grad_norm": None},
        {"lr": 0.01, "max_grad_norm": 100.0},  # a norm the gradients stay under: no clip
        {"lr": 0.01, "bias_correction": False},
        {"lr": 0.01, "betas": (0.8, 0.99), "eps": 1e-3, "weight_decay": 0.1},
        {"lr": 0.01, "grad_averaging": False},
        {"lr": 0.01, "trust_clip": True},
        {"lr": 0.01, "weight_decay": 0.0},  # no trust ratio
        {"lr": 0.01, "weight_decay": 0.0, "always_adapt": True},
        {"lr": 0.01, "caution": True},
        {"lr": 0.01, "weight_decay": 0.1, "decoupled_decay": True},
        {"lr": 0.01, "weight_decay": 0.1, "decoupled_decay": True, "corrected_weight_decay": True},
    ],
    "Lars": [
        {"lr": 0.1},  # no momentum, no weight decay: SGD
        {"lr": 0.1, "momentum": 0.9},
        {"lr": 0.1, "momentum": 0.9, "weight_decay": 0.01},
        {"lr": 0.1, "momentum": 0.9, "weight_decay": 0.01, "dampening": 0.3},
        {"lr": 0.1, "momentum": 0.9, "weight_decay": 0.01, "nesterov": True},
        {"lr": 0.1, "momentum": 0.9, "weight_decay": 0.01, "trust_coeff": 0.02, "eps": 1e-3},
        {"lr": 0.1, "momentum": 0.9, "weight_decay": 0.01, "trust_clip": True},
        {"lr": 0.1, "momentum": 0.9, "always_adapt": True},
        {"lr": 0.1, "momentum": 0.9, "always_adapt": True, "eps": 0.0},
    ],
    "Adan": [
        {"lr": 0.01},
        {"lr": 0.01, "betas": (0.9, 0.8, 0.95), "eps": 1e-3},
        {"lr": 0.01, "weight_decay": 0.1},
        {"lr": 0.01, "weight_decay": 0.1, "no_prox": True},
        {"lr": 0.01, "caution": True},
        {"lr": 0.01, "weight_decay": 0.1, "caution": True},
        {"lr": 0.01, "weight_decay": 0.1, "no_prox": True, "caution": True},
    ],
    "AdaBelief": [
        {"lr": 0.01},
        {"lr": 0.01, "betas": (0.8, 0.9), "eps": 1e-8},  # rectified from the 6th step
        {"lr": 0.01, "weight_decay": 0.1},
        {"lr": 0.01, "weight_decay": 0.1, "fixed_decay": True},
        {"lr": 0.01, "weight_decay": 0.1, "decoupled_decay": False},
        {"lr": 0.01, "rectify": False},
        {"lr": 0.01, "betas": (0.8, 0.9), "degenerated_to_sgd": False},
        {"lr": 0.01, "amsgrad": True},
        {"lr": 0.01, "amsgrad": True, "rectify": False},
    ],
    "NovoGrad": [
        {"lr": 0.01},
        {"lr": 0.01, "betas": (0.8, 0.5), "eps": 1e-3},
        {"lr": 0.01, "weight_decay": 0.1},
        {"lr": 0.01, "weight_decay": 0.1, "decoupled_decay": True},
        {"lr": 0.01, "weight_decay": 0.1, "decoupled_decay": True, "corrected_weight_decay": True},
        {"lr": 0.01, "grad_averaging": True},
        {"lr": 0.01, "amsgrad": True},
    ],
    "MADGRAD": [
        {"lr": 0.01},
        {"lr": 0.01, "momentum": 0.5, "eps": 1e-3},
        {"lr": 0.01, "weight_decay": 0.1},
        {"lr": 0.01, "weight_decay": 0.1, "decoupled_decay": True},
        {"lr": 0.01, "momentum": 0.0},
        {"lr": 0.01, "momentum": 0.0, "weight_decay": 0.1, "decoupled_decay": True},
    ],
}
CASES = [(name, options) for name, sets in OPTIONS.items() for options in sets]


def make_params() -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(0)
    return [torch.nn.Parameter(torch.randn(s, generator=g)) for s in [(3, 4), (4,), (2, 3), (5,)]]


def run(make: Callable[[list[dict[str, Any]]], Any], steps: int = STEPS) -> tuple[list[torch.Tensor], Any]:
    """`steps` steps on two param groups (each group's lr halved after construction, which
    timm's corrected weight decay sees), of a loss whose gradients' norm is above 1."""
    params = make_params()
    opt = make([{"params": params[:2]}, {"params": params[2:]}])
    for group in opt.param_groups:
        group["lr"] /= 2
    for step in range(steps):
        g = torch.Generator().manual_seed(10 + step)
        targets = [torch.randn(p.shape, generator=g) for p in params]
        opt.zero_grad()
        (sum(((p - t) ** 2).sum() for p, t in zip(params, targets)) / 2).backward()
        opt.step()
    return params, opt


def compare(ours: Callable[..., Any], theirs: Callable[..., Any]) -> float:
    """The largest difference of the params and the state entries the two share, after
    STEPS, over the largest distance a param moved (all in float64, timm's 0-d state too)."""
    with set_default_dtype(torch.float64), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        (pa, ours_opt), (pb, theirs_opt) = run(ours), run(theirs)
    a, b = [p.detach() for p in pa], [p.detach() for p in pb]
    start = make_params_f64()
    moved = max(float((y - x).abs().max()) for y, x in zip(b, start))
    worst = max(float((x - y).abs().max()) for x, y in zip(a, b))
    for p, q in zip(pa, pb):
        mine, timms = ours_opt.state[p], theirs_opt.state[q]
        assert set(timms) - {"neg_pre_grad"} <= set(mine), (
            f"state keys {sorted(mine)} but timm's {sorted(timms)}"
        )
        for key, value in timms.items():
            if torch.is_tensor(value) and key in mine and key != "step":
                scale = max(float(value.abs().max()), 1e-30)
                worst = max(worst, float((mine[key] - value).abs().max()) / scale * moved)
    return worst / moved


def make_params_f64() -> list[torch.Tensor]:
    with set_default_dtype(torch.float64):
        return [p.detach() for p in make_params()]


def label(case: tuple[str, dict[str, Any]]) -> str:
    name, options = case
    return f"{name}-" + ",".join(f"{k}={v}" for k, v in options.items())


@pytest.mark.parametrize("foreach", [False, True])
@pytest.mark.parametrize("case", CASES, ids=[label(c) for c in CASES])
def test_class_equals_timm(case, foreach):
    name, options = case
    reference = getattr(timm_optim, TIMM_NAMES.get(name, name))
    ours = getattr(fo, name)
    assert (
        compare(lambda p: ours(p, **options, foreach=foreach), lambda p: reference(p, **options)) < TOLERANCE
    )


@pytest.mark.parametrize("name", ["Lamb", "Lars", "Adan", "AdaBelief"])
def test_class_equals_timms_foreach_step(name):
    """timm's multi-tensor step (its default on a GPU) folds its scalars otherwise."""
    ours, reference = getattr(fo, name), getattr(timm_optim, name)
    options = OPTIONS[name][2]
    assert compare(lambda p: ours(p, **options), lambda p: reference(p, **options, foreach=True)) < TOLERANCE


def test_constructor_defaults_are_timms():
    """Each class's arguments and defaults are timm's, in timm's order, less torch's
    switches."""
    import inspect

    switches = {"foreach", "capturable", "differentiable", "fused"}
    for name in OPTIONS:
        reference = getattr(timm_optim, TIMM_NAMES.get(name, name))
        left_out = switches
        theirs, ours = (
            [
                (p.name, p.default)
                for p in inspect.signature(cls).parameters.values()
                if p.name not in left_out
            ]
            for cls in (reference, getattr(fo, name))
        )
        assert ours == theirs, name


def test_lamb_clips_the_norm_of_all_groups():
    """timm's clip divides every gradient by the norm over all param groups: two groups
    stepping alone in two optimizers (each clipping by its own norm) differ (an eps as
    large as the gradients makes Adam's step see their scale)."""
    with set_default_dtype(torch.float64):
        params = make_params()
        together = fo.Lamb([{"params": params[:2]}, {"params": params[2:]}], lr=0.01, eps=1.0)
        apart_params = [torch.nn.Parameter(p.detach().clone()) for p in params]
        apart = [fo.Lamb(apart_params[:2], lr=0.01, eps=1.0), fo.Lamb(apart_params[2:], lr=0.01, eps=1.0)]
        for p, q in zip(params, apart_params):
            p.grad = torch.full_like(p, 3.0)
            q.grad = torch.full_like(q, 3.0)
        together.step()
        for opt in apart:
            opt.step()
        assert not torch.allclose(params[0], apart_params[0])
        grads_kept = all(torch.equal(p.grad, torch.full_like(p, 3.0)) for p in params)
        assert grads_kept  # the clip leaves .grad as it was (as timm)


def test_lamb_refuses_a_groups_own_max_grad_norm():
    params = make_params()
    with pytest.raises(ValueError, match="clips the gradients of all groups together"):
        fo.Lamb([{"params": params[:2], "max_grad_norm": 2.0}, {"params": params[2:]}])
    fo.Lamb([{"params": params[:2], "max_grad_norm": 2.0}], max_grad_norm=2.0)  # the constructor's: fine


def test_adan_caution_per_group_and_set_later():
    """timm reads ``caution`` per group: one group cautious, the other not; and a group
    that turns it on after construction (fo.Adan then steps each param by itself)."""

    def ours(groups: list[dict[str, Any]]) -> Any:
        return fo.Adan([{**groups[0], "caution": True}, groups[1]], lr=0.01, weight_decay=0.1)

    def theirs(groups: list[dict[str, Any]]) -> Any:
        return timm_optim.Adan([{**groups[0], "caution": True}, groups[1]], lr=0.01, weight_decay=0.1)

    assert compare(ours, theirs) < TOLERANCE

    def ours_later(groups: list[dict[str, Any]]) -> Any:
        opt = fo.Adan(groups, lr=0.01)
        opt.param_groups[1]["caution"] = True
        return opt

    def theirs_later(groups: list[dict[str, Any]]) -> Any:
        return timm_optim.Adan([groups[0], {**groups[1], "caution": True}], lr=0.01)

    assert compare(ours_later, theirs_later) < TOLERANCE


def test_adan_per_element_algorithm_refuses_caution():
    """The per-element ADAN steps small params together, so it cannot take caution's
    per-tensor mean: it says which algorithm can, rather than ignore it."""
    from funcopt._src.algorithms.lamb_adan import ADAN

    params = {"w": torch.ones(3)}
    tx = ADAN(lr=0.01, betas=(0.98, 0.92, 0.99), eps=1e-8, weight_decay=0.0, caution=True)
    with pytest.raises(ValueError, match="CAUTIOUS_ADAN"):
        tx.update(params, tx.init(params), params)
