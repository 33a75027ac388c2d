"""Property-based parity: random valid hyperparameters, shapes and step counts beyond
torch's own table; funcopt.X and funcopt.x must match torch.optim.X."""

from __future__ import annotations

import torch
from helpers import assert_matches_torch
from hypothesis import HealthCheck, given, settings
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
    name = draw(st.sampled_from(sorted(HYPERPARAMETERS)))
    kwargs = draw(HYPERPARAMETERS[name])
    kwargs["maximize"] = draw(st.booleans())
    shapes = draw(st.lists(st.lists(st.integers(1, 5), max_size=3).map(tuple), min_size=1, max_size=4))
    dtype = draw(st.sampled_from([torch.float32, torch.float64]))
    steps = draw(st.integers(1, 6))
    seed = draw(st.integers(0, 2**16))
    return name, kwargs, shapes, dtype, steps, seed


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_random_configurations_match_torch(case):
    name, kwargs, shapes, dtype, steps, seed = case
    gen = torch.Generator().manual_seed(seed)
    base = [torch.randn(s, generator=gen, dtype=dtype) for s in shapes]
    grad_steps = [[torch.randn(s, generator=gen, dtype=dtype) for s in shapes] for _ in range(steps)]
    assert_matches_torch(name, kwargs, base, grad_steps)
