"""funcopt.X and funcopt.x against torch.optim.X, over torch's own table of option
combinations (``optim_inputs_func``, CPU, with the implementation flags torch tests).

Each case runs 12 steps with random gradients, some of them None (those params are
skipped: their state must not move), and checks after construction and after every
step that the adapter's params and ``state_dict()`` equal torch's, and that the
functional path's params and state equal torch's too.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from helpers import (
    ALGORITHMS,
    INFOS,
    assert_matches_torch,
    assert_same,
    factory,
    fo_cls,
    functional_kwargs,
    make_params,
    optim_inputs,
    skip_if_closure_required,
    skip_unless_steps_on_gradients,
    skip_unsupported,
    supported,
    torch_cls,
    trainable,
    weight_decay,
)

import funcopt as fo
from funcopt._src.core import base
from funcopt._src.core.base import real_dtype
from funcopt._src.engine import inplace

CASES = [(name, desc, kwargs) for name in ALGORITHMS for desc, kwargs in optim_inputs(name)]
DTYPES = [torch.float32, torch.float64, torch.complex64]
STEPS = 12
NO_GRAD = {3: {0, 1, 2, 3}, 7: {1, 3}}  # step -> params without a gradient


@pytest.fixture(params=["default", "segments", "lists", "traced"])
def path(request, monkeypatch):
    """Which code paths run: the real sizes; tiny segments, so that the in-place paths
    split params into blocks and chunks even here; the GPUs' path (`ForEach` ops on
    groups of params) on the CPU; or the functional update forced onto its traced path
    (Pure ops, schedules on float64 tensors), as under torch.func/compile."""
    if request.param == "segments":
        for name, size in [("SMALL", 8), ("TINY", 8), ("CHUNK", 16), ("SEGMENT", 16)]:
            monkeypatch.setattr(inplace, name, size)
    if request.param == "lists":
        monkeypatch.setattr(inplace, "use_lists", lambda device: True)
    if request.param == "traced":
        monkeypatch.setattr(base, "tracing", lambda: True)
    return request.param


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name,desc,kwargs", CASES, ids=[f"{n}-{d}" for n, d, _ in CASES])
def test_matches_torch(name, desc, kwargs, dtype, path):
    skip_if_closure_required(name)
    differentiable = kwargs.get("differentiable", False)
    if dtype.is_complex and differentiable:
        pytest.skip("torch does not test complex with differentiable=True (pytorch#116490)")
    if dtype.is_complex and not INFOS[name].supports_complex:
        pytest.skip(f"{name} refuses complex params, as torch's (test_errors checks torch's error)")
    sparse = INFOS[name].only_supports_sparse_grads  # then the gradients hold about half the entries
    base = supported(name, make_params(dtype))  # (Muon's: the matrices)
    ref_params = trainable(base, differentiable)
    our_params = trainable(base, differentiable)
    ref = torch_cls(name)(ref_params, **kwargs)
    ours = fo_cls(name)(our_params, **kwargs)
    assert_same(ours.state_dict(), ref.state_dict(), "state_dict at construction")

    tx = factory(name)(**functional_kwargs(kwargs))
    f_params = {str(i): p.clone() for i, p in enumerate(base)}
    f_state = tx.init(f_params)
    # The functional path is compared with torch's default step (differentiable=False):
    # its schedule is the default step's, in double precision. torch's differentiable
    # step reads the schedule from the step tensor in its dtype (float32: Adam's
    # 1 - beta2**t, which cancels, puts 1e-5 relative error in a float64 step), which
    # the class's differentiable step matches bit for bit above.
    plain_params, plain = ref_params, ref
    if differentiable:
        plain_params = trainable(base, False)
        plain = torch_cls(name)(plain_params, **{**kwargs, "differentiable": False})

    gen = torch.Generator().manual_seed(1)
    for step in range(STEPS):
        grads = [torch.randn(p.shape, generator=gen, dtype=dtype) for p in base]
        if sparse:
            grads = [(g * (torch.rand(g.shape, generator=gen) < 0.5)).to_sparse() for g in grads]
        grads = [None if i in NO_GRAD.get(step, ()) else g for i, g in enumerate(grads)]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # .grad of a non-leaf (differentiable)
            for ps in {id(ps): ps for ps in (ref_params, our_params, plain_params)}.values():
                for p, g in zip(ps, grads):
                    p.grad = None if g is None else g.clone()
        if kwargs.get("fused") and dtype.is_complex:
            with pytest.raises(RuntimeError):
                ref.step()
            with pytest.raises(RuntimeError):
                ours.step()
            return
        ref.step()
        ours.step()
        assert_same(our_params, ref_params, f"params after step {step}")
        assert_same(ours.state_dict(), ref.state_dict(), f"state_dict after step {step}")
        if plain is not ref:
            plain.step()

        updates, f_state = tx.update({str(i): g for i, g in enumerate(grads)}, f_state, f_params)
        f_params = fo.apply_updates(f_params, updates)
        assert_same(list(f_params.values()), plain_params, f"functional params after step {step}")
        # (SGD's with a dampening counts its steps around the algorithm's state)
        inner = f_state.inner_state if isinstance(f_state, fo.ScheduledState) else f_state
        for i, p in enumerate(plain_params):
            for key, value in plain.state.get(p, {}).items():
                if key in ours._transform.counters:  # init gives float64 params float64 counters
                    value = torch.as_tensor(value)  # (SparseAdam's a Python int, as torch's)
                    value = value.to(torch.promote_types(value.dtype, real_dtype(p)))
                assert_same(getattr(inner, key)[str(i)], value, f"functional {key}[{i}]")


@pytest.mark.parametrize("name", ALGORITHMS)
def test_large_tensors_match_torch(name):
    """Real sizes: a param split into several blocks, a non-contiguous large one, a
    large complex one, and one of a single block whose gradients are transposed views,
    for the adapter and the functional path."""
    skip_unless_steps_on_gradients(name)
    gen = torch.Generator().manual_seed(0)
    base = [
        torch.randn(3 * inplace.SEGMENT + 5, generator=gen),
        torch.randn(300, 400, 2, generator=gen)[..., 0],
        torch.randn(2 * inplace.SMALL, dtype=torch.complex64, generator=gen),
        torch.randn(130, 140, generator=gen),
    ]

    def grad(p):
        if p.shape == (130, 140):
            return torch.randn(140, 130, generator=gen).t()
        return torch.randn(p.shape, generator=gen, dtype=p.dtype)

    base = supported(name, base)  # (Adafactor's: the real ones; Muon's: the matrices)
    grad_steps = [[grad(p) for p in base] for _ in range(3)]
    assert_matches_torch(name, weight_decay(name, 0.1), base, grad_steps)


@pytest.mark.parametrize("dtype", [torch.float32, torch.complex64], ids=str)
@pytest.mark.parametrize("name", ALGORITHMS)
def test_small_params_in_chunks_match_torch(name, dtype):
    """The adapter's chunks of small params (`inplace.Chunks`): a group of one trailing
    shape large enough to step by itself (some of its params and gradients transposed
    views), a few params of other trailing shapes that join the 1-d chunk as flat views,
    channels-last and transposed ones that cannot, 1-d and 0-d params, enough 1-d
    params to fill a chunk (`inplace.CHUNK`) and start another, and groups that fill
    one when they join the 1-d chunk."""
    skip_unless_steps_on_gradients(name)
    skip_unsupported(name, complex=dtype.is_complex)
    gen = torch.Generator().manual_seed(0)

    def rand(*shape):
        return torch.randn(shape, generator=gen, dtype=dtype)

    group = [rand(3, 4) if i % 3 else rand(4, 3).t() for i in range(inplace.FEW + 2)]
    few = [rand(2, 5) for _ in range(3)]
    odd = [rand(2, 3, 2, 2).to(memory_format=torch.channels_last), rand(5, 2).t()]
    full = [rand(inplace.TINY) for _ in range(inplace.CHUNK // inplace.TINY + 1)]
    n = inplace.CHUNK // inplace.TINY - 2  # a group short of a chunk, fewer than FEW
    joining = [rand(2**i, inplace.TINY >> i) for i in range(3) for _ in range(n)]
    base = [*group, *few, *odd, rand(7), rand(), rand(1), *full, *joining]
    assert not all(p.is_contiguous() for p in group) and not any(p.is_contiguous() for p in odd)
    base = supported(name, base)  # (Muon's: the matrices)

    def grad(i, p):  # every other matrix's gradient a transposed view
        return rand(*reversed(p.shape)).mT if p.ndim == 2 and i % 2 == 0 else rand(*p.shape)

    grad_steps = [[grad(i, p) for i, p in enumerate(base)] for _ in range(3)]
    kwargs = weight_decay(name, 0.1)
    # torch's default step decays a complex gradient in complex arithmetic, which rounds
    # wd * p before adding it; funcopt decays the real view in one fused multiply-add, as
    # torch's foreach step does. Where g + wd * p cancels, a step that divides it by its
    # own size plus eps (RMSprop's first: g / (0.1 |g| + eps)) makes that ulp 6e-5 in one
    # element; tests/test_rmsprop.py checks such steps against torch's foreach bit for bit.
    tol = {"rtol": 1e-4, "atol": 1e-4} if dtype.is_complex and kwargs else {}
    assert_matches_torch(name, kwargs, base, grad_steps, adapter_tol=tol, **tol)
