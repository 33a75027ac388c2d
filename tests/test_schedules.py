"""Schedules against optax's (in float64), for Python int counts, tensor counts and tensor
hyperparameters; one compiled graph for a whole run; vmap and grad over hyperparameters."""

from __future__ import annotations

import math
import pickle
from typing import Any

import numpy as np
import pytest
import torch
import torch._dynamo.testing
from helpers import set_default_dtype

import funcopt as fo

optax = pytest.importorskip("optax")
jax = pytest.importorskip("jax")
jnp = jax.numpy

# the schedules' float hyperparameters (the rest are step counts and flags: structure)
HYPER = {
    "value", "init_value", "end_value", "peak_value", "power", "decay_rate", "alpha", "exponent",
    "div_factor", "final_div_factor",
}  # fmt: skip

# (schedule name, its arguments, the last count of interest); join_schedules takes
# {"schedules": [(name, kwargs), ...], "boundaries": [...]}
CASES: list[tuple[str, dict[str, Any], int]] = [
    ("constant_schedule", dict(value=0.3), 5),
    ("constant_schedule", dict(value=5), 5),
    ("linear_schedule", dict(init_value=1.0, end_value=0.01, transition_steps=100), 100),
    ("linear_schedule", dict(init_value=0.1, end_value=1.0, transition_steps=10, transition_begin=5), 15),
    ("linear_schedule", dict(init_value=0.1, end_value=1.0, transition_steps=0), 5),
    ("linear_schedule", dict(init_value=0.1, end_value=1.0, transition_steps=-3), 5),
    ("linear_schedule", dict(init_value=0.1, end_value=1.0, transition_steps=7, transition_begin=-4), 10),
    ("polynomial_schedule", dict(init_value=1.0, end_value=0.01, power=2, transition_steps=100), 100),
    ("polynomial_schedule", dict(init_value=0.5, end_value=2.0, power=0.5, transition_steps=9, transition_begin=3), 12),
    ("polynomial_schedule", dict(init_value=1.0, end_value=0.0, power=3.0, transition_steps=0), 3),
    ("exponential_decay", dict(init_value=1.0, transition_steps=10, decay_rate=0.5), 60),
    ("exponential_decay", dict(init_value=1.0, transition_steps=10, decay_rate=0.5, staircase=True), 60),
    ("exponential_decay", dict(init_value=2.0, transition_steps=7, decay_rate=0.8, transition_begin=5, end_value=0.9), 60),
    ("exponential_decay", dict(init_value=2.0, transition_steps=7, decay_rate=0.8, transition_begin=5, staircase=True), 40),
    ("exponential_decay", dict(init_value=0.1, transition_steps=5, decay_rate=2.0, end_value=1.5), 40),
    ("exponential_decay", dict(init_value=0.1, transition_steps=5, decay_rate=2.0), 40),
    ("exponential_decay", dict(init_value=0.1, transition_steps=5, decay_rate=0.0, end_value=0.5), 10),
    ("exponential_decay", dict(init_value=0.1, transition_steps=0, decay_rate=0.5), 10),
    ("exponential_decay", dict(init_value=0.1, transition_steps=4, decay_rate=1.0, end_value=0.05), 10),
    ("exponential_decay", dict(init_value=1.0, transition_steps=4, decay_rate=0.5, transition_begin=-3), 20),
    ("exponential_decay", dict(init_value=1.0, transition_steps=2, decay_rate=-0.5, staircase=True), 10),
    ("exponential_decay", dict(init_value=1.0, transition_steps=2, decay_rate=-0.5), 10),  # NaN between
    ("cosine_decay_schedule", dict(init_value=1.0, decay_steps=100), 100),
    ("cosine_decay_schedule", dict(init_value=0.5, decay_steps=30, alpha=0.1, exponent=2.0), 30),
    ("cosine_decay_schedule", dict(init_value=0.5, decay_steps=30, alpha=0.2, exponent=0.5), 30),
    ("cosine_decay_schedule", dict(init_value=2.0, decay_steps=1), 3),
    ("warmup_cosine_decay_schedule", dict(init_value=0.0, peak_value=1.0, warmup_steps=10, decay_steps=100), 100),
    ("warmup_cosine_decay_schedule", dict(init_value=0.1, peak_value=0.8, warmup_steps=5, decay_steps=40, end_value=0.05, exponent=2.0), 40),
    ("warmup_cosine_decay_schedule", dict(init_value=0.1, peak_value=0.0, warmup_steps=5, decay_steps=20, end_value=0.3), 20),
    ("warmup_cosine_decay_schedule", dict(init_value=0.1, peak_value=0.5, warmup_steps=0, decay_steps=20, end_value=0.1), 20),
    ("warmup_exponential_decay_schedule", dict(init_value=0.0, peak_value=1.0, warmup_steps=10, transition_steps=20, decay_rate=0.5), 80),
    ("warmup_exponential_decay_schedule", dict(init_value=0.1, peak_value=1.0, warmup_steps=4, transition_steps=5, decay_rate=0.5, transition_begin=3, staircase=True, end_value=0.2), 40),
    ("warmup_exponential_decay_schedule", dict(init_value=0.1, peak_value=0.2, warmup_steps=4, transition_steps=5, decay_rate=2.0, end_value=1.0), 40),
    ("piecewise_constant_schedule", dict(init_value=1.0, boundaries_and_scales={100: 0.1, 200: 0.01}), 250),
    ("piecewise_constant_schedule", dict(init_value=0.5, boundaries_and_scales={20: 0.5, 5: 2.0, 10: 0.0, 30: 3.0}), 35),
    ("piecewise_constant_schedule", dict(init_value=0.5, boundaries_and_scales={0: 2.0, -2: 0.5}), 3),
    ("piecewise_constant_schedule", dict(init_value=0.5, boundaries_and_scales=None), 3),
    ("piecewise_constant_schedule", dict(init_value=0.5, boundaries_and_scales={}), 3),
    ("cosine_onecycle_schedule", dict(transition_steps=100, peak_value=1.0), 100),
    ("cosine_onecycle_schedule", dict(transition_steps=7, peak_value=0.5, pct_start=0.25, div_factor=10.0, final_div_factor=100.0), 10),
    ("cosine_onecycle_schedule", dict(transition_steps=10, peak_value=0.5, pct_start=1.0), 12),
    ("cosine_onecycle_schedule", dict(transition_steps=10, peak_value=0.5, pct_start=0.0), 12),
    ("linear_onecycle_schedule", dict(transition_steps=100, peak_value=1.0), 100),
    ("linear_onecycle_schedule", dict(transition_steps=9, peak_value=0.5, pct_start=0.2, pct_final=0.7, div_factor=5.0, final_div_factor=50.0), 12),
    ("linear_onecycle_schedule", dict(transition_steps=10, peak_value=0.5, pct_start=0.5, pct_final=0.5), 12),
    ("linear_onecycle_schedule", dict(transition_steps=3, peak_value=0.5), 5),
    ("sgdr_schedule", dict(cosine_kwargs=[
        dict(init_value=0.0, peak_value=1.0, warmup_steps=5, decay_steps=20),
        dict(init_value=0.5, peak_value=0.8, warmup_steps=0, decay_steps=30, end_value=0.1, exponent=2.0),
        dict(init_value=0.1, peak_value=0.3, warmup_steps=3, decay_steps=10, end_value=0.01),
    ]), 65),
    ("sgdr_schedule", dict(cosine_kwargs=[dict(init_value=0.0, peak_value=1.0, warmup_steps=5, decay_steps=20)]), 25),
    ("join_schedules", dict(schedules=[
        ("constant_schedule", dict(value=1.0)),
        ("linear_schedule", dict(init_value=1.0, end_value=0.1, transition_steps=10)),
        ("cosine_decay_schedule", dict(init_value=0.1, decay_steps=20, alpha=0.5)),
    ], boundaries=[10, 30]), 55),
    ("join_schedules", dict(schedules=[("exponential_decay", dict(init_value=1.0, transition_steps=3, decay_rate=0.9))], boundaries=[]), 10),
]  # fmt: skip
IDS = [f"{i}-{name}" for i, (name, _, _) in enumerate(CASES)]


