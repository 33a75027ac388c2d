"""State dicts shared with the packages the drop-in classes follow, in float64: the
package's class steps N times, its state_dict loads into funcopt's class, and both step
on alike; and the other way, funcopt's saved (``state_dict()``, or for prodigyopt and
dadaptation ``fo.package_state_dict``) loads into the package's class. Each case runs two
param groups. timm's classes: Lamb, Lars, Adan, AdaBelief, NvNovoGrad, MADGRAD."""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
from helpers import set_default_dtype
from timm_loader import timm_optimizers

import funcopt as fo

prodigyopt = pytest.importorskip("prodigyopt")
dadaptation = pytest.importorskip("dadaptation")
timm_optim = timm_optimizers()

STEPS = 5
TOL = dict(rtol=1e-12, atol=1e-14)

Make = Callable[[list[dict[str, Any]]], Any]


def timm(name: str, **kwargs: Any) -> Make:
    return lambda groups: getattr(timm_optim, name)(groups, **kwargs)


# name: (the package's class, funcopt's, how funcopt's state_dict is saved for the package)
CASES: dict[str, tuple[Make, Make, Callable[[Any], dict[str, Any]]]] = {
    "Prodigy": (
        lambda g: prodigyopt.Prodigy(g, weight_decay=0.01),
        lambda g: fo.Prodigy(g, weight_decay=0.01),
        fo.package_state_dict,
    ),
    "Prodigy-bias-correction": (
        lambda g: prodigyopt.Prodigy(g, use_bias_correction=True, betas=(0.8, 0.99), d0=1e-3),
        lambda g: fo.Prodigy(g, use_bias_correction=True, betas=(0.8, 0.99), d0=1e-3),
        fo.package_state_dict,
    ),
    "Prodigy-growth-rate": (
        lambda g: prodigyopt.Prodigy(g, growth_rate=1.02, weight_decay=0.01),
        lambda g: fo.Prodigy(g, growth_rate=1.02, weight_decay=0.01),
        fo.package_state_dict,
    ),
    "DAdaptAdamW": (
        lambda g: dadaptation.DAdaptAdam(g, decouple=True, weight_decay=0.01),
        lambda g: fo.DAdaptAdamW(g, weight_decay=0.01),
        fo.package_state_dict,
    ),
}
if timm_optim is not None:
    CASES.update({
        "Lamb": (timm("Lamb", lr=0.01), lambda g: fo.Lamb(g, lr=0.01), lambda o: o.state_dict()),
        "Lars": (
            timm("Lars", lr=0.1, momentum=0.9, weight_decay=0.01),
            lambda g: fo.Lars(g, lr=0.1, momentum=0.9, weight_decay=0.01),
            lambda o: o.state_dict(),
        ),
        "Adan": (timm("Adan", lr=0.01, weight_decay=0.1), lambda g: fo.Adan(g, lr=0.01, weight_decay=0.1),
                 lambda o: o.state_dict()),
        "Adan-caution": (timm("Adan", lr=0.01, caution=True), lambda g: fo.Adan(g, lr=0.01, caution=True),
                         lambda o: o.state_dict()),
        "AdaBelief": (timm("AdaBelief", lr=0.01, amsgrad=True), lambda g: fo.AdaBelief(g, lr=0.01, amsgrad=True),
                      lambda o: o.state_dict()),
        "NovoGrad": (timm("NvNovoGrad", lr=0.01, amsgrad=True), lambda g: fo.NovoGrad(g, lr=0.01, amsgrad=True),
                     lambda o: o.state_dict()),
        "MADGRAD": (timm("MADGRAD", lr=0.01), lambda g: fo.MADGRAD(g, lr=0.01), lambda o: o.state_dict()),
    })  # fmt: skip


def new_params() -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(0)
    return [torch.nn.Parameter(torch.randn(s, generator=g)) for s in [(3, 4), (4,), (2, 3), (5,)]]


def step(opt: Any, ps: list[torch.Tensor], i: int) -> None:
    g = torch.Generator().manual_seed(10 + i)
    targets = [torch.randn(p.shape, generator=g) for p in ps]
    opt.zero_grad()
    (sum(((p - t) ** 2).sum() for p, t in zip(ps, targets)) / 2).backward()
    opt.step()


def stepped_then_loaded(source: Make, target: Make, save: Callable[[Any], dict[str, Any]]) -> None:
    """`source` steps STEPS times, its saved state loads into `target` (over copies of the
    params), and both take two more steps: the params equal to float64 round-off."""
    with set_default_dtype(torch.float64), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a = new_params()
        first = source([{"params": a[:2]}, {"params": a[2:]}])
        for i in range(STEPS):
            step(first, a, i)
        b = [torch.nn.Parameter(p.detach().clone()) for p in a]
        second = target([{"params": b[:2]}, {"params": b[2:]}])
        second.load_state_dict(copy.deepcopy(save(first)))
        start = [p.detach().clone() for p in a]
        for i in (STEPS, STEPS + 1):
            step(first, a, i)
            step(second, b, i)
    for x, y, s in zip(a, b, start):
        assert not torch.equal(x, s)  # the steps moved the params
        torch.testing.assert_close(y.detach(), x.detach(), **TOL)


@pytest.mark.parametrize("name", list(CASES))
def test_package_state_dict_loads_into_funcopt(name):
    package, ours, _ = CASES[name]
    stepped_then_loaded(package, ours, lambda o: o.state_dict())


@pytest.mark.parametrize("name", list(CASES))
def test_funcopt_state_dict_loads_into_the_package(name):
    package, ours, save = CASES[name]
    stepped_then_loaded(ours, package, save)


@pytest.mark.parametrize("name", list(CASES))
def test_funcopt_state_dict_still_loads_into_funcopt(name):
    _, ours, save = CASES[name]
    stepped_then_loaded(ours, ours, lambda o: o.state_dict())
    stepped_then_loaded(ours, ours, save)  # the package's format, too


def test_what_funcopt_does_not_do_raises():
    """A package's state_dict saved with an option funcopt's class lacks raises, saying so,
    and changes nothing; so does a state_dict for other params."""
    ps = new_params()
    for package, kwargs, match in [
        (dadaptation.DAdaptAdam, dict(growth_rate=1.02, decouple=True), "growth_rate"),
        (prodigyopt.Prodigy, dict(decouple=False, weight_decay=0.1), "decouple=False"),
    ]:
        theirs = package(ps, **kwargs)
        step(theirs, ps, 0)
        ours = (fo.DAdaptAdamW if package is dadaptation.DAdaptAdam else fo.Prodigy)(ps)
        with pytest.raises(ValueError, match=match):
            ours.load_state_dict(theirs.state_dict())
        assert not ours.state and "estim_lr" not in ours.param_groups[0]
    theirs = dadaptation.DAdaptAdam(ps[:2], decouple=True)
    step(theirs, ps[:2], 0)
    with pytest.raises(ValueError, match="has 2 params, this optimizer 4"):
        fo.DAdaptAdamW(ps).load_state_dict(theirs.state_dict())
    with pytest.raises(TypeError, match="package_state_dict takes"):
        fo.package_state_dict(fo.Adam(ps))


def test_funcopts_plain_state_dict_fails_loudly_in_prodigyopt():
    """prodigyopt cannot read funcopt's keys: its step fails (not silently restarts)."""
    ps = new_params()
    ours = fo.Prodigy(ps)
    step(ours, ps, 0)
    theirs = prodigyopt.Prodigy(ps)
    theirs.load_state_dict(ours.state_dict())
    with pytest.raises(KeyError, match="'k'"):
        step(theirs, ps, 1)
