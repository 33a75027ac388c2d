"""fo.Prodigy and fo.DAdaptAdamW equal their authors' packages bit for bit (params and
the estimate ``d``), in float32 on params larger than a part of the classes' groups
(whose temporaries go into the class's buffer) and small ones; Prodigy's
``growth_rate`` as ``prodigyopt``'s; ``fsdp_in_use`` refused."""

from __future__ import annotations

import contextlib
import copy
import io
from typing import Any

import pytest
import torch

import funcopt as fo
from funcopt._src.torch.distance_classes import PART

prodigyopt = pytest.importorskip("prodigyopt")
SHAPES = [(20, 30), (5,), (PART + 7,), (3, 4), (64, 16, 1, 1)]  # (PART + 7,) steps alone


def make_params(dtype: torch.dtype = torch.float32) -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(0)
    return [torch.nn.Parameter(torch.randn(s, generator=g, dtype=dtype) * 0.1) for s in SHAPES]


def run(opt: Any, params: list[torch.nn.Parameter], steps: int, start: int = 0) -> None:
    """`steps` steps on a noisy quadratic (its minimum at 1), so that ``d`` grows."""
    for k in range(start, start + steps):
        g = torch.Generator().manual_seed(100 + k)
        for p in params:
            p.grad = p.detach() - 1 + torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.01
        opt.step()


def quiet(factory: Any) -> Any:
    with contextlib.redirect_stdout(io.StringIO()):  # ("Using decoupled weight decay")
        return factory()


def groups(ps: list[torch.Tensor], **second: Any) -> list[dict[str, Any]]:
    return [{"params": ps[:2]}, {"params": ps[2:], **second}]


@pytest.mark.parametrize(
    "options",
    [
        {"weight_decay": 0.01},
        {"growth_rate": 1.02, "weight_decay": 0.01},
        {"growth_rate": 1.1, "slice_p": 3, "betas": (0.0, 0.99), "use_bias_correction": True},
        {"safeguard_warmup": True, "d0": 1e-4, "d_coef": 0.5},
    ],
)
def test_prodigy_bit_for_bit_float32(options):
    theirs_ps, ours_ps = make_params(), make_params()
    theirs = quiet(lambda: prodigyopt.Prodigy(theirs_ps, **options))
    ours = fo.Prodigy(ours_ps, **options)
    run(theirs, theirs_ps, 20)
    run(ours, ours_ps, 20)
    assert ours.param_groups[0]["estim_lr"] == theirs.param_groups[0]["d"] > 1e-6  # (d grew)
    assert ours.param_groups[0]["d_max"] == theirs.param_groups[0]["d_max"]
    for a, b in zip(ours_ps, theirs_ps):
        assert torch.equal(a, b)


def test_prodigy_growth_rate_two_groups_float64():
    """growth_rate=1.02, 20 steps, two groups (the second with its own d0, weight decay
    and safeguard_warmup; prodigyopt compares d with the last group's d0): as prodigyopt,
    bit for bit, and d grows by at most 1.02 a step after its first."""
    second = {"d0": 1e-5, "weight_decay": 0.1, "safeguard_warmup": True}
    theirs_ps, ours_ps = make_params(torch.float64), make_params(torch.float64)
    theirs = quiet(lambda: prodigyopt.Prodigy(groups(theirs_ps, **second), growth_rate=1.02))
    ours = fo.Prodigy(groups(ours_ps, **second), growth_rate=1.02)
    ds = []
    for k in range(20):
        run(theirs, theirs_ps, 1, start=k)
        run(ours, ours_ps, 1, start=k)
        assert [g["estim_lr"] for g in ours.param_groups] == [g["d"] for g in theirs.param_groups]
        ds.append(ours.param_groups[0]["estim_lr"])
    for a, b in zip(ours_ps, theirs_ps):
        assert torch.equal(a, b)
    assert all(b <= a * 1.02 for a, b in zip(ds[1:], ds[2:]))
    assert ours.param_groups[0]["d_max"] > ds[-1]  # (the estimate is held back)


def test_prodigy_growth_rate_state_dict_resumes():
    """d_max and growth_rate are in the state_dict: a run resumed from it after 10
    steps ends as the run without a break."""
    whole_ps, first_ps = make_params(), make_params()
    whole = fo.Prodigy(whole_ps, growth_rate=1.05)
    run(whole, whole_ps, 20)
    first = fo.Prodigy(first_ps, growth_rate=1.05)
    run(first, first_ps, 10)
    saved = copy.deepcopy(first.state_dict())
    assert saved["param_groups"][0]["growth_rate"] == 1.05 and "d_max" in saved["param_groups"][0]
    resumed_ps = [torch.nn.Parameter(p.detach().clone()) for p in first_ps]
    resumed = fo.Prodigy(resumed_ps)
    resumed.load_state_dict(saved)
    run(resumed, resumed_ps, 10, start=10)
    for a, b in zip(resumed_ps, whole_ps):
        assert torch.equal(a, b)


def test_prodigy_copied_steps_on():
    """The buffer of the temporaries is no state: a deep copy (torch's Optimizer copies
    and pickles its state and groups only) makes its own and steps as the original."""
    ps, copy_ps = make_params(), make_params()
    opt = fo.Prodigy(ps)
    run(opt, ps, 3)
    twin = copy.deepcopy(opt)  # (its own params: deepcopy copies the params too)
    twin_ps = [p for g in twin.param_groups for p in g["params"]]
    for p, q in zip(copy_ps, ps):
        p.data.copy_(q)
    run(opt, ps, 3, start=3)
    run(twin, twin_ps, 3, start=3)
    for a, b in zip(twin_ps, ps):
        assert torch.equal(a, b)


def test_prodigy_refuses_fsdp_and_bad_growth_rate():
    ps = make_params()
    with pytest.raises(ValueError, match="fsdp_in_use=True .* is not supported"):
        fo.Prodigy(ps, fsdp_in_use=True)
    with pytest.raises(ValueError, match="Invalid growth_rate"):
        fo.Prodigy(ps, growth_rate=0.0)
    opt = fo.Prodigy(ps)
    ps[0]._fsdp_flattened = True  # (what FSDP marks its flat params with; prodigyopt reads it)
    with pytest.raises(RuntimeError, match="is not supported"):
        run(opt, ps, 1)


@pytest.mark.parametrize(
    "options", [{}, {"use_bias_correction": True}, {"betas": (0.8, 0.99), "d0": 1e-3, "weight_decay": 0.01}]
)
def test_dadapt_adamw_bit_for_bit_float32(options):
    dadaptation = pytest.importorskip("dadaptation")
    second = {"weight_decay": 0.1, "layer_scale": 0.5}
    theirs_ps, ours_ps = make_params(), make_params()
    theirs = quiet(lambda: dadaptation.DAdaptAdam(groups(theirs_ps, **second), decouple=True, **options))
    ours = fo.DAdaptAdamW(groups(ours_ps, **second), **options)
    run(theirs, theirs_ps, 20)
    run(ours, ours_ps, 20)
    assert ours.param_groups[0]["estim_lr"] == theirs.param_groups[0]["d"] > 1e-6
    for a, b in zip(ours_ps, theirs_ps):
        assert torch.equal(a, b)
