"""Property-based parity: random valid hyperparameters, shapes and step counts beyond
torch's own table; funcopt.X and funcopt.x must match torch.optim.X.

A configuration hypothesis once found, kept as an explicit example: Adamax, float32,
lr=0.34375, betas=(0.25, 0.0), eps=1.19e-7, weight_decay=0.125, two steps."""

from __future__ import annotations

import copy
import inspect

import torch
from helpers import (
    ALGORITHMS,
    HYPER,
    IMPLEMENTATION_FLAGS,
    as_tensors,
    assert_matches_torch,
    assert_same,
    fo_cls,
    kwargs_of,
    matrices_only,
    steps_on_dense_gradients,
    torch_cls,
)
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from funcopt._src.engine import inplace


def near(value: float) -> st.SearchStrategy[float]:
    """Values around a test value of `HYPER`: one below 1 (a beta, a decay rate, an lr,
    eps) from a hundredth of it to halfway to 1; another from 3/4 to 5/4 of it."""
    if 0 < value < 1:
        return st.floats(value / 100, (1 + value) / 2)
    low, high = sorted((0.75 * value, 1.25 * value))
    return st.floats(low, high)


def _options(name: str) -> list[str]:
    """The class's boolean options (amsgrad, nesterov, centered, ...), not torch's switches."""
    parameters = inspect.signature(fo_cls(name)).parameters.values()
    return [p.name for p in parameters if isinstance(p.default, bool) and p.name not in IMPLEMENTATION_FLAGS]


def hyperparameters(name: str) -> st.SearchStrategy[dict]:
    """Random valid hyperparameters of `name`: each test value of `HYPER` drawn around it
    (a pair element by element), and each boolean option either way; a combination the
    class refuses (SGD's Nesterov without momentum) is rejected."""
    fields = {
        key: st.tuples(*map(near, value)) if isinstance(value, tuple) else near(value)
        for key, value in kwargs_of(HYPER[name]).items()
    }
    fields.update({option: st.booleans() for option in _options(name)})
    return st.fixed_dictionaries(fields).filter(lambda kw: _valid(name, kw))


def _valid(name: str, kwargs: dict) -> bool:
    try:
        torch_cls(name)([torch.zeros(2, 2, requires_grad=True)], **kwargs)
    except ValueError:
        return False
    return True


# dense gradients without an objective (not LBFGS, not SparseAdam), params of any shape (not Muon)
PROPERTY_ALGORITHMS = [
    name for name in ALGORITHMS if steps_on_dense_gradients(name) and not matrices_only(name)
]
HYPERPARAMETERS = {name: hyperparameters(name) for name in PROPERTY_ALGORITHMS}


@st.composite
def cases(draw):
    name = draw(st.sampled_from(PROPERTY_ALGORITHMS))
    kwargs = draw(HYPERPARAMETERS[name])
    kwargs["maximize"] = draw(st.booleans())
    shapes = draw(st.lists(st.lists(st.integers(1, 5), max_size=3).map(tuple), min_size=1, max_size=4))
    dtype = draw(st.sampled_from([torch.float32, torch.float64]))
    steps = draw(st.integers(1, 6))
    seed = draw(st.integers(0, 2**16))
    return name, kwargs, shapes, dtype, steps, seed


