"""The in-place drop-in classes of issue 64's speed work: Prodigy and DAdaptAdamW (their
step in parts of bounded size, against the authors' packages), the schedule-free
classes in parts, and a state_dict of the earlier fo.Optimizer-based Prodigy and
DAdaptAdamW loading into today's classes; and the catalogue classes moved onto the in-place
path (Yogi, NAdamW, ...) stepping as the earlier fo.Optimizer over optax's chain, whose
state_dicts they load (those that now follow timm, Lamb, Adan, AdaBelief, Lars, NovoGrad
and MADGRAD, load them too: test_timm_reference.py compares their steps with timm's)."""

from __future__ import annotations

import copy
import warnings
from typing import Any

import pytest
import torch

import funcopt as fo
from funcopt._src.torch import distance_classes

F64 = torch.float64
SHAPES = [(3, 4), (4,), (2, 3), (5,), (7, 2)]


def params() -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(0)
    return [torch.nn.Parameter(torch.randn(s, generator=g, dtype=F64)) for s in SHAPES]


def grads(step: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(100 + step)
    return [torch.randn(s, generator=g, dtype=F64) for s in SHAPES]


def run(opt: Any, ps: list[torch.nn.Parameter], steps: range) -> None:
    for step in steps:
        for p, g in zip(ps, grads(step)):
            p.grad = g.clone()
        opt.step()


REFERENCES = {
    "Prodigy": ("prodigyopt", "Prodigy", {}),
    "DAdaptAdamW": ("dadaptation", "DAdaptAdam", {"decouple": True}),
}


@pytest.mark.parametrize("name", sorted(REFERENCES))
def test_a_group_stepped_in_parts_steps_as_the_authors(name, monkeypatch):
    """Parts of at most 13 elements (the params cut into 4 parts): the sums over the
    group add up across parts, and the step equals the package's."""
    monkeypatch.setattr(distance_classes, "PART", 13)
    assert len(distance_classes._parts([params()])) == 4
    module, cls, fixed = REFERENCES[name]
    reference = getattr(pytest.importorskip(module), cls)
    theirs_ps, ours_ps = params(), params()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = reference(theirs_ps, weight_decay=0.1, **fixed)
        run(theirs, theirs_ps, range(15))
    ours = getattr(fo, name)(ours_ps, weight_decay=0.1)
    run(ours, ours_ps, range(15))
    for a, b, p0 in zip(ours_ps, theirs_ps, params()):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-9 * float((b - p0).detach().abs().max()))


@pytest.mark.parametrize("name", ["SGDScheduleFree", "AdamWScheduleFree"])
def test_schedule_free_in_parts_steps_as_the_authors(name, monkeypatch):
    monkeypatch.setattr(distance_classes, "PART", 13)
    schedulefree = pytest.importorskip("schedulefree")
    theirs_ps, ours_ps = params(), params()
    theirs = getattr(schedulefree, name)(theirs_ps, lr=0.05, weight_decay=0.1)
    ours = getattr(fo, name)(ours_ps, lr=0.05, weight_decay=0.1)
    theirs.train()
    ours.train()
    run(theirs, theirs_ps, range(10))
    run(ours, ours_ps, range(10))
    for a, b in zip(ours_ps, theirs_ps):
        torch.testing.assert_close(a, b, rtol=1e-13, atol=1e-14)


# the earlier classes: fo.Optimizer with these factories (their arguments, their state_dict)
def _old_prodigy(lr, betas, beta3, eps, weight_decay, use_bias_correction, safeguard_warmup, d0, d_coef):
    return fo.prodigy(
        lr, betas=(betas[0], betas[1]), beta3=beta3, eps=eps, estim_lr0=d0, estim_lr_coef=d_coef,
        weight_decay=weight_decay, safeguard_warmup=safeguard_warmup, bias_correction=use_bias_correction,
    )  # fmt: skip


def _old_dadapt(lr, betas, eps, weight_decay, use_bias_correction, d0):
    return fo.dadapt_adamw(
        lr, betas=(betas[0], betas[1]), eps=eps, estim_lr0=d0, weight_decay=weight_decay,
        bias_correction=use_bias_correction,
    )  # fmt: skip


def _old_lamb(lr, betas, eps, weight_decay):
    return fo.lamb(lr, b1=betas[0], b2=betas[1], eps=eps, weight_decay=weight_decay)


def _old_adan(lr, betas, eps, weight_decay, eps_root):
    return fo.adan(
        lr, b1=betas[0], b2=betas[1], b3=betas[2], eps=eps, eps_root=eps_root, weight_decay=weight_decay
    )


def _old_adabelief(lr, betas, eps, eps_root):
    return fo.adabelief(lr, b1=betas[0], b2=betas[1], eps=eps, eps_root=eps_root)


def _old_yogi(lr, betas, eps):
    return fo.yogi(lr, b1=betas[0], b2=betas[1], eps=eps)


