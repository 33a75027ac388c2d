"""fo.Optimizer steps a chain of building blocks in place (``chain_inplace.py``): the
same optimizer forced through the pure update (``_step_functional``) is the oracle,
step for step, for each block and for chains of them, with schedules, tensor
hyperparameters, params without a gradient and param groups; the state is the pure
path's, slot for slot, so a run may switch paths through a state_dict. Both paths run
each block's one math (transforms.py) with the same torch ops, so they agree bit for
bit, in float32, float64, bfloat16 and float16. Where the chain holds anything else, or
autograd records, the pure path steps."""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Iterator
from typing import Any

import optree
import pytest
import torch
from helpers import assert_same

import funcopt as fo
from funcopt._src.engine import inplace
from funcopt._src.torch import chain_inplace
from funcopt._src.torch.state import _slots

# Sizes that take each of the engine's ways on the CPU: chunks of tiny params (with a
# 0-d one and a matrix), one medium param, a large one in blocks, a non-contiguous one.
SHAPES = [(3,), (), (4, 3), (5,), (70, 80), (inplace.SEGMENT + 1000,)]
EXACT = {"rtol": 0, "atol": 0}


def schedule(count: Any) -> Any:
    """A schedule of the step count (a tensor where the pure update passes one)."""
    return 0.1 * 0.9**count


WARMUP_COSINE = fo.warmup_cosine_decay_schedule(0.0, 0.1, warmup_steps=2, decay_steps=10)


def with_lr(*blocks: fo.GradientTransformation) -> Callable[..., fo.GradientTransformation]:
    """A factory of ``chain(*blocks, scale_by_learning_rate(lr))``."""
    return lambda lr: fo.chain(*blocks, fo.scale_by_learning_rate(lr))


def adamw_chain(lr: Any, weight_decay: Any) -> fo.GradientTransformation:
    return fo.chain(fo.scale_by_adam(), fo.add_decayed_weights(weight_decay), fo.scale_by_learning_rate(lr))