def convert(kwargs: dict[str, Any], fn) -> dict[str, Any]:
    """`kwargs` with each hyperparameter (in scales and cycles too) replaced by fn(name, value)."""
    out = {}
    for key, value in kwargs.items():
        if key in HYPER:
            out[key] = fn(key, value)
        elif key == "boundaries_and_scales" and value is not None:
            out[key] = {b: fn(f"scale{b}", s) for b, s in value.items()}
        elif key == "cosine_kwargs":
            out[key] = [convert(cycle, fn) for cycle in value]
        else:
            out[key] = value
    return out


def build(lib, name: str, kwargs: dict[str, Any], fn=lambda key, value: value):
    if name == "join_schedules":
        parts = [build(lib, n, k, fn) for n, k in kwargs["schedules"]]
        return lib.join_schedules(parts, kwargs["boundaries"])
    return getattr(lib, name)(**convert(kwargs, fn))


def counts_of(horizon: int) -> list[int]:
    return [*range(-3, horizon + 4), 10**6, 10**9 + 7]


_OPTAX: dict[str, np.ndarray] = {}


def optax_values(name: str, kwargs: dict[str, Any], counts: list[int]) -> np.ndarray:
    """optax's values, computed in float64 (once per case: its vmap compiles)."""
    key = repr((name, kwargs, counts))
    if key not in _OPTAX:
        _OPTAX[key] = _optax_values(name, kwargs, counts)
    return _OPTAX[key]


