"""``fused=True`` for Adam, AdamW, SGD and Adagrad calls torch's own fused kernels
(funcopt/_src/torch/torch_kernels.py): params, state and gradients bit for bit
(``torch.equal``) with torch's fused classes on the CPU, over torch's own table of
options (``optim_db``), in float32 and float64. The same holds with a GradScaler's scale
and inf flag, with a tensor lr, and across state dicts loaded both ways. Where torch
2.13's CPU kernels are wrong, funcopt is right: for a gradient laid out unlike its
param, for float16 and bfloat16 SGD, and for SGD params that get their first gradient
late.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from helpers import optim_inputs

import funcopt as fo
from funcopt._src.torch import torch_kernels

NAMES = ["Adam", "AdamW", "SGD", "Adagrad"]
KERNELS = {
    "Adam": "_fused_adam_",
    "AdamW": "_fused_adamw_",
    "SGD": "_fused_sgd_",
    "Adagrad": "_fused_adagrad_",
}
SHAPES = [(6, 5), (7,), (2, 3, 4), (), (40,)]
STEPS = 10


def cases() -> list:
    """torch's CPU options for each class (as ``optim_db`` lists them), with fused=True,
    plus a tensor lr for Adam and AdamW (optim_db lists it for the CPU only for SGD and
    Adagrad)."""
    out = []
    for name in NAMES:
        inputs = optim_inputs(name, with_flags=False)
        if name in ("Adam", "AdamW"):
            inputs.append(("tensor lr", {"lr": torch.tensor(0.01)}))
        for desc, kwargs in inputs:
            kwargs = {k: v for k, v in kwargs.items() if k not in ("foreach", "differentiable", "capturable")}
            out.append(pytest.param(name, kwargs, id=f"{name}-{desc}"))
    return out


def make_params(dtype: torch.dtype, transposed: bool = True, device: str = "cpu") -> list[torch.nn.Parameter]:
    gen = torch.Generator().manual_seed(0)
    params = [torch.randn(s, generator=gen).to(device, dtype) for s in SHAPES]
    if transposed:
        params.append(torch.randn(4, 6, generator=gen).to(device, dtype).t())
    return [torch.nn.Parameter(p) for p in params]


def set_grads(params: list[torch.nn.Parameter], gen: torch.Generator, scale: float = 1.0) -> None:
    """Random gradients laid out as their params (as autograd lays them out)."""
    for p in params:
        p.grad = torch.empty_like(p).copy_(torch.randn(p.shape, generator=gen) * scale)


def train(opt: torch.optim.Optimizer, params: list, steps: int = STEPS, seed: int = 1) -> None:
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        set_grads(params, gen)
        opt.step()


def assert_equal(ours: torch.optim.Optimizer, theirs: torch.optim.Optimizer, ps: list, qs: list) -> None:
    """Params, gradients and state bit for bit; the state dicts alike."""
    assert len(ours.state) == len(theirs.state)  # (SGD without momentum: none)
    for p, q in zip(ps, qs):
        assert torch.equal(p, q) and torch.equal(p.grad, q.grad)
        assert ours.state[p].keys() == theirs.state[q].keys()
        for key, value in theirs.state[q].items():
            mine = ours.state[p][key]
            assert mine.dtype == value.dtype and mine.device == value.device, key
            assert torch.equal(mine, value), key
    assert ours.state_dict()["param_groups"] == theirs.state_dict()["param_groups"]


def twins(name: str, kwargs: dict, dtype: torch.dtype = torch.float32, **make: Any) -> tuple:
    ps, qs = make_params(dtype, **make), make_params(dtype, **make)
    ours = getattr(fo, name)(ps, **copy.deepcopy(kwargs), fused=True)
    theirs = getattr(torch.optim, name)(qs, **copy.deepcopy(kwargs), fused=True)
    return ours, theirs, ps, qs


def counting(monkeypatch: pytest.MonkeyPatch, name: str) -> list[int]:
    """Count the calls of torch's kernel for `name` (torch's classes call it too)."""
    calls: list[int] = []
    kernel = getattr(torch, KERNELS[name])

    def counted(*args, **kwargs):
        calls.append(1)
        return kernel(*args, **kwargs)

    monkeypatch.setattr(torch, KERNELS[name], counted)
    return calls


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("name, kwargs", cases())
def test_bit_for_bit_with_torchs_fused_class(name, kwargs, dtype, monkeypatch):
    ours, theirs, ps, qs = twins(name, kwargs, dtype)
    calls = counting(monkeypatch, name)
    train(ours, ps)
    assert len(calls) == STEPS  # one call a step: one device and dtype
    train(theirs, qs)
    assert_equal(ours, theirs, ps, qs)


@pytest.mark.parametrize("name", NAMES)
def test_grad_scale_and_found_inf_as_torchs(name):
    scaled_steps_alike(name)


def scaled_steps_alike(name: str, device: str = "cpu", dtype: torch.dtype = torch.float32) -> None:
    """The scale and inf flag as a GradScaler sets them (float32 tensors on the params'
    device): the kernel unscales the gradients in place; a step with an inf found
    changes nothing (the counters are set back)."""
    kwargs = {"momentum": 0.9} if name == "SGD" else {"weight_decay": 0.1}
    ours, theirs, ps, qs = twins(name, kwargs, dtype, device=device)
    gens = [torch.Generator().manual_seed(1), torch.Generator().manual_seed(1)]
    for i in range(6):
        for opt, params, gen in zip((ours, theirs), (ps, qs), gens):
            set_grads(params, gen, scale=1024.0)
            opt.grad_scale = torch.tensor(1024.0, device=device)
            opt.found_inf = torch.tensor(1.0 if i == 3 else 0.0, device=device)
            before = copy.deepcopy([p.detach() for p in params])
            opt.step()
            del opt.grad_scale, opt.found_inf
            if i == 3:
                assert all(torch.equal(p, b) for p, b in zip(params, before))
        assert_equal(ours, theirs, ps, qs)
    if name != "SGD":
        assert ours.state[ps[0]]["step"] == 5


@pytest.mark.parametrize("name", NAMES)
def test_grad_scaler_as_torchs(name):
    def scenario(cls):
        torch.manual_seed(0)
        m = torch.nn.Linear(4, 3)
        opt = cls(m.parameters(), lr=0.1, fused=True)
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
        for i in range(4):
            opt.zero_grad()
            loss = m(torch.randn(2, 4)).square().sum()
            scaler.scale(loss * (float("inf") if i == 1 else 1.0)).backward()
            scaler.step(opt)
            scaler.update()
        return [p.detach() for p in m.parameters()], opt.state_dict()["state"], scaler.get_scale()

    (ps, ours, s1), (qs, theirs, s2) = scenario(getattr(fo, name)), scenario(getattr(torch.optim, name))
    assert s1 == s2 == 2.0**9
    assert all(torch.equal(p, q) for p, q in zip(ps, qs))
    assert all(torch.equal(ours[i][k], v) for i in theirs for k, v in theirs[i].items())


@pytest.mark.parametrize("name", NAMES)
def test_state_dict_loads_into_torchs_class_and_back(name):
    """Saved by one after 3 steps, loaded into the other's twin: both step on alike."""
    kwargs = {"momentum": 0.9} if name == "SGD" else {}
    for first, second in ((fo, torch.optim), (torch.optim, fo)):
        ours, theirs, ps, qs = twins(name, kwargs)
        source = getattr(first, name)(ps, **kwargs, fused=True)
        train(source, ps, steps=3)
        for p, q in zip(ps, qs):
            q.data.copy_(p)
        loaded = getattr(second, name)(qs, **kwargs, fused=True)
        loaded.load_state_dict(copy.deepcopy(source.state_dict()))
        train(source, ps, steps=3, seed=2)
        train(loaded, qs, steps=3, seed=2)
        assert_equal(source, loaded, ps, qs)