# name -> (factory, the optimizer's hyperparameters)
CASES: dict[str, tuple[Any, dict[str, Any]]] = {
    "identity": (with_lr(fo.identity()), {"lr": 0.1}),
    "set_to_zero": (lambda: fo.set_to_zero(), {}),
    "scale": (lambda: fo.scale(-0.1), {}),
    "scale_by_sign": (with_lr(fo.scale_by_sign()), {"lr": 0.1}),
    "clip": (with_lr(fo.clip(0.5)), {"lr": 0.1}),
    "trace": (with_lr(fo.trace(0.9)), {"lr": 0.1}),
    "trace, nesterov": (with_lr(fo.trace(0.9, nesterov=True)), {"lr": 0.1}),
    "ema": (with_lr(fo.ema(0.8)), {"lr": 0.1}),
    "ema, no debias": (with_lr(fo.ema(0.8, debias=False)), {"lr": 0.1}),
    "scale_by_adam": (with_lr(fo.scale_by_adam()), {"lr": 0.1}),
    "scale_by_adam, nesterov, eps_root": (
        with_lr(fo.scale_by_adam(b1=0.8, eps_root=1e-6, nesterov=True)),
        {"lr": 0.1},
    ),
    "scale_by_rms": (with_lr(fo.scale_by_rms(initial_scale=0.1)), {"lr": 0.1}),
    "scale_by_rms, eps outside, bias corrected": (
        with_lr(fo.scale_by_rms(eps_in_sqrt=False, bias_correction=True)),
        {"lr": 0.1},
    ),
    "add_decayed_weights": (lambda: fo.add_decayed_weights(0.1), {}),
    "add_decayed_weights 0": (lambda: fo.add_decayed_weights(0.0), {}),
    "add_decayed_weights, schedule": (lambda: fo.add_decayed_weights(schedule), {}),
    "scale_by_learning_rate, no flip": (
        lambda lr: fo.scale_by_learning_rate(lr, flip_sign=False),
        {"lr": 0.1},
    ),
    "scale_by_schedule": (lambda: fo.scale_by_schedule(schedule), {}),
    "adamw chain": (adamw_chain, {"lr": 0.1, "weight_decay": 0.1}),
    "adamw chain, warmup-cosine lr": (adamw_chain, {"lr": WARMUP_COSINE, "weight_decay": 0.1}),
    "adamw chain, tensor hyperparameters": (
        adamw_chain,
        {"lr": torch.tensor(0.1), "weight_decay": torch.tensor(0.1)},
    ),
    "adam, tensor betas": (
        lambda lr: fo.chain(
            fo.scale_by_adam(b1=torch.tensor(0.8), b2=torch.tensor(0.99, dtype=torch.float64)),
            fo.scale_by_learning_rate(lr),
        ),
        {"lr": 0.1},
    ),  # fmt: skip
    "adam, scheduled b1 (accepts_schedules)": (
        with_lr(fo.scale_by_adam(b1=fo.linear_schedule(0.5, 0.9, 3))),
        {"lr": 0.1},
    ),
    "clip, trace, decay, schedule": (
        lambda lr: fo.chain(
            fo.clip(0.5),
            fo.trace(0.9, nesterov=True),
            fo.add_decayed_weights(0.1),
            fo.scale_by_learning_rate(lr),
        ),
        {"lr": WARMUP_COSINE},
    ),  # fmt: skip
    "nested chains, named_chain": (
        lambda lr: fo.named_chain(
            ("a", fo.chain(fo.scale_by_rms(), fo.chain(fo.ema(0.5), fo.scale(2.0)))),
            ("lr", fo.scale_by_learning_rate(lr)),
        ),
        {"lr": 0.1},
    ),  # fmt: skip
    "clip_by_global_norm, adamw": (
        lambda lr: fo.chain(
            fo.clip_by_global_norm(3.0),
            fo.scale_by_adam(),
            fo.add_decayed_weights(0.1),
            fo.scale_by_learning_rate(lr),
        ),
        {"lr": 0.1},
    ),  # fmt: skip
    "clip_by_global_norm, not clipping": (with_lr(fo.clip_by_global_norm(1e6)), {"lr": 0.1}),
    "sign, then decay": (
        lambda: fo.chain(fo.scale_by_sign(), fo.add_decayed_weights(0.1), fo.scale(-0.1)),
        {},
    ),
    "clip, trace nesterov, sign": (
        lambda: fo.chain(fo.clip(0.5), fo.trace(0.9, nesterov=True), fo.scale_by_sign()),
        {},
    ),  # fmt: skip
    "trace, scale, clip": (lambda: fo.chain(fo.trace(0.9), fo.scale(-0.1), fo.clip(0.05)), {}),
    "global clip, trace, zero": (
        lambda: fo.chain(fo.clip_by_global_norm(1.0), fo.trace(0.5), fo.set_to_zero()),
        {},
    ),  # fmt: skip
}


def make_params(
    dtype: torch.dtype = torch.float32, seed: int = 0, device: str = "cpu"
) -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(seed)
    params = [torch.randn(s, generator=g, dtype=dtype) for s in SHAPES]
    params.append(torch.randn(30, 20, generator=g, dtype=dtype).t())  # not contiguous
    return [torch.nn.Parameter(p.to(device)) for p in params]


def copies(params: list[torch.Tensor]) -> list[torch.nn.Parameter]:
    return [torch.nn.Parameter(p.detach().clone()) for p in params]


def set_grads(params: list[torch.Tensor], step: int, without: tuple[int, ...] = ()) -> None:
    g = torch.Generator().manual_seed(100 + step)
    for i, p in enumerate(params):
        grad = torch.randn(p.shape, generator=g, dtype=p.dtype).to(p.device)
        p.grad = None if i in without else grad


@contextlib.contextmanager
def pure_path() -> Iterator[None]:
    """Steps inside take the pure update: the in-place chain declines every group."""
    real = chain_inplace.step
    chain_inplace.step = lambda *args, **kwargs: False  # type: ignore[assignment]
    try:
        yield
    finally:
        chain_inplace.step = real


