"""The catalogue's drop-in classes: each steps as its functional form (float64, 10
steps, two param groups; those that follow timm as timm, in test_timm_reference.py),
its state_dict loads into a new instance and steps on alike, a closure's loss reaches
the optimizers that read it, and torch's argument checks hold."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

import funcopt as fo

# class name -> (constructor kwargs, the functional form of those kwargs; None for a class
# that follows timm where optax differs: tests/test_timm_reference.py compares those)
CASES: dict[str, tuple[dict[str, Any], Any]] = {
    "Lamb": ({"lr": 0.01, "weight_decay": 0.1}, None),
    "Lars": ({"lr": 0.1, "momentum": 0.9, "weight_decay": 0.01, "nesterov": True}, None),
    "Adan": ({"lr": 0.01, "weight_decay": 0.05}, None),
    "AdaBelief": ({"lr": 0.01, "betas": (0.8, 0.99)}, None),
    "Yogi": ({"lr": 0.01}, lambda: fo.yogi(0.01)),
    "NovoGrad": (  # optax's math, with timm's defaults
        {"lr": 0.01, "weight_decay": 0.1},
        lambda: fo.novograd(0.01, b1=0.95, b2=0.98, eps=1e-8, weight_decay=0.1),
    ),
    "NAdamW": ({"lr": 0.01, "weight_decay": 0.1}, lambda: fo.nadamw(0.01, weight_decay=0.1)),
    "Adopt": ({"lr": 0.01}, lambda: fo.adopt(0.01)),
    "AdEMAMix": ({"lr": 0.01, "alpha": 2.0}, lambda: fo.ademamix(0.01, alpha=2.0)),
    "Prodigy": (
        {"weight_decay": 0.1, "d0": 1e-3},
        lambda: fo.prodigy(weight_decay=0.1, estim_lr0=1e-3, bias_correction=False),
    ),
    "DAdaptAdamW": ({"d0": 1e-3, "use_bias_correction": True}, lambda: fo.dadapt_adamw(estim_lr0=1e-3)),
    "MADGRAD": ({"lr": 0.01, "weight_decay": 0.1}, lambda: fo.madgrad(0.01, weight_decay=0.1)),
    "Momo": ({"lr": 0.5, "weight_decay": 0.01}, lambda: fo.momo(0.5, weight_decay=0.01)),
    "PolyakSGD": ({"max_lr": 0.3}, lambda: fo.polyak_sgd(max_learning_rate=0.3)),
    "SM3": ({"lr": 0.1}, lambda: fo.sm3(0.1)),
    "Signum": ({"lr": 0.01}, lambda: fo.signum(0.01)),
}
NEEDS_LOSS = {"Momo", "PolyakSGD"}
STEPS = 10


def make_params() -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(0)
    return [
        torch.nn.Parameter(torch.randn(s, generator=g, dtype=torch.float64)) for s in [(3, 4), (4,), (2, 3)]
    ]


def loss_of(params: list[torch.Tensor], step: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(10 + step)
    targets = [torch.randn(p.shape, generator=g, dtype=torch.float64) for p in params]
    return sum(((p - t) ** 2).sum() for p, t in zip(params, targets)) / 2 + 1.0


def run_class(
    name: str, kwargs: dict[str, Any], steps: int = STEPS, opt: Any = None, params: Any = None
) -> Any:
    params = params or make_params()
    if opt is None:  # two param groups, each stepping on its own (as torch)
        opt = getattr(fo, name)([{"params": params[:2]}, {"params": params[2:]}], **kwargs)
    for step in range(steps):

        def closure(step: int = step) -> torch.Tensor:
            opt.zero_grad()
            loss = loss_of(params, step)
            loss.backward()
            return loss

        opt.step(closure)
    return params, opt


# one step size for all param groups, as their packages: the functional form over one tree
SHARED_ESTIMATE = {"Prodigy", "DAdaptAdamW"}


def run_functional(factory: Any, steps: int = STEPS, one_tree: bool = False) -> list[torch.Tensor]:
    params = [p.detach() for p in make_params()]
    split = lambda f: (
        [{"0": f[0], "1": f[1], "2": f[2]}] if one_tree else [{"0": f[0], "1": f[1]}, {"0": f[2]}]
    )  # noqa: E731
    groups = split(params)
    txs = [factory() for _ in groups]
    states = [tx.init(g) for tx, g in zip(txs, groups)]
    for step in range(steps):
        flat = [t.requires_grad_() for g in groups for t in g.values()]
        loss = loss_of(flat, step)
        grads = torch.autograd.grad(loss, flat)
        loss = loss.detach()
        flat = [t.detach() for t in flat]
        groups, gtrees = split(flat), split(grads)
        for i in range(len(groups)):
            updates, states[i] = txs[i].update(gtrees[i], states[i], groups[i], value=loss)
            groups[i] = fo.apply_updates(groups[i], updates)
    return [t for g in groups for t in g.values()]


@pytest.mark.parametrize("name", sorted(n for n, (_, factory) in CASES.items() if factory is not None))
def test_class_steps_as_functional_form(name):
    kwargs, factory = CASES[name]
    params, _ = run_class(name, kwargs)
    expected = run_functional(factory, one_tree=name in SHARED_ESTIMATE)
    for p, e in zip(params, expected):
        torch.testing.assert_close(p.detach(), e, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("name", sorted(CASES))
def test_state_dict_round_trip(name):
    """Five steps, a state_dict into a fresh instance, five more: as ten in one run."""
    kwargs, _ = CASES[name]
    params, opt = run_class(name, kwargs, steps=5)
    saved = copy.deepcopy(opt.state_dict())
    fresh_params = [torch.nn.Parameter(p.detach().clone()) for p in params]
    fresh = getattr(fo, name)([{"params": fresh_params[:2]}, {"params": fresh_params[2:]}], **kwargs)
    fresh.load_state_dict(saved)
    for step in range(5, 10):
        for o, ps in ((opt, params), (fresh, fresh_params)):

            def closure(o: Any = o, ps: Any = ps, step: int = step) -> torch.Tensor:
                o.zero_grad()
                loss = loss_of(ps, step)
                loss.backward()
                return loss

            o.step(closure)
    for a, b in zip(params, fresh_params):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize("name", sorted(NEEDS_LOSS))
def test_loss_readers_need_a_closure(name):
    params = make_params()
    opt = getattr(fo, name)(params, **CASES[name][0])
    loss_of(params, 0).backward()
    with pytest.raises(ValueError, match="needs the loss"):
        opt.step()


def test_torch_argument_checks():
    params = make_params()
    with pytest.raises(ValueError, match="Invalid learning rate"):
        fo.Lamb(params, lr=-1.0)
    with pytest.raises(ValueError, match="Invalid beta parameter at index 1"):
        fo.Adan(params, betas=(0.9, 1.5, 0.9))
    with pytest.raises(ValueError, match="Invalid weight_decay"):
        fo.Prodigy(params, weight_decay=-0.1)


def test_lr_scheduler_drives_lr():
    params = make_params()
    opt = fo.Lamb(params, lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    for step in range(3):
        opt.zero_grad()
        loss_of(params, step).backward()
        opt.step()
        sched.step()
    assert opt.param_groups[0]["lr"] == pytest.approx(0.0125)


REFERENCES = {
    "Prodigy": ("prodigyopt", "Prodigy", {}),
    "DAdaptAdamW": ("dadaptation", "DAdaptAdam", {"decouple": True}),
}


@pytest.mark.parametrize(
    "options", [{}, {"use_bias_correction": True}, {"weight_decay": 0.1}, {"d0": 1e-3, "betas": (0.8, 0.99)}]
)
@pytest.mark.parametrize("name", sorted(REFERENCES))
def test_class_steps_as_authors_package(name, options):
    """One param group: the class equals the authors' package (float64, 20 steps)."""
    module, cls, fixed = REFERENCES[name]
    reference = getattr(pytest.importorskip(module), cls)
    params = make_params()
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs, _ = run_class(
            name, options, steps=20, opt=reference(params, **fixed, **options), params=params
        )
    ours, _ = run_class(
        name,
        options,
        steps=20,
        opt=getattr(fo, name)(make_params_ := make_params(), **options),
        params=make_params_,
    )
    start = make_params()
    for a, b, p0 in zip(ours, theirs, start):
        # relative to the distance travelled (the first steps are ~1e-6)
        torch.testing.assert_close(a, b, rtol=0, atol=1e-9 * float((b - p0).detach().abs().max()))