@pytest.mark.parametrize("name", NAMES)
def test_a_gradient_laid_out_unlike_its_param(name):
    """torch 2.13's CPU kernels pair the elements of a transposed param and a contiguous
    gradient wrongly; funcopt steps it as torch's class steps the gradient laid out as
    the param, and leaves the gradient as it was laid out."""
    kwargs = {"momentum": 0.9} if name == "SGD" else {}
    ours, theirs, ps, qs = twins(name, kwargs)
    gen, gen2 = torch.Generator().manual_seed(1), torch.Generator().manual_seed(1)
    for _ in range(4):
        set_grads(qs, gen2)
        for p in ps:
            p.grad = torch.randn(p.shape, generator=gen)  # contiguous, unlike the transposed param
        ours.step()
        theirs.step()
        assert ps[-1].grad.is_contiguous() and not ps[-1].is_contiguous()
    for p, q in zip(ps, qs):
        assert torch.equal(p, q)
        assert all(torch.equal(ours.state[p][k], v) for k, v in theirs.state[q].items())


def test_sgd_params_that_get_their_first_gradient_late():
    """A param whose first gradient comes after the others' (torch's fused class fails
    there) starts its momentum buffer at its own first step, as the default step does."""
    results = []
    for flags in ({"fused": True}, {}):
        a, b = make_params(torch.float64)[:2]
        opt = fo.SGD([a, b], lr=0.1, momentum=0.9, **flags)
        gen = torch.Generator().manual_seed(1)
        for i in range(4):
            a.grad = torch.randn(a.shape, generator=gen, dtype=a.dtype)
            b.grad = torch.randn(b.shape, generator=gen, dtype=b.dtype) if i >= 2 else None
            opt.step()
        results.append([a.detach(), b.detach(), opt.state[b]["momentum_buffer"]])
    for ours, ref in zip(*results):
        torch.testing.assert_close(ours, ref, rtol=1e-14, atol=1e-14)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_sgd_in_reduced_precision(dtype):
    """torch 2.13's CPU SGD kernel leaves the vectorized part of a float16 or bfloat16
    param as it was: funcopt computes in float32, rounding once per stored tensor, so
    its step is the float32 step rounded (up to float32 rounding of the math)."""
    assert not torch_kernels._sgd_sound_on_cpu(dtype)  # else torch fixed it: then drop the mend
    wide = [torch.nn.Parameter(p.detach().to(dtype).float()) for p in make_params(torch.float32, False)]
    narrow = [torch.nn.Parameter(p.detach().to(dtype)) for p in wide]
    start = [p.detach().clone() for p in narrow]
    for params in (wide, narrow):
        opt = fo.SGD(params, lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.1, fused=True)
        gen = torch.Generator().manual_seed(1)
        for _ in range(2):
            for p in params:
                p.grad = torch.randn(p.shape, generator=gen).to(dtype).to(p.dtype)
            opt.step()
    for p, q, p0 in zip(narrow, wide, start):
        torch.testing.assert_close(p.float(), q.to(dtype).float(), rtol=2**-7, atol=1e-3)
        assert (p != p0).float().mean() > 0.9  # stepped, the vectorized part too