def _old_nadamw(lr, betas, eps, weight_decay):
    return fo.nadamw(lr, b1=betas[0], b2=betas[1], eps=eps, weight_decay=weight_decay)


def _old_signum(lr, momentum):
    return fo.signum(lr, beta=momentum)


def _old_adopt(lr, betas, eps):
    return fo.adopt(lr, b1=betas[0], b2=betas[1], eps=eps)


def _old_ademamix(lr, betas, alpha, eps, weight_decay):
    return fo.ademamix(
        lr, b1=betas[0], b2=betas[1], b3=betas[2], alpha=alpha, eps=eps, weight_decay=weight_decay
    )


def _old_lars(lr, momentum, weight_decay, trust_coefficient, eps, nesterov):
    return fo.lars(
        lr, weight_decay=weight_decay, trust_coefficient=trust_coefficient, eps=eps, momentum=momentum,
        nesterov=nesterov,
    )  # fmt: skip


def _old_novograd(lr, betas, eps, weight_decay):
    return fo.novograd(lr, b1=betas[0], b2=betas[1], eps=eps, weight_decay=weight_decay)


def _old_madgrad(lr, momentum, weight_decay, eps):
    return fo.madgrad(lr, momentum=momentum, weight_decay=weight_decay, eps=eps)


OLD = {
    "Lars": (_old_lars, dict(lr=0.1, momentum=0.9, weight_decay=0.1, trust_coefficient=0.001, eps=0.0,
                             nesterov=False)),
    "NovoGrad": (_old_novograd, dict(lr=0.01, betas=(0.9, 0.25), eps=1e-6, weight_decay=0.1)),
    "MADGRAD": (_old_madgrad, dict(lr=0.01, momentum=0.9, weight_decay=0.1, eps=1e-6)),
    "Adopt": (_old_adopt, dict(lr=0.01, betas=(0.9, 0.9999), eps=1e-6)),
    "AdEMAMix": (_old_ademamix, dict(lr=0.01, betas=(0.9, 0.999, 0.9999), alpha=5.0, eps=1e-8, weight_decay=0.1)),
    "Yogi": (_old_yogi, dict(lr=0.01, betas=(0.9, 0.999), eps=1e-3)),
    "NAdamW": (_old_nadamw, dict(lr=0.01, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1)),
    "Signum": (_old_signum, dict(lr=0.01, momentum=0.9)),
    "AdaBelief": (_old_adabelief, dict(lr=0.01, betas=(0.9, 0.999), eps=1e-16, eps_root=1e-16)),
    "Lamb": (_old_lamb, dict(lr=0.01, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.1)),
    "Adan": (_old_adan, dict(lr=0.01, betas=(0.98, 0.92, 0.99), eps=1e-8, weight_decay=0.1, eps_root=1e-8)),
    "Prodigy": (_old_prodigy, dict(lr=1.0, betas=(0.9, 0.999), beta3=None, eps=1e-8, weight_decay=0.1,
                                   use_bias_correction=False, safeguard_warmup=False, d0=1e-6, d_coef=1.0)),
    "DAdaptAdamW": (_old_dadapt, dict(lr=1.0, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1,
                                      use_bias_correction=False, d0=1e-6)),
}  # fmt: skip


FOLLOW_TIMM = {"Lamb", "Adan", "AdaBelief", "Lars"}  # whose math changed since (to timm's)


@pytest.mark.parametrize("name", sorted(set(OLD) - FOLLOW_TIMM))
def test_an_earlier_state_dict_loads(name):
    """The fo.Optimizer-based classes kept their transformation's state under its keys
    (Prodigy's estimate, its numerator and the count in each param's state; Lamb's chain
    under '0.mu', ...): such a state_dict resumes in today's class, which then steps as
    the earlier one goes on."""
    factory, defaults = OLD[name]
    old_ps = params()
    old = fo.Optimizer(old_ps, factory, **defaults)
    run(old, old_ps, range(4))
    saved = copy.deepcopy(old.state_dict())
    old_keys = set(saved["state"][0])
    new_ps = [torch.nn.Parameter(p.detach().clone()) for p in old_ps]
    new = getattr(fo, name)(new_ps, **{k: v for k, v in defaults.items() if k in ("lr", "weight_decay")})
    new.load_state_dict(saved)
    run(old, old_ps, range(4, 8))
    run(new, new_ps, range(4, 8))
    for a, b in zip(new_ps, old_ps):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-15)
    assert not old_keys & set(new.state[new_ps[0]]) - {"exp_avg", "exp_avg_sq", "grad_sum", "params0"}


