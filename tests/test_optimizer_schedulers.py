"""`fo.Optimizer` with every scheduler of ``torch.optim.lr_scheduler`` (issue 62): the
factory form holds every argument of the factory in its param groups, as torch's classes
hold theirs, so the schedules (lr, and beta1 or momentum for OneCycleLR and CyclicLR) and
the params are those of torch's class of the same algorithm; a transformation passed
already built gets an error that says how to make its lr schedulable."""

from __future__ import annotations

import inspect

import pytest
import torch
from torch.optim import lr_scheduler as L

import funcopt as fo
from funcopt._src.torch.factory import MissingHyperparameterError

SCHEDULERS = {
    "LambdaLR": lambda opt: L.LambdaLR(opt, lambda e: 1 / (e + 1)),
    "MultiplicativeLR": lambda opt: L.MultiplicativeLR(opt, lambda e: 0.9),
    "StepLR": lambda opt: L.StepLR(opt, step_size=2, gamma=0.5),
    "MultiStepLR": lambda opt: L.MultiStepLR(opt, milestones=[2, 5], gamma=0.5),
    "ConstantLR": lambda opt: L.ConstantLR(opt, factor=0.5, total_iters=3),
    "LinearLR": lambda opt: L.LinearLR(opt, start_factor=0.2, total_iters=4),
    "ExponentialLR": lambda opt: L.ExponentialLR(opt, gamma=0.9),
    "SequentialLR": lambda opt: L.SequentialLR(
        opt, [L.ConstantLR(opt, factor=0.5, total_iters=2), L.ExponentialLR(opt, gamma=0.9)], milestones=[2]
    ),
    "PolynomialLR": lambda opt: L.PolynomialLR(opt, total_iters=6, power=2.0),
    "CosineAnnealingLR": lambda opt: L.CosineAnnealingLR(opt, T_max=6),
    "ChainedScheduler": lambda opt: L.ChainedScheduler([L.StepLR(opt, 2, 0.5), L.ExponentialLR(opt, 0.9)]),
    "ReduceLROnPlateau": lambda opt: L.ReduceLROnPlateau(opt, patience=0, factor=0.5),
    # cycle_momentum at its default (True): beta1 or momentum cycles too
    "CyclicLR": lambda opt: L.CyclicLR(opt, base_lr=0.001, max_lr=0.05, step_size_up=3),
    "CosineAnnealingWarmRestarts": lambda opt: L.CosineAnnealingWarmRestarts(opt, T_0=3),
    "OneCycleLR": lambda opt: L.OneCycleLR(opt, max_lr=0.05, total_steps=10),
}
# (funcopt factory, torch class, constructor arguments): betas, and momentum
ALGORITHMS = {
    "AdamW": (fo.adamw, torch.optim.AdamW, {"lr": 0.01}),
    "SGD": (fo.sgd, torch.optim.SGD, {"lr": 0.01, "momentum": 0.9}),
    "NAdam": (fo.nadam, torch.optim.NAdam, {"lr": 0.01}),
}


def test_every_scheduler_of_torch_is_tested():
    classes = {
        name
        for name, c in vars(L).items()
        if inspect.isclass(c) and (issubclass(c, L.LRScheduler) or c is L.ReduceLROnPlateau)
    }
    assert classes - {"LRScheduler", "_LRScheduler"} == set(SCHEDULERS)


def run(make_optimizer, sched):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    x, y = torch.randn(16, 4), torch.randn(16, 1)
    opt = make_optimizer(model.parameters())
    scheduler = SCHEDULERS[sched](opt)
    trace = []
    for _ in range(8):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        scheduler.step(1.0) if sched == "ReduceLROnPlateau" else scheduler.step()  # never improves
        group = opt.param_groups[0]
        trace.append((group["lr"], group.get("betas"), group.get("momentum")))
    return trace, [p.detach() for p in model.parameters()]