@contextlib.contextmanager
def fast_path_only() -> Iterator[None]:
    """Steps inside fail if any group takes the pure update."""
    real = fo.Optimizer._step_functional

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the chain took the pure path")

    fo.Optimizer._step_functional = refuse  # type: ignore[method-assign]
    try:
        yield
    finally:
        fo.Optimizer._step_functional = real  # type: ignore[method-assign]


def both_ways(factory: Any, hp: dict[str, Any], steps: int = 4, dtype: torch.dtype = torch.float32,
              without: tuple[int, ...] = (), groups: Any = None, device: str = "cpu") -> tuple[Any, Any]:  # fmt: skip
    """The fast and the pure optimizer after the same steps: ``((params, optimizer), ...)``."""
    fast_params = make_params(dtype, device=device)
    pure_params = copies(fast_params)
    arrange = groups or (lambda ps: ps)
    fast = fo.Optimizer(arrange(fast_params), factory, **hp)
    pure = fo.Optimizer(arrange(pure_params), factory, **hp)
    for k in range(steps):
        set_grads(fast_params, k, without if k % 2 else ())
        set_grads(pure_params, k, without if k % 2 else ())
        with fast_path_only():
            fast.step()
        with pure_path():
            pure.step()
    return (fast_params, fast), (pure_params, pure)


def assert_same_runs(fast: Any, pure: Any, dtype: torch.dtype = torch.float32, tol: Any = EXACT) -> None:
    """The params and the state_dicts (slots, dtypes, values, counts), bit for bit by default."""
    (fast_params, fast_opt), (pure_params, pure_opt) = fast, pure
    assert all(p.dtype == dtype for p in fast_params if p.ndim == 1)  # the groups test mixes dtypes
    assert_same([p.detach() for p in fast_params], [p.detach() for p in pure_params], **tol)
    assert_same(fast_opt.state_dict()["state"], pure_opt.state_dict()["state"], **tol)


@pytest.mark.parametrize("case", CASES)
def test_steps_as_the_pure_path(case):
    factory, hp = CASES[case]
    fast, pure = both_ways(factory, hp)
    assert_same_runs(fast, pure)


# each block in each dtype, with the hyperparameters as numbers and as tensors (which the
# pure update multiplies apart rather than in a fused add)
OTHER_DTYPES = [
    "adamw chain",
    "adamw chain, tensor hyperparameters",
    "scale_by_adam, nesterov, eps_root",
    "scale_by_rms, eps outside, bias corrected",
    "clip, trace, decay, schedule",
    "nested chains, named_chain",
    "add_decayed_weights, schedule",
    "clip_by_global_norm, adamw",
]


# in float16, Adam's default eps (1e-8) is 0: its first step divides 0 by 0 where a
# gradient is 0, in both paths (NaN, which assert_close never finds equal)
NO_EPS_IN_FLOAT16 = ("adamw chain", "nested chains, named_chain", "clip_by_global_norm, adamw")


@pytest.mark.parametrize(
    ("case", "dtype"),
    [
        (case, dtype)
        for case in OTHER_DTYPES
        for dtype in (torch.float64, torch.bfloat16, torch.float16)
        if not (dtype == torch.float16 and case.startswith(NO_EPS_IN_FLOAT16))
    ],  # fmt: skip
)
def test_other_dtypes(case, dtype):
    factory, hp = CASES[case]
    fast, pure = both_ways(factory, hp, steps=3, dtype=dtype)
    assert_same_runs(fast, pure, dtype)


@pytest.mark.parametrize(
    "case", ["adamw chain", "scale_by_rms", "clip, trace, decay, schedule", "sign, then decay"]
)
def test_lists_of_tensors(case, monkeypatch):
    """The foreach ops that step groups off the CPU, run on the CPU."""
    monkeypatch.setattr(inplace, "use_lists", lambda device: True)
    factory, hp = CASES[case]
    fast, pure = both_ways(factory, hp)
    assert_same_runs(fast, pure)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", CASES)
