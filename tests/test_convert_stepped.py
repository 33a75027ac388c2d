"""fo.functional_state / fo.load_functional_state for the classes that step in place
without an Algorithm (fo.Momo, fo.SM3, fo.PolyakSGD, fo.Prodigy, fo.DAdaptAdamW), in
float64: a class stepped N times, converted, then its functional form and the class one
more step each give the same params; the functional state loaded into a fresh class
converts back to itself, and the two step on alike."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import optree
import pytest
import torch

import funcopt as fo

STEPS = 5
TOL = dict(rtol=1e-12, atol=1e-14)
SHAPES = {"w": (3, 4), "b": (4,), "v": (2, 3)}

# name: (the class, its arguments, the functional form with the same hyperparameters, groups)
CASES: dict[str, tuple[type, dict[str, Any], Callable[[], Any], int]] = {
    "Momo": (
        fo.Momo,
        dict(lr=0.5, beta=0.8, weight_decay=0.01),
        lambda: fo.momo(0.5, beta=0.8, weight_decay=0.01),
        1,
    ),
    "Momo-adapt": (
        fo.Momo,
        dict(lr=0.5, lower_bound=-1.0, adapt_lower_bound=True),
        lambda: fo.momo(0.5, lower_bound=-1.0, adapt_lower_bound=True),
        1,
    ),
    "SM3": (fo.SM3, dict(lr=0.1, momentum=0.8), lambda: fo.sm3(0.1, momentum=0.8), 2),
    "PolyakSGD": (
        fo.PolyakSGD,
        dict(lr=0.9, max_lr=0.3, f_min=-0.5),
        lambda: fo.polyak_sgd(max_learning_rate=0.3, scaling=0.9, f_min=-0.5),
        1,
    ),
    "Prodigy": (
        fo.Prodigy,
        dict(lr=1.0, weight_decay=0.01, d0=1e-3),
        lambda: fo.prodigy(1.0, weight_decay=0.01, estim_lr0=1e-3, bias_correction=False),
        2,
    ),
    "DAdaptAdamW": (
        fo.DAdaptAdamW,
        dict(lr=1.0, weight_decay=0.01, d0=1e-3, use_bias_correction=True),
        lambda: fo.dadapt_adamw(1.0, weight_decay=0.01, estim_lr0=1e-3),
        2,
    ),
}


def targets(step: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + step)
    return {k: torch.randn(s, generator=g, dtype=torch.float64) for k, s in SHAPES.items()}


def loss_of(params: dict[str, torch.Tensor], step: int) -> torch.Tensor:
    t = targets(step)
    return sum(((p - t[k]) ** 2).sum() for k, p in params.items()) / 2 + 1.0


def new_params() -> dict[str, torch.nn.Parameter]:
    g = torch.Generator().manual_seed(0)
    return {
        k: torch.nn.Parameter(torch.randn(s, generator=g, dtype=torch.float64)) for k, s in SHAPES.items()
    }


def make(cls: type, params: dict[str, torch.nn.Parameter], kwargs: dict[str, Any], groups: int) -> Any:
    ps = list(params.values())
    if groups == 1:
        return cls(ps, **kwargs)
    return cls([{"params": ps[:1]}, {"params": ps[1:]}], **kwargs)


def class_step(opt: Any, params: dict[str, torch.nn.Parameter], step: int) -> None:
    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = loss_of(params, step)
        loss.backward()
        return loss

    opt.step(closure)


def functional_step(tx: Any, state: Any, params: dict[str, torch.Tensor], step: int) -> tuple[Any, Any]:
    params = {k: p.detach().requires_grad_() for k, p in params.items()}
    loss = loss_of(params, step)
    grads = dict(zip(params, torch.autograd.grad(loss, list(params.values()))))
    detached = {k: p.detach() for k, p in params.items()}
    updates, state = tx.update(grads, state, detached, value=loss.detach())
    return fo.apply_updates(detached, updates), state


def assert_params(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    for k in a:
        torch.testing.assert_close(a[k].detach(), b[k].detach(), **TOL)


@pytest.mark.parametrize("name", list(CASES))
def test_converted_state_steps_as_the_class(name):
    cls, kwargs, form, groups = CASES[name]
    params = new_params()
    opt = make(cls, params, kwargs, groups)
    for step in range(STEPS):
        class_step(opt, params, step)
    tx = form()
    state = fo.functional_state(opt, params)
    assert optree.tree_structure(state) == optree.tree_structure(
        tx.init({k: p.detach() for k, p in params.items()})
    )
    stepped, state = functional_step(tx, state, params, STEPS)
    class_step(opt, params, STEPS)
    assert_params(stepped, params)

    # the functional state (one step on) loaded into a fresh class: it converts back to
    # itself, and the two step on alike
    fresh = {k: torch.nn.Parameter(p.clone()) for k, p in stepped.items()}
    opt2 = make(cls, fresh, kwargs, groups)
    fo.load_functional_state(opt2, state, fresh)
    back = fo.functional_state(opt2, fresh)
    for x, y in zip(optree.tree_leaves(back), optree.tree_leaves(state)):
        torch.testing.assert_close(x, y, rtol=0, atol=0)
    stepped, _ = functional_step(tx, state, stepped, STEPS + 1)
    class_step(opt2, fresh, STEPS + 1)
    assert_params(stepped, fresh)


@pytest.mark.parametrize("name", list(CASES))
def test_before_the_first_step_is_init(name):
    """A class that has not stepped converts to its functional form's init."""
    cls, kwargs, form, groups = CASES[name]
    params = new_params()
    state = fo.functional_state(make(cls, params, kwargs, groups), params)
    expected = form().init({k: p.detach() for k, p in params.items()})
    assert optree.tree_structure(state) == optree.tree_structure(expected)
    for x, y in zip(optree.tree_leaves(state), optree.tree_leaves(expected)):
        torch.testing.assert_close(x, y, rtol=0, atol=0)