@pytest.mark.parametrize("algorithm", list(ALGORITHMS))
@pytest.mark.parametrize("sched", list(SCHEDULERS))
def test_factory_form_follows_every_scheduler_as_torch(sched, algorithm):
    factory, torch_class, kwargs = ALGORITHMS[algorithm]
    ours, params = run(lambda ps: fo.Optimizer(ps, factory, **kwargs), sched)
    theirs, torch_params = run(lambda ps: torch_class(ps, **kwargs), sched)
    assert ours == theirs  # lr, betas, momentum at every step
    assert len({lr for lr, _, _ in ours}) > 1
    if sched in ("CyclicLR", "OneCycleLR") and algorithm != "SGD":
        assert len({betas[0] for _, betas, _ in ours}) > 1  # beta1 cycles
    for p, q in zip(params, torch_params):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7)  # float32 round-off (the functional path)


def test_factory_form_holds_every_argument_of_the_factory():
    """Defaults included, in `defaults` and in each group, as torch's classes hold theirs;
    a group overrides any, and a lambda's defaults count too."""
    params = [torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(3))]
    opt = fo.Optimizer(
        [{"params": params[:1]}, {"params": params[1:], "betas": (0.8, 0.9)}], fo.adamw, lr=1e-3
    )
    expected = {
        name: p.default
        for name, p in inspect.signature(fo.adamw).parameters.items()
        if p.default is not inspect.Parameter.empty
    }
    assert opt.defaults == {**expected, "lr": 1e-3}
    assert opt.param_groups[0]["betas"] == (0.9, 0.999) and opt.param_groups[1]["betas"] == (0.8, 0.9)
    assert all(group["momentum"] == 0 for group in fo.Optimizer(params, fo.sgd, lr=0.1).param_groups)
    chain = fo.Optimizer(
        params, lambda lr, b1=0.9: fo.chain(fo.clip(1.0), fo.adam(lr=lr, betas=(b1, 0.99))), lr=0.1
    )
    assert chain.defaults == {"lr": 0.1, "b1": 0.9}
    # the default is the value the factory takes: the same step as without it
    for p in params:
        p.grad = torch.ones_like(p)
    opt.step()
    assert torch.equal(params[0], fo.apply_updates(torch.zeros(2), fo.adamw(lr=1e-3).update(
        torch.ones(2), fo.adamw(lr=1e-3).init(torch.zeros(2)), torch.zeros(2))[0]))  # fmt: skip


BUILT = fo.chain(fo.clip_by_global_norm(1.0), fo.adamw(lr=1e-3))


@pytest.mark.parametrize("sched", list(SCHEDULERS))
def test_scheduler_on_a_built_transformation_says_how_to_schedule(sched):
    """No bare KeyError: a funcopt error (a KeyError) that names the factory form and
    inject_hyperparams. OneCycleLR first refuses, in torch's code, to cycle a momentum
    that is not there: without cycling, the lr is what is missing."""
    opt = fo.Optimizer(torch.nn.Linear(2, 1).parameters(), BUILT)
    make = SCHEDULERS[sched]
    if sched == "OneCycleLR":
        with pytest.raises(ValueError, match="momentum"):
            make(opt)
        make = lambda o: L.OneCycleLR(o, max_lr=0.05, total_steps=10, cycle_momentum=False)  # noqa: E731
    with pytest.raises(
        MissingHyperparameterError, match=r"no 'lr'.*fo.Optimizer\(params, fo.adamw, lr=1e-3\)"
    ) as e:
        make(opt)
    assert isinstance(e.value, KeyError) and "inject_hyperparams" in str(e.value)


def test_built_transformation_steps_as_before_and_its_groups_after_a_reload():
    """The groups of an optimizer without lr still step and save as plain dicts; loading
    a state_dict keeps the helpful error."""
    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.randn(3))
    opt = fo.Optimizer([p], BUILT)
    p.grad = torch.ones(3)
    before = p.detach().clone()
    opt.step()
    updates, _ = BUILT.update([torch.ones(3)], BUILT.init([before]), [before])
    assert torch.equal(p.detach(), before + updates[0])
    assert opt.param_groups[0].get("lr") is None and "lr" not in opt.param_groups[0]
    saved = opt.state_dict()
    assert type(saved["param_groups"][0]) is dict
    opt.load_state_dict(saved)
    with pytest.raises(MissingHyperparameterError):
        L.StepLR(opt, step_size=1)
    opt.add_param_group({"params": [torch.nn.Parameter(torch.zeros(1))]})
    with pytest.raises(MissingHyperparameterError):
        opt.param_groups[-1]["lr"]