def test_on_cuda(case, dtype):
    """On a GPU the in-place chain runs foreach ops (CUDA's multi-tensor kernels). These
    contract a multiply and an add into one rounding where the per-tensor kernels of the
    pure path may not: float32 results differ in the last bit or two (seen on an H100, torch
    2.11), bfloat16 ones did not."""
    factory, hp = CASES[case]
    fast, pure = both_ways(factory, hp, steps=3, dtype=dtype, device="cuda")
    assert_same_runs(fast, pure, dtype, EXACT if dtype == torch.bfloat16 else {"rtol": 1e-5, "atol": 1e-6})


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16], ids=str)
def test_lists_of_tensors_other_dtypes(dtype, monkeypatch):
    monkeypatch.setattr(inplace, "use_lists", lambda device: True)
    factory, hp = CASES["adamw chain, tensor hyperparameters"]
    fast, pure = both_ways(factory, hp, steps=3, dtype=dtype)
    assert_same_runs(fast, pure, dtype)


def test_params_without_a_gradient():
    """A param without a gradient keeps its buffers; the group's counts advance, in its
    state too, as on the pure path."""
    factory, hp = CASES["adamw chain, warmup-cosine lr"]
    fast, pure = both_ways(factory, hp, steps=5, without=(0, 4, 6))
    assert_same_runs(fast, pure)
    params, optimizer = fast
    assert int(optimizer.state[params[0]]["0.count"]) == 5
    assert optimizer.state[params[0]]["0.count"] is optimizer.state[params[4]]["0.count"]


def test_param_groups_and_mixed_dtypes():
    def groups(ps: list[torch.Tensor]) -> list[dict[str, Any]]:
        ps[1].data = ps[1].data.double()  # a float64 param among float32 ones
        ps[2].data = ps[2].data.double()
        return [{"params": ps[:3], "lr": 0.01}, {"params": ps[3:], "weight_decay": torch.tensor(0.5)}]

    factory, hp = CASES["adamw chain"]
    fast, pure = both_ways(factory, hp, groups=groups)
    assert_same_runs(fast, pure)


def test_state_dict_moves_between_paths():
    """A run saved by one path resumes on the other: the state_dicts have the same
    entries, and each path continues as the same path would after loading."""
    factory, hp = CASES["clip, trace, decay, schedule"]
    (fast_params, fast), (pure_params, pure) = both_ways(factory, hp, steps=2)
    assert fast.state_dict()["state"].keys() == pure.state_dict()["state"].keys()
    # swap: the fast path resumes the pure path's state, and the other way round
    fast_resumed, pure_resumed = copies(pure_params), copies(fast_params)
    a = fo.Optimizer(fast_resumed, factory, **hp)
    a.load_state_dict(copy.deepcopy(pure.state_dict()))  # as saved: tensors of its own
    b = fo.Optimizer(pure_resumed, factory, **hp)
    b.load_state_dict(copy.deepcopy(fast.state_dict()))
    for k in range(2, 4):
        for ps in (fast_resumed, pure_resumed, fast_params, pure_params):
            set_grads(ps, k)
        with fast_path_only():
            a.step()
            fast.step()
        with pure_path():
            b.step()
            pure.step()
    assert_same_runs((fast_resumed, a), (pure_params, pure))
    assert_same_runs((fast_params, fast), (pure_resumed, b))


def test_functional_state_of_the_fast_path():
    """fo.functional_state reads the fast path's state as the functional one: the
    structure init makes, the pure path's values, its count exactly."""
    factory, hp = CASES["adamw chain, warmup-cosine lr"]
    (fast_params, fast), (pure_params, pure) = both_ways(factory, hp, steps=3)
    keys = [str(i) for i in range(len(fast_params))]
    state = fo.functional_state(fast, dict(zip(keys, fast_params)))
    expected = fo.functional_state(pure, dict(zip(keys, pure_params)))
    init = factory(**hp).init({k: p.detach() for k, p in zip(keys, fast_params)})
    assert optree.tree_structure(state) == optree.tree_structure(init)
    assert_same(state, expected, **EXACT)
    assert int(state[0].count) == int(state[2].count) == 3