@pytest.mark.parametrize("name", sorted(FOLLOW_TIMM))
def test_an_earlier_state_dict_of_a_class_now_timms_loads(name):
    """The earlier classes over optax's chains (whose math these classes no longer follow):
    their state_dict loads, each buffer under its new key with its value (Lars's momentum,
    which held the steps after the learning rate, divided by -lr; its trust_coefficient
    renamed trust_coeff; Adan's last gradient negated), and the class steps on from there."""
    factory, defaults = OLD[name]
    old_ps = params()
    old = fo.Optimizer(old_ps, factory, **defaults)
    run(old, old_ps, range(4))
    saved = copy.deepcopy(old.state_dict())
    new_ps = [torch.nn.Parameter(p.detach().clone()) for p in old_ps]
    new = getattr(fo, name)(new_ps, lr=0.5)
    new.load_state_dict(saved)
    cls = getattr(fo, name)
    for i, p in enumerate(new_ps):
        for old_key, value in saved["state"][i].items():
            key = cls.old_keys[old_key]
            if key == "momentum_buffer":  # Lars
                value = value / -defaults["lr"]
            if key == "neg_pre_grad":  # Adan: timm keeps the last gradient's negative
                value = -value
            torch.testing.assert_close(new.state[p][key], value.to(new.state[p][key].dtype), rtol=0, atol=0)
    assert new.param_groups[0]["lr"] == defaults["lr"]
    if name == "Lars":
        assert new.param_groups[0]["trust_coeff"] == defaults["trust_coefficient"]
    before = [p.detach().clone() for p in new_ps]
    run(new, new_ps, range(4, 8))
    assert all(torch.isfinite(p).all() and not torch.equal(p, b) for p, b in zip(new_ps, before))


# each moved class that still follows optax against the earlier one (fo.Optimizer over
# optax's chain), options away from the defaults, every option of the constructor
AWAY = {  # (Lars, NovoGrad and MADGRAD follow timm now: test_timm_reference.py)
    "Adopt": [dict(lr=0.03, betas=(0.8, 0.95), eps=1e-2)],
    "AdEMAMix": [dict(lr=0.03, betas=(0.8, 0.95, 0.99), alpha=2.0, eps=1e-3, weight_decay=0.0),
                 dict(lr=0.03, betas=(0.8, 0.95, 0.99), alpha=2.0, eps=1e-3, weight_decay=0.2)],
    "Yogi": [dict(lr=0.03, betas=(0.8, 0.95), eps=1e-2)],
    "NAdamW": [dict(lr=0.03, betas=(0.8, 0.95), eps=1e-3, weight_decay=0.0),
               dict(lr=0.03, betas=(0.8, 0.95), eps=1e-3, weight_decay=0.2)],
    "Signum": [dict(lr=0.03, momentum=0.5), dict(lr=0.03, momentum=0.0)],
}  # fmt: skip


@pytest.mark.parametrize("foreach", [False, True])
@pytest.mark.parametrize("name, kwargs", [(n, k) for n in AWAY for k in [{}, *AWAY[n]]], ids=lambda x: str(x))
def test_a_moved_class_steps_as_the_earlier_one(name, kwargs, foreach):
    """10 steps of the in-place class equal the earlier class's (optax's chain) to float64
    round-off, with its defaults and with each option away from them."""
    factory, defaults = OLD[name]
    old_ps, new_ps = params(), params()
    old = fo.Optimizer(old_ps, factory, **{**_class_defaults(name), **kwargs})
    new = getattr(fo, name)(new_ps, **kwargs, foreach=foreach)
    run(old, old_ps, range(10))
    run(new, new_ps, range(10))
    for a, b in zip(new_ps, old_ps):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)


def _class_defaults(name: str) -> dict[str, Any]:
    """The class's constructor arguments with their defaults (torch's switches left out)."""
    import inspect

    parameters = list(inspect.signature(getattr(fo, name)).parameters.values())[1:]
    return {p.name: p.default for p in parameters if p.kind is p.POSITIONAL_OR_KEYWORD}


def test_lambs_clip_outside_its_class_is_refused_not_ignored():
    """timm's global-norm clip reads every group's gradients, which only fo.Lamb's step
    does: Lamb's algorithm given max_grad_norm elsewhere raises, and changes nothing."""
    lamb = fo.engine.registered("Lamb")
    params = [torch.ones(3, requires_grad=True)]
    opt = fo.Optimizer(
        params, lamb, lr=0.1, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01, max_grad_norm=1.0
    )
    params[0].grad = torch.full((3,), 5.0)
    with pytest.raises(ValueError, match="max_grad_norm=1.0 clips the gradients of all param groups"):
        opt.step()
    assert torch.equal(params[0].detach(), torch.ones(3))
    assert all(int(state["step"]) == 0 for state in opt.state.values())  # (made, never stepped)
    tx = lamb.transform(lr=0.1, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01, max_grad_norm=1.0)
    with pytest.raises(ValueError, match="use fo.Lamb"):
        tx.update([torch.ones(3)], tx.init([torch.ones(3)]), [torch.ones(3)])