def test_closure_loss_reaches_a_chain_and_skips_transforms_without_extra_args():
    """fo.Optimizer passes step(closure)'s loss as value= where the transformation takes
    it (reduce_on_plateau in a chain), and steps without it where it does not (nadam)."""
    params = make_params()

    def closure_for(opt: Any, step: int) -> Any:
        def closure() -> torch.Tensor:
            opt.zero_grad()
            loss = loss_of(params, step) * 0 + 5.0  # a flat loss: a plateau
            loss.backward()
            return loss

        return closure

    opt = fo.Optimizer(
        params, lambda lr: fo.chain(fo.scale(-lr), fo.reduce_on_plateau(patience=1, factor=0.5)), lr=0.1
    )
    for step in range(3):
        opt.step(closure_for(opt, step))
    assert float(opt.state[params[0]]["1.scale"]) == 0.25  # halved at steps 2 and 3 (no improvement)
    opt = fo.Optimizer(params, lambda lr: fo.chain(fo.clip(1.0), fo.nadam(lr=lr)), lr=0.1)
    opt.step(closure_for(opt, 0))
    assert int(opt.state[params[0]]["1.step"]) == 1


def _groups(params: list[torch.Tensor], name: str) -> list[dict[str, Any]]:
    """Three param groups: the defaults; a group with its own weight decay, eps and
    (Prodigy) d0 and safeguard_warmup or (D-Adaptation) layer_scale; a group at lr 0
    (left out of the sums; its weight decay still applies, at the others' lr, as in the
    packages)."""
    own: dict[str, Any] = {"weight_decay": 0.3, "eps": 1e-3}
    own |= {"d0": 1e-4, "safeguard_warmup": True} if name == "Prodigy" else {"layer_scale": 0.5}
    return [
        {"params": params[:1]},
        {"params": params[1:2], **own},
        {"params": params[2:], "lr": 0.0, "weight_decay": 0.05},
    ]