def unknown_chains() -> dict[str, Any]:
    return {
        "clip_by_global_norm, not first": with_lr(fo.scale_by_adam(), fo.clip_by_global_norm(1.0)),
        "masked weight decay": lambda lr: fo.chain(
            fo.add_decayed_weights(0.1, mask=lambda ps: optree.tree_map(lambda p: p.ndim > 1, ps)),
            fo.scale_by_learning_rate(lr),
        ),
        "mu_dtype": with_lr(fo.scale_by_adam(mu_dtype=torch.float64)),
        "accumulator_dtype": with_lr(fo.trace(0.9, accumulator_dtype=torch.float64)),
        "fo.adamw inside": lambda lr: fo.chain(fo.clip(1.0), fo.adamw(lr=lr)),
        "inject_hyperparams": fo.inject_hyperparams(fo.adamw),
    }


@pytest.mark.parametrize("case", list(unknown_chains()))
def test_anything_else_takes_the_pure_path(case, monkeypatch):
    factory = unknown_chains()[case]
    params = make_params()
    optimizer = fo.Optimizer(params, factory, lr=0.1)
    calls = []
    real = fo.Optimizer._step_functional
    monkeypatch.setattr(fo.Optimizer, "_step_functional", lambda *a: calls.append(1) or real(*a))
    set_grads(params, 0)
    optimizer.step()
    assert calls == [1]


def test_declines_where_autograd_records():
    """With grad enabled and params that require grad (a differentiable step), the
    in-place step declines, changing nothing."""
    params = make_params()
    set_grads(params, 0)
    before = [p.detach().clone() for p in params]
    transform = adamw_chain(0.1, 0.1)
    states = [{name: leaf["0"] if per_param else leaf for name, per_param, leaf in
               _slots(transform.init({"0": p.detach()}))[0]} for p in params]  # fmt: skip
    with torch.enable_grad():
        assert not chain_inplace.step(transform, params, [p.grad for p in params], states, [])
    with torch.no_grad():
        assert chain_inplace.step(transform, params, [p.grad for p in params], states, [])
    assert not torch.equal(params[0], before[0])


def test_declines_complex_params_without_changing_anything():
    """A complex param among real ones: the whole group takes the pure path."""
    params = [torch.nn.Parameter(torch.randn(3)), torch.nn.Parameter(torch.randn(4, dtype=torch.complex64))]
    fast = fo.Optimizer(params, adamw_chain, lr=0.1, weight_decay=0.1)
    pure_params = copies(params)
    pure = fo.Optimizer(pure_params, adamw_chain, lr=0.1, weight_decay=0.1)
    for ps in (params, pure_params):
        set_grads(ps, 0)
    fast.step()
    with pure_path():
        pure.step()
    assert_same(fast.state_dict(), pure.state_dict(), rtol=0, atol=0)
    assert_same([p.detach() for p in params], [p.detach() for p in pure_params], rtol=0, atol=0)


def test_declines_tensor_betas_in_half_dtypes():
    """Adam's math (adam.py) computes ``1 - b1`` of a tensor b1 in the leaf's dtype with the
    pure ops, which a lerp's number weight does not (in bfloat16, inexact for b1 = 0.1):
    the chain declines, and steps as the pure path does."""
    factory = with_lr(fo.scale_by_adam(b1=torch.tensor(0.1)))
    params = make_params(torch.bfloat16)
    pure_params = copies(params)
    fast = fo.Optimizer(params, factory, lr=0.1)
    pure = fo.Optimizer(pure_params, factory, lr=0.1)
    real, calls = chain_inplace.step, []
    chain_inplace.step = lambda *a, **k: calls.append(real(*a, **k)) or calls[-1]  # type: ignore[assignment]
    try:
        for k in range(2):
            set_grads(params, k)
            set_grads(pure_params, k)
            fast.step()
            with pure_path():
                pure.step()
    finally:
        chain_inplace.step = real
    assert calls == [False, False]
    assert_same_runs((params, fast), (pure_params, pure), torch.bfloat16)