def test_state_of_another_dtype_says_what_to_do():
    p = torch.nn.Parameter(torch.randn(3))
    p.grad = torch.randn(3)
    opt = fo.Adam([p], fused=True)
    opt.step()
    p.data = p.data.double()
    p.grad = torch.randn(3, dtype=torch.float64)
    with pytest.raises(RuntimeError, match="converted after the optimizer's state was made"):
        opt.step()


@pytest.mark.parametrize("name", ["Adam", "AdamW", "SGD", "Adagrad"])
def test_a_param_resized_after_its_state_raises(name):
    """torch's fused kernels check no shape, and its class steps a param resized after its
    state was made (reading past the smaller tensor); the kernel step raises, changing nothing."""
    p = torch.nn.Parameter(torch.ones(6))
    opt = getattr(fo, name)([p], lr=0.1, fused=True, **({"momentum": 0.9} if name == "SGD" else {}))
    p.grad = torch.ones(6)
    opt.step()
    before = copy.deepcopy(opt.state_dict())
    p.data, p.grad = torch.ones(3), torch.ones(3)
    with pytest.raises(
        ValueError, match=r"shape \(3,\) has a state buffer of shape \(6,\).*del optimizer.state"
    ):
        opt.step()
    assert torch.equal(p.detach(), torch.ones(3))
    torch.testing.assert_close(opt.state_dict(), before, rtol=0, atol=0)
    p.data = torch.ones(6)  # a gradient left from before the resize
    with pytest.raises(ValueError, match=r"has a gradient of shape \(3,\).*gradient anew"):
        opt.step()


def test_other_classes_keep_their_fused_step(monkeypatch):
    """Only the four classes call torch's kernels; a class torch does not fuse keeps
    fused.py's compiled kernels."""
    calls = counting(monkeypatch, "Adam")
    p = torch.nn.Parameter(torch.randn(3))
    p.grad = torch.randn(3)
    fo.NAdam([p], fused=True).step()
    assert not calls
    fo.Adam([p], fused=True).step()
    assert calls == [1]