def run_groups(opt: Any, params: list[torch.Tensor], steps: int, freeze_at: int = -1) -> None:
    """`steps` steps; the zero gradient at the first leaves the params (no sum yet);
    from `freeze_at` the second group's lr is 0 (its moments stay, and step it on)."""
    for step in range(steps):
        if step == freeze_at:
            opt.param_groups[1]["lr"] = 0.0
        opt.zero_grad()
        loss = loss_of(params, step) * (step > 0)
        loss.backward()
        opt.step()


@pytest.mark.parametrize("freeze_at", [-1, 12])
@pytest.mark.parametrize(
    "options",
    [
        {},
        {"use_bias_correction": True, "weight_decay": 0.1},
        {"lr": 0.5, "d0": 1e-3, "betas": (0.8, 0.99)},
        {"betas": (0.0, 0.99), "weight_decay": 0.1},
    ],
)
@pytest.mark.parametrize("name", sorted(REFERENCES))
def test_param_groups_share_the_estimate_as_in_the_authors_package(name, options, freeze_at):
    """Three param groups (`_groups`) share one step-size estimate: the class equals the
    authors' package (float64, 20 steps), each group's params, the estimate and the steps."""
    module, cls, fixed = REFERENCES[name]
    reference = getattr(pytest.importorskip(module), cls)
    theirs_ps, ours_ps = make_params(), make_params()
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = reference(_groups(theirs_ps, name), **fixed, **options)
        run_groups(theirs, theirs_ps, 20, freeze_at)
    ours = getattr(fo, name)(_groups(ours_ps, name), **options)
    run_groups(ours, ours_ps, 20, freeze_at)
    for a, b, p0 in zip(ours_ps, theirs_ps, make_params()):
        assert not torch.equal(b, p0)  # every group moved (the last by its weight decay only)
        torch.testing.assert_close(a, b, rtol=1e-13, atol=1e-12 * float((b - p0).detach().abs().max()))
    for group, their_group in zip(ours.param_groups, theirs.param_groups):
        assert group["estim_lr"] == pytest.approx(their_group["d"], rel=1e-12, abs=0)
        assert group["count"] == their_group["k"] == 19  # (the zero gradient's step counts in neither)


@pytest.mark.parametrize("name", sorted(REFERENCES))
def test_param_groups_with_other_lr_or_betas_raise(name):
    """A group's lr is the others' or 0, as the packages require; what the shared
    estimate reads must be alike in all groups (the packages read the first group's)."""
    params = make_params()
    opt = getattr(fo, name)([{"params": params[:1]}, {"params": params[1:], "lr": 0.5}])
    loss_of(params, 0).backward()
    with pytest.raises(RuntimeError, match="lr is the others' or 0"):
        opt.step()
    opt = getattr(fo, name)([{"params": params[:1]}, {"params": params[1:], "betas": (0.8, 0.9)}])
    with pytest.raises(ValueError, match="set the same betas in every group"):
        opt.step()


def test_prodigy_slice_p_per_group_as_prodigyopt():
    """prodigyopt's ``slice_p`` (its sums over every slice_p-th element of each param),
    set per group, two groups, 20 steps: as the package, and its sliced state's size."""
    prodigyopt = pytest.importorskip("prodigyopt")

    def groups(ps: list[torch.Tensor]) -> list[dict[str, Any]]:
        return [{"params": ps[:1]}, {"params": ps[1:], "slice_p": 3, "weight_decay": 0.2}]

    theirs_ps, ours_ps = make_params(), make_params()
    theirs = prodigyopt.Prodigy(groups(theirs_ps), slice_p=2, d0=1e-3)
    ours = fo.Prodigy(groups(ours_ps), slice_p=2, d0=1e-3)
    run_groups(theirs, theirs_ps, 20)
    run_groups(ours, ours_ps, 20)
    for a, b, p0 in zip(ours_ps, theirs_ps, make_params()):
        torch.testing.assert_close(a, b, rtol=1e-13, atol=1e-12 * float((b - p0).detach().abs().max()))
    assert ours.param_groups[0]["estim_lr"] == pytest.approx(theirs.param_groups[0]["d"], rel=1e-12, abs=0)
    assert [ours.state[p]["grad_sum"].numel() for p in ours_ps] == [6, 2, 2]  # 12 / 2, 4 / 3, 6 / 3
    ours.param_groups[1]["slice_p"] = 2
    with pytest.raises(ValueError, match="keep a group's slice_p"):
        ours.step()