def test_scalars_need_their_whole_group_or_all_groups():
    params = new_params()
    ps = list(params.values())
    momo = fo.Momo([{"params": ps[:1]}, {"params": ps[1:]}])
    with pytest.raises(ValueError, match="exactly one group's params"):
        fo.functional_state(momo, params)
    with pytest.raises(ValueError, match="exactly one group's params"):
        fo.functional_state(momo, {"b": params["b"]})
    assert fo.functional_state(momo, {"w": params["w"]}).exp_avg["w"].shape == (3, 4)
    prodigy = fo.Prodigy([{"params": ps[:1]}, {"params": ps[1:]}])
    with pytest.raises(ValueError, match="pass all the optimizer's params"):
        fo.functional_state(prodigy, {"w": params["w"]})
    sliced = fo.Prodigy(ps, slice_p=2)
    with pytest.raises(ValueError, match="slice_p"):
        fo.functional_state(sliced, params)


def test_load_checks_before_it_writes():
    params = new_params()
    opt = fo.SM3(params.values(), lr=0.1)
    class_step(opt, params, 0)
    saved = {
        k: [a.clone() for a in v] if isinstance(v, list) else v.clone()
        for k, v in opt.state[params["w"]].items()
    }
    with pytest.raises(ValueError, match="does not have the structure"):
        fo.load_functional_state(opt, fo.momo().init({k: p.detach() for k, p in params.items()}), params)
    state = fo.functional_state(opt, params)
    bad_mu = {**state[0].mu, "v": [torch.zeros(2), torch.zeros(4)]}
    with pytest.raises(ValueError, match="shape \\(3,\\)"):
        fo.load_functional_state(opt, (state[0]._replace(mu=bad_mu), state[1]), params)
    after = opt.state[params["w"]]
    torch.testing.assert_close(after["momentum_buffer"], saved["momentum_buffer"], rtol=0, atol=0)
    with pytest.raises(ValueError, match="does not have the structure"):
        fo.load_functional_state(fo.PolyakSGD(params.values()), state, params)