# derandomize: the same examples on every run, so CI is deterministic
@settings(max_examples=150, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
@example(
    (
        "Adamax",
        {
            "lr": 0.34375,
            "betas": (0.25, 0.0),
            "eps": 1.192092896e-07,
            "weight_decay": 0.125,
            "maximize": False,
        },
        [(), (2,), (2, 3, 5), (5,)],
        torch.float32,
        2,
        6939,
    )
)
def test_random_configurations_match_torch(case):
    name, kwargs, shapes, dtype, steps, seed = case
    gen = torch.Generator().manual_seed(seed)
    base = [torch.randn(s, generator=gen, dtype=dtype) for s in shapes]
    grad_steps = [[torch.randn(s, generator=gen, dtype=dtype) for s in shapes] for _ in range(steps)]
    # The adapter updates params as torch does (fused addcdiv, one rounding); the
    # functional path rounds the update, then params + update. Where large steps nearly
    # cancel (say Adamax with beta2=0, whose |g| + eps can be tiny), that second rounding
    # shows beyond assert_close's float32 default; torch's own table is checked at default
    # tolerance in test_torch_parity.py. Unseeded runs of 40,000 examples found NAdam
    # cases beyond even this tolerance (up to 3.4e-5 relative), all with beta2=0 and a
    # weight decay that nearly cancels the gradient, so that 1 / (|g| + eps) amplifies
    # round-off. In float32, torch's own step strays from its float64 step too (by 3e-6 to
    # 1e-4 relative), and which of the two lies closer varies. In float64, the difference
    # is funcopt's float64 counters (torch's are float32 unless that is the default
    # dtype); with float64 as the default dtype the two agree to 1e-9.
    assert_matches_torch(name, kwargs, base, grad_steps, rtol=1e-5, atol=1e-5)


# Sizes on both sides of the CPU step's thresholds: tiny params join chunks, large ones
# run in segments (see inplace.py).
SIZES = [0, 1, 7, inplace.TINY - 1, inplace.TINY, inplace.TINY + 1, 70_000, inplace.SEGMENT + 4]


def layout(size, kind, dtype, gen):
    """A param of `size` elements, contiguous, transposed (where 4 divides `size`, else
    contiguous) or strided."""
    if kind == "transposed" and size % 4 == 0:
        return torch.randn(4, size // 4, generator=gen, dtype=dtype).t()
    if kind == "strided":
        return torch.randn(size, 2, generator=gen, dtype=dtype)[:, 0]
    return torch.randn(size, generator=gen, dtype=dtype)


def tensor_hyperparameters(kwargs, dtype):
    """`kwargs` with lr, betas and weight_decay as 0-d tensors of `dtype` (if not None).
    float32 tensors for float64 params are not bit for bit: torch's step then rounds
    1 - beta2 and the like to float32 (for a beta below 0.5), where funcopt's keeps them
    in double."""
    return kwargs if dtype is None else as_tensors(kwargs, dtype, ("lr", "betas", "weight_decay"))


def _takes_foreach(name: str, groups: list[dict]) -> bool:
    """Whether torch's class steps `groups` with foreach=True: Adam's refuses a tensor lr
    or betas there unless capturable (in its constructor, or at the step for a group's)."""
    params = [torch.zeros(2, requires_grad=True) for _ in groups]
    try:
        opt = torch_cls(name)([{"params": [p], **kw} for p, kw in zip(params, groups)], foreach=True)
        for p in params:
            p.grad = torch.zeros_like(p)
        opt.step()
    except (ValueError, RuntimeError):
        return False
    return True


@st.composite
def adapter_cases(draw):
    name = draw(st.sampled_from(PROPERTY_ALGORITHMS))
    groups = draw(st.lists(HYPERPARAMETERS[name], min_size=1, max_size=3))
    params = draw(
        st.lists(
            st.tuples(
                st.sampled_from(SIZES),
                st.sampled_from(["contiguous", "transposed", "strided"]),
                st.sampled_from([torch.float32, torch.float64]),
                st.integers(0, len(groups) - 1),
            ),
            min_size=1,
            max_size=6,
        )
    )
    # a group's lr, betas and weight decay as Python numbers or as 0-d tensors, of a
    # dtype at least as wide as its params' (see tensor_hyperparameters)
    for i, kw in enumerate(groups):
        dtype = draw(st.sampled_from([None, torch.float32, torch.float64]))
        for _, _, param_dtype, group in params:
            if dtype is not None and group == i:
                dtype = torch.promote_types(dtype, param_dtype)
        groups[i] = tensor_hyperparameters(kw, dtype)
    steps = draw(st.integers(2, 5))
    # per step and param: a contiguous gradient, one laid out as its param, a strided one,
    # or None
    kinds = st.sampled_from(["contiguous", "like", "strided", None])
    grads = draw(st.lists(st.lists(kinds, min_size=6, max_size=6),
                          min_size=steps, max_size=steps))  # fmt: skip
    reload_after = draw(st.integers(0, steps - 1))
    foreach = draw(st.sampled_from([None, False, True] if _takes_foreach(name, groups) else [None, False]))
    return name, groups, params, grads, reload_after, foreach, draw(st.integers(0, 2**16))


@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(adapter_cases())
@example(  # gradients of other strides than their params, in segments and in chunks
    (
        "Adamax",
        [{"lr": 0.01, "weight_decay": 0.1}, {"lr": 0.1, "betas": (0.5, 0.9)}],
        [
            (inplace.SEGMENT + 4, "contiguous", torch.float32, 0),
            (64, "transposed", torch.float32, 1),
            (7, "contiguous", torch.float64, 0),
        ],
        [["strided", "contiguous", "strided"], ["like", None, "contiguous"]],
        0,
        None,
        0,
    )
)
def test_adapter_layouts_groups_and_reloads_match_torch_bit_for_bit(case):
    """The torch classes, on params of every size class, layout and dtype, in several
    groups (hyperparameters as numbers or tensors), with gradients of any layout or None,
    and a state_dict reload midway, give torch's default step bit for bit (foreach or
    not)."""
    name, groups, specs, grads, reload_after, foreach, seed = case
    gen = torch.Generator().manual_seed(seed)
    base = [layout(size, kind, dtype, gen) for size, kind, dtype, _ in specs]

    def build(cls, params, **flags):
        return cls(
            [
                {"params": [p for p, s in zip(params, specs) if s[3] == i], **kw}
                for i, kw in enumerate(groups)
            ],
            **flags,
        )

    ours, theirs = ([b.clone().requires_grad_() for b in base] for _ in range(2))
    opt, ref = build(fo_cls(name), ours, foreach=foreach), build(torch_cls(name), theirs, foreach=False)
    for step, kinds in enumerate(grads):
        for p, q, kind in zip(ours, theirs, kinds):
            g = None if kind is None else torch.randn(p.shape, generator=gen, dtype=p.dtype)
            if kind == "like":
                g = torch.empty_like(p).copy_(g)
            elif kind == "strided":
                g = torch.stack([g, g], -1)[..., 0]
            p.grad, q.grad = g, None if g is None else g.clone()
        opt.step()
        ref.step()
        if step == reload_after:  # loading casts state as torch does: reload both
            saved, saved_ref = copy.deepcopy(opt.state_dict()), copy.deepcopy(ref.state_dict())
            opt, ref = (
                build(fo_cls(name), ours, foreach=foreach),
                build(torch_cls(name), theirs, foreach=False),
            )
            opt.load_state_dict(saved)
            ref.load_state_dict(saved_ref)
    assert_same(ours, theirs, rtol=0, atol=0)
    assert_same(opt.state_dict()["state"], ref.state_dict()["state"], rtol=0, atol=0)
