"""Property-based parity: random valid hyperparameters, shapes and step counts beyond
torch's own table; funcopt.X and funcopt.x must match torch.optim.X.

A configuration hypothesis once found, kept as an explicit example: Adamax, float32,
lr=0.34375, betas=(0.25, 0.0), eps=1.19e-7, weight_decay=0.125, two steps."""

from __future__ import annotations

import torch
from helpers import ALGORITHMS, assert_matches_torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

unit = st.floats(0.0, 0.99)
positive = st.floats(1e-4, 0.5)
HYPERPARAMETERS = {
    "Adadelta": st.fixed_dictionaries(
        {"lr": positive, "rho": unit, "eps": st.floats(1e-8, 1e-3), "weight_decay": st.floats(0.0, 0.3)}
    ),
    "Adagrad": st.fixed_dictionaries(
        {
            "lr": positive,
            "lr_decay": st.floats(0.0, 0.5),
            "weight_decay": st.floats(0.0, 0.3),
            "initial_accumulator_value": st.floats(0.0, 1.0),
            "eps": st.floats(1e-10, 1e-3),
        }
    ),
    "Adamax": st.fixed_dictionaries(
        {
            "lr": positive,
            "betas": st.tuples(unit, unit),
            "eps": st.floats(1e-8, 1e-3),
            "weight_decay": st.floats(0.0, 0.3),
        }
    ),
    "NAdam": st.fixed_dictionaries(
        {
            "lr": positive,
            "betas": st.tuples(unit, unit),
            "eps": st.floats(1e-8, 1e-3),
            "weight_decay": st.floats(0.0, 0.3),
            "momentum_decay": st.floats(0.0, 0.05),
            "decoupled_weight_decay": st.booleans(),
        }
    ),
}


@st.composite
def cases(draw):
    name = draw(st.sampled_from(ALGORITHMS))  # one without ranges fails, never skipped
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
    # tolerance in test_torch_parity.py.
    assert_matches_torch(name, kwargs, base, grad_steps, rtol=1e-5, atol=1e-5)
