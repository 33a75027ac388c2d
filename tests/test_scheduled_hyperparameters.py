"""Any hyperparameter of a torch-named factory may be a schedule: the same run as
torch's class driven by LambdaLR, for every algorithm."""

from __future__ import annotations

import pytest
import torch
from helpers import ALGORITHMS, HYPER, factory, kwargs_of, skip_unless_steps_on_gradients, torch_cls
from torch._dynamo.testing import CompileCounter

import funcopt as fo


@pytest.mark.parametrize("name", ALGORITHMS)
def test_lr_schedule_matches_torch_with_lambda_lr(name):
    skip_unless_steps_on_gradients(name)  # (tests/test_lbfgs.py and test_sparse_adam.py schedule theirs)
    if "lr" not in HYPER[name]:
        pytest.skip(f"{name} has no lr")
    torch.manual_seed(0)
    kwargs = kwargs_of(HYPER[name])
    peak = kwargs["lr"]
    schedule = fo.warmup_cosine_decay_schedule(0.0, peak, warmup_steps=2, decay_steps=6, end_value=peak / 10)
    w0 = torch.randn(3, 4, dtype=torch.float64)
    grads = [torch.randn(3, 4, dtype=torch.float64) for _ in range(6)]

    theirs = torch.nn.Parameter(w0.clone())
    opt = torch_cls(name)([theirs], **kwargs)
    lambda_lr = torch.optim.lr_scheduler.LambdaLR(opt, lambda count: schedule(count) / peak)
    for g in grads:
        theirs.grad = g.clone()
        opt.step()
        lambda_lr.step()

    # LambdaLR's lr is base_lr * factor, which rounds: the schedule given here does the same
    tx = factory(name)(**{**kwargs, "lr": lambda count: peak * (schedule(count) / peak)})
    params = [w0.clone()]
    state = tx.init(params)
    for g in grads:
        updates, state = tx.update([g.clone()], state, params)
        params = fo.apply_updates(params, updates)
    # NAdam's functional mu_product and ASGD's eta and mu are float64 for float64 params,
    # torch's float32 (tests/test_float64_agreement.py)
    tol = 1e-7 if name in ("NAdam", "ASGD") else 1e-12
    torch.testing.assert_close(params[0], theirs.detach(), rtol=tol, atol=tol)


def test_schedule_compiles_once():
    """The count is a 0-d tensor: a compiled step is one graph for the whole run."""
    tx = fo.nadam(lr=fo.cosine_decay_schedule(0.1, 10), betas=(fo.linear_schedule(0.8, 0.9, 5), 0.99))
    params = [torch.ones(3)]
    counter = CompileCounter()

    @torch.compile(backend=counter, fullgraph=True)
    def step(grads, state, params):
        updates, state = tx.update(grads, state, params)
        return fo.apply_updates(params, updates), state

    state = tx.init(params)
    eager_params, eager_state = params, state
    for _ in range(4):
        params, state = step([torch.ones(3)], state, params)
        updates, eager_state = tx.update([torch.ones(3)], eager_state, eager_params)
        eager_params = fo.apply_updates(eager_params, updates)
    assert counter.frame_count == 1
    torch.testing.assert_close(params, eager_params)


def test_range_checks_skip_schedules_only():
    with pytest.raises(ValueError, match="Invalid learning rate"):
        fo.adamax(lr=-1.0, betas=(fo.constant_schedule(0.9), 0.99))
    fo.adamax(lr=fo.constant_schedule(0.1))  # a schedule is not range-checked


@pytest.mark.parametrize(
    "build",
    [
        lambda s: fo.scale(s),
        lambda s: fo.trace(decay=s, nesterov=True),
        lambda s: fo.ema(decay=s),
        lambda s: fo.scale_by_adam(b1=s),
        lambda s: fo.scale_by_rms(decay=s),
        lambda s: fo.clip(s),
        lambda s: fo.clip_by_global_norm(s),
    ],
    ids=["scale", "trace", "ema", "scale_by_adam", "scale_by_rms", "clip", "clip_by_global_norm"],
)
def test_building_blocks_take_schedules(build):
    """An optax-named building block takes a schedule for a hyperparameter optax holds
    fixed: the same steps as inject_hyperparams, which sets it at each count."""
    schedule = fo.linear_schedule(0.5, 0.9, 4)
    ours, injected = build(schedule), fo.inject_hyperparams(lambda value: build(value))(value=schedule)
    params = [torch.ones(3, dtype=torch.float64)]
    state, injected_state = ours.init(params), injected.init(params)
    torch.manual_seed(0)
    for _ in range(5):
        grads = [torch.randn(3, dtype=torch.float64)]
        updates, state = ours.update(grads, state, params)
        expected, injected_state = injected.update(grads, injected_state, params)
        # inject_hyperparams holds the value as a float32 tensor, the schedule gives a double
        torch.testing.assert_close(updates, expected, rtol=1e-5, atol=1e-7)