def _optax_values(name: str, kwargs: dict[str, Any], counts: list[int]) -> np.ndarray:
    with jax.enable_x64(True):
        schedule = build(optax, name, kwargs)
        values = jax.vmap(lambda c: jnp.asarray(schedule(c), jnp.float64))(jnp.asarray(counts, jnp.int64))
        return np.broadcast_to(np.asarray(values), (len(counts),))


def tensors(dtype: torch.dtype):
    return lambda key, value: torch.tensor(value, dtype=dtype)


@pytest.mark.parametrize(("name", "kwargs", "horizon"), CASES, ids=IDS)
def test_python_counts_match_optax_in_float64(name, kwargs, horizon):
    counts = counts_of(horizon)
    schedule = build(fo, name, kwargs)
    values = [schedule(c) for c in counts]
    assert all(type(v) is float for v in values)
    np.testing.assert_allclose(values, optax_values(name, kwargs, counts), rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize(("name", "kwargs", "horizon"), CASES, ids=IDS)
def test_tensor_counts_match_optax(name, kwargs, horizon):
    counts = counts_of(horizon)
    expected = optax_values(name, kwargs, counts)
    schedule = build(fo, name, kwargs)
    # a tensor of counts gives their values, in torch's default dtype (float32)
    for count_dtype in (torch.int64, torch.float64):
        values = schedule(torch.tensor(counts, dtype=count_dtype))
        assert values.dtype == torch.float32 and values.shape == (len(counts),)
        # computed in float64, rounded once to float32
        np.testing.assert_allclose(values.numpy(), expected.astype(np.float32), rtol=1e-6, atol=1e-30)
    # one 0-d count at a time, int32 and float32
    for i in range(0, len(counts), 7):
        for count_dtype in (torch.int32, torch.float32):
            value = schedule(torch.tensor(counts[i], dtype=count_dtype))
            assert value.dtype == torch.float32 and value.shape == ()
            np.testing.assert_allclose(value.item(), expected[i], rtol=1e-6, atol=1e-30)
    # float64 tensor hyperparameters give float64 values, as exact as the Python path
    schedule64 = build(fo, name, kwargs, tensors(torch.float64))
    values = schedule64(torch.tensor(counts))
    assert values.dtype == torch.float64
    np.testing.assert_allclose(values.numpy(), expected, rtol=1e-12, atol=1e-15)
    value = schedule64(counts[5])  # a Python count with tensor hyperparameters: a tensor
    assert isinstance(value, torch.Tensor) and value.dtype == torch.float64 and value.shape == ()
    np.testing.assert_allclose(value.item(), expected[5], rtol=1e-12, atol=1e-15)


def test_result_dtype():
    s = fo.warmup_cosine_decay_schedule
    f32, f64 = torch.tensor(1.0), torch.tensor(1.0, dtype=torch.float64)
    # the count's dtype never decides
    assert s(0.0, 1.0, 5, 10)(torch.tensor(3.0, dtype=torch.float64)).dtype == torch.float32
    assert s(0.0, f32, 5, 10)(torch.tensor(3, dtype=torch.float64)).dtype == torch.float32
    # tensor hyperparameters do, promoted together
    assert s(0.0, f64, 5, 10)(torch.tensor(3.0)).dtype == torch.float64
    assert s(f32, f64, 5, 10)(torch.tensor(3)).dtype == torch.float64
    assert s(0.0, f32.bfloat16(), 5, 10)(torch.tensor(3)).dtype == torch.bfloat16
    assert s(0.0, f32, 5, 10)(3).dtype == torch.float32
    with set_default_dtype(torch.float64):
        assert s(0.0, 1.0, 5, 10)(torch.tensor(3)).dtype == torch.float64
    # a float32 value is the float64 value rounded once
    count = torch.tensor(7)
    assert s(0.0, f32, 5, 10)(count) == torch.tensor(s(0.0, 1.0, 5, 10)(7), dtype=torch.float32)


# one case of each schedule, for the compiled, batched and differentiated tests
ONE_OF_EACH = [CASES[IDS.index(i)] for i in (
    "0-constant_schedule", "3-linear_schedule", "8-polynomial_schedule", "12-exponential_decay",
    "13-exponential_decay", "14-exponential_decay", "23-cosine_decay_schedule",
    "27-warmup_cosine_decay_schedule", "31-warmup_exponential_decay_schedule",
    "34-piecewise_constant_schedule", "39-cosine_onecycle_schedule", "43-linear_onecycle_schedule",
    "46-sgdr_schedule", "48-join_schedules",
)]  # fmt: skip
ONE_IDS = [name for name, _, _ in ONE_OF_EACH]


@pytest.mark.parametrize(("name", "kwargs", "horizon"), ONE_OF_EACH, ids=ONE_IDS)
def test_one_compiled_graph_for_every_count(name, kwargs, horizon):
    schedule = build(fo, name, kwargs)
    tensor_hypers = build(fo, name, kwargs, tensors(torch.float32))
    for count_dtype in (torch.int64, torch.float32):
        torch._dynamo.reset()
        counter = torch._dynamo.testing.CompileCounter()

        @torch.compile(backend=counter, fullgraph=True)
        def step(count):
            return schedule(count) * 2.0, tensor_hypers(count + 1)

        for c in range(horizon + 3):
            value, other = step(torch.tensor(c, dtype=count_dtype))
            assert value.item() == pytest.approx(2 * schedule(c), rel=1e-6, abs=1e-30)
            assert other.item() == pytest.approx(schedule(c + 1), rel=1e-6, abs=1e-30)
        assert counter.frame_count == 1


@pytest.mark.slow
def test_compiled_with_inductor():
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    schedule = fo.warmup_cosine_decay_schedule(0.0, 1.0, warmup_steps=5, decay_steps=20, end_value=0.1)
    step = torch.compile(
        lambda count, peak: fo.warmup_cosine_decay_schedule(0.0, peak, 5, 20, 0.1)(count), fullgraph=True
    )
    peak = torch.tensor(1.0)
    for c in range(25):
        assert step(torch.tensor(c), peak).item() == pytest.approx(schedule(c), rel=1e-6, abs=1e-30)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1


def sweep_values(name: str, kwargs: dict[str, Any]) -> dict[str, list[float]]:
    """Three values of each top-level hyperparameter, the given one first."""
    sweeps = {}
    for key, value in kwargs.items():
        if key in HYPER:
            sweeps[key] = [value, value * 0.9 + 0.05, value * 1.1 + 0.1]
    return sweeps


@pytest.mark.parametrize(("name", "kwargs", "horizon"), ONE_OF_EACH[:-2], ids=ONE_IDS[:-2])
def test_vmap_over_hyperparameters_equals_a_loop(name, kwargs, horizon):
    counts = torch.tensor(counts_of(horizon)[::3])
    for key, values in sweep_values(name, kwargs).items():

        def values_at(v, key=key):
            return build(fo, name, {**kwargs, key: v})(counts)

        batched = torch.func.vmap(values_at)(torch.tensor(values, dtype=torch.float64))
        assert batched.dtype == torch.float64 and batched.shape == (3, len(counts))
        for row, v in zip(batched, values):
            expected = [build(fo, name, {**kwargs, key: v})(int(c)) for c in counts]
            np.testing.assert_allclose(row.numpy(), expected, rtol=1e-12, atol=1e-15, err_msg=key)


def test_vmap_sweep_of_peak_learning_rates():
    peaks = torch.tensor([1e-3, 3e-3, 1e-2])
    lrs = torch.func.vmap(lambda peak: fo.warmup_cosine_decay_schedule(0.0, peak, 10, 100)(torch.tensor(30)))(
        peaks
    )
    expected = [fo.warmup_cosine_decay_schedule(0.0, p, 10, 100)(30) for p in peaks.tolist()]
    np.testing.assert_allclose(lrs.numpy(), expected, rtol=1e-6)
    # and over counts and scales of piecewise_constant_schedule and sgdr cycles
    scales = torch.tensor([0.1, 0.5])
    vals = torch.func.vmap(lambda s: fo.piecewise_constant_schedule(2.0, {3: s, 6: s})(torch.arange(8)))(
        scales
    )
    for row, s in zip(vals, scales.tolist()):
        np.testing.assert_allclose(
            row.numpy(), [fo.piecewise_constant_schedule(2.0, {3: s, 6: s})(c) for c in range(8)], rtol=1e-6
        )
    joined = lambda p: fo.join_schedules([fo.constant_schedule(p), fo.linear_schedule(p, 0.0, 4)], [2])
    vals = torch.func.vmap(lambda p: joined(p)(torch.arange(8)))(peaks)
    for row, p in zip(vals, peaks.tolist()):
        np.testing.assert_allclose(row.numpy(), [joined(p)(c) for c in range(8)], rtol=1e-6)


@pytest.mark.parametrize(("name", "kwargs", "horizon"), ONE_OF_EACH[:-1], ids=ONE_IDS[:-1])
def test_grad_matches_finite_differences(name, kwargs, horizon):
    h = 1e-6
    for key, (value, *_) in sweep_values(name, kwargs).items():
        for count in sorted({1, horizon // 3 + 1, horizon // 2 + 1, horizon - 1, horizon + 2}):
            grad = torch.func.grad(
                lambda v, key=key, count=count: build(fo, name, {**kwargs, key: v})(torch.tensor(count))
            )(torch.tensor(value, dtype=torch.float64))
            up = build(fo, name, {**kwargs, key: value + h})(count)
            down = build(fo, name, {**kwargs, key: value - h})(count)
            assert grad.item() == pytest.approx((up - down) / (2 * h), rel=1e-5, abs=1e-8), (key, count)


def test_grad_of_piecewise_scales_and_sgdr_peaks():
    h = 1e-6
    for count in (2, 4, 7):
        f = lambda s, c=count: fo.piecewise_constant_schedule(2.0, {3: s, 6: 0.5})(c)
        g = torch.func.grad(f)(torch.tensor(0.3, dtype=torch.float64))
        assert g.item() == pytest.approx((f(0.3 + h) - f(0.3 - h)) / (2 * h), rel=1e-6, abs=1e-9)
    cycle = dict(init_value=0.0, warmup_steps=2, decay_steps=6, end_value=0.1)
    for count in (1, 4, 8, 10):
        f = lambda p, c=count: fo.sgdr_schedule([dict(cycle, peak_value=p), dict(cycle, peak_value=2 * p)])(c)
        g = torch.func.grad(f)(torch.tensor(0.7, dtype=torch.float64))
        assert g.item() == pytest.approx((f(0.7 + h) - f(0.7 - h)) / (2 * h), rel=1e-6, abs=1e-9)


def test_grad_is_finite_at_the_edges():
    """A zero peak (alpha's division), a zero decay rate, and the end of a cosine decay
    (0 ** exponent) have finite gradients, where a plain where() would give NaN."""
    zero = torch.tensor(0.0, dtype=torch.float64)
    for count in (0, 3, 10, 30):
        g = torch.func.grad(
            lambda p, count=count: fo.warmup_cosine_decay_schedule(0.1, p, 5, 20, 0.3)(torch.tensor(count))
        )(zero)
        assert torch.isfinite(g)
        g = torch.func.grad(
            lambda r, count=count: fo.exponential_decay(1.0, 5, r, end_value=0.1)(torch.tensor(count))
        )(zero)
        assert g.item() == 0.0
        g = torch.func.grad(
            lambda e, count=count: fo.cosine_decay_schedule(1.0, 10, 0.1, e)(torch.tensor(count))
        )(zero + 2)
        assert torch.isfinite(g)


def test_pickles_and_repr():
    for name, kwargs, horizon in ONE_OF_EACH:
        schedule = build(fo, name, kwargs)
        copy = pickle.loads(pickle.dumps(schedule))
        assert [copy(c) for c in range(horizon)] == [schedule(c) for c in range(horizon)]
        if name != "join_schedules":
            assert repr(schedule).startswith(f"funcopt.{name}(")
    assert repr(fo.linear_schedule(1.0, 0.0, 10)) == (
        "funcopt.linear_schedule(init_value=1.0, end_value=0.0, transition_steps=10, transition_begin=0)"
    )


def test_bad_input_raises_where_optax_raises():
    """Each optax raises for (ValueError, or ZeroDivisionError for a zero divisor) is a
    ValueError that says what to change."""
    raising = [
        ("cosine_decay_schedule", dict(init_value=1.0, decay_steps=0), "positive decay_steps"),
        ("warmup_cosine_decay_schedule", dict(init_value=0.0, peak_value=1.0, warmup_steps=10, decay_steps=10), "decay_steps > warmup_steps"),
        ("cosine_onecycle_schedule", dict(transition_steps=0, peak_value=1.0), "positive transition_steps"),
        ("linear_onecycle_schedule", dict(transition_steps=-1, peak_value=1.0), "positive transition_steps"),
        ("linear_onecycle_schedule", dict(transition_steps=10, peak_value=1.0, div_factor=0.0), "div_factor"),
        ("cosine_onecycle_schedule", dict(transition_steps=10, peak_value=1.0, div_factor=0), "div_factor"),
        ("piecewise_constant_schedule", dict(init_value=1.0, boundaries_and_scales={5: -0.1}), "non-negative"),
        ("sgdr_schedule", dict(cosine_kwargs=[dict(init_value=0.0, peak_value=1.0, warmup_steps=5, decay_steps=3)]), "cycle 0"),
    ]  # fmt: skip
    for name, kwargs, message in raising:
        with pytest.raises((ValueError, ZeroDivisionError)):
            build(optax, name, kwargs)
        with pytest.raises(ValueError, match=message):
            build(fo, name, kwargs)
    # optax fails only when called (IndexError); funcopt says so when built
    with pytest.raises(ValueError, match="at least one cycle"):
        fo.sgdr_schedule([])
    with pytest.raises(ValueError, match="at least one schedule"):
        fo.join_schedules([], [])


def test_bad_types_raise():
    with pytest.raises(TypeError, match="transition_steps must be a Python number"):
        fo.linear_schedule(1.0, 0.0, torch.tensor(10))
    with pytest.raises(TypeError, match="each boundary must be a Python number"):
        fo.piecewise_constant_schedule(1.0, {torch.tensor(3): 0.5})
    with pytest.raises(TypeError, match="peak_value must be a number or a 0-d tensor, got a str"):
        fo.warmup_cosine_decay_schedule(0.0, "1e-3", 10, 100)
    with pytest.raises(TypeError, match="each schedule must be a function"):
        fo.join_schedules([0.1, fo.constant_schedule(0.2)], [3])
    with pytest.raises(TypeError, match="sgdr_schedule: cycle 1"):
        fo.sgdr_schedule(
            [dict(init_value=0.0, peak_value=1.0, warmup_steps=5, decay_steps=30), dict(init_value=0.0)]
        )


@pytest.mark.parametrize(("name", "kwargs", "horizon"), CASES, ids=IDS)
def test_counts_that_are_no_numbers_raise_type_error(name, kwargs, horizon):
    """A string count raises TypeError, as optax's schedules do; so does a bool (optax
    takes True as 1), where ``float()`` or integer math would read one as a count."""
    schedule = build(fo, name, kwargs)
    for count in ("5", True, False, torch.tensor(True), None):
        with pytest.raises(TypeError, match="the count must be a number or a tensor of numbers"):
            schedule(count)
    schedule(5), schedule(5.0), schedule(torch.tensor(5)), schedule(np.int64(5))  # counts


def test_optax_refuses_a_string_count():
    """Where optax computes with the count (not a constant, nor a degenerate schedule)."""
    for name in ("linear_schedule", "cosine_decay_schedule", "exponential_decay"):
        kwargs = {"linear_schedule": dict(init_value=1.0, end_value=0.0, transition_steps=10),
                  "cosine_decay_schedule": dict(init_value=1.0, decay_steps=10),
                  "exponential_decay": dict(init_value=1.0, transition_steps=3, decay_rate=0.5)}[name]  # fmt: skip
        with pytest.raises(TypeError):
            build(optax, name, kwargs)("5")
        with pytest.raises(TypeError):
            build(fo, name, kwargs)("5")


def test_bool_steps_raise_type_error():
    with pytest.raises(TypeError, match="transition_steps must be a Python number"):
        fo.linear_schedule(1.0, 0.0, True)
    with pytest.raises(TypeError, match="each boundary must be a Python number"):
        fo.join_schedules([fo.constant_schedule(0.1), fo.constant_schedule(0.2)], [True])


def test_join_of_user_functions():
    """A schedule of the user's returning numbers joins with tensors too."""
    joined = fo.join_schedules([lambda c: 0.5, fo.linear_schedule(1.0, 0.0, 4)], [2])
    assert [joined(c) for c in range(6)] == [0.5, 0.5, 1.0, 0.75, 0.5, 0.25]
    values = joined(torch.arange(6))
    assert values.dtype == torch.float32
    assert values.tolist() == [0.5, 0.5, 1.0, 0.75, 0.5, 0.25]


def test_python_path_ieee_edges():
    """Where Python's ** raises or goes complex, the Python path gives what torch and jax do."""
    s = fo.exponential_decay(1.0, 1, -2.0)
    assert s(1) == -2.0
    assert math.isnan(s(1.5))
    assert fo.exponential_decay(1.0, 1, 10.0)(10**6) == math.inf  # overflows as in float64
    assert fo.exponential_decay(1.0, 1, 10.0, end_value=3.0)(10**6) == 3.0
    assert fo.cosine_decay_schedule(1.0, 10, exponent=-1.0)(10) == math.inf  # 0 ** -1
