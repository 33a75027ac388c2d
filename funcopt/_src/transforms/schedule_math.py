"""The math of each schedule, in optax's formulas and order of operations, written once against
`m`: `_PyMath` (Python doubles, for a count Python may read) or `_TorchMath` (tensor ops, for a
traced or batched count). `schedules.py` holds the public functions."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor


def _py_pow(x: float, y: float) -> float:
    """``x ** y`` as IEEE pow (torch, jax) gives it, where Python raises or goes complex."""
    try:
        result = x**y
    except ZeroDivisionError:  # 0 ** negative
        return math.inf
    except OverflowError:
        odd = float(y).is_integer() and int(y) % 2 == 1
        return -math.inf if x < 0 and odd else math.inf
    return math.nan if isinstance(result, complex) else result


def _py_join(count: Any, parts: Sequence[Callable[[Any], Any]], boundaries: Sequence[int]) -> Any:
    # only the selected part is evaluated
    chosen, offset = parts[0], 0
    for boundary, part in zip(boundaries, parts[1:]):
        if not count < boundary:
            chosen, offset = part, boundary
    return chosen(count - offset)


class _PyMath:
    """Python floats (double precision); `where` picks one of two computed values."""

    @staticmethod
    def where(cond: Any, a: Any, b: Any) -> Any:
        return a if cond else b

    @staticmethod
    def minimum(x: Any, y: Any) -> Any:
        return x if x <= y else y

    @staticmethod
    def maximum(x: Any, y: Any) -> Any:
        return x if x >= y else y

    @staticmethod
    def clip(x: Any, lo: Any, hi: Any) -> Any:
        return min(max(x, lo), hi)

    cos = staticmethod(math.cos)
    pow = staticmethod(_py_pow)
    join = staticmethod(_py_join)

    @staticmethod
    def floor(x: Any) -> Any:
        return float(math.floor(x))


def _torch_join(count: Tensor, parts: Sequence[Callable[[Any], Any]], boundaries: Sequence[int]) -> Tensor:
    # every part is evaluated and selected by torch.where: one graph for every count
    out = parts[0](count)
    for boundary, part in zip(boundaries, parts[1:]):
        out = torch.where(count < boundary, out, part(count - boundary))
    return out


class _TorchMath:
    """Tensor ops only: no Python branch reads a tensor's value."""

    where = staticmethod(torch.where)

    @staticmethod
    def minimum(x: Tensor, y: Any) -> Tensor:
        return torch.minimum(x, y) if isinstance(y, Tensor) else torch.clamp(x, max=y)

    @staticmethod
    def maximum(x: Tensor, y: Any) -> Tensor:
        return torch.maximum(x, y) if isinstance(y, Tensor) else torch.clamp(x, min=y)

    @staticmethod
    def clip(x: Tensor, lo: Any, hi: Any) -> Tensor:
        return torch.clamp(x, lo, hi)

    cos = staticmethod(torch.cos)
    pow = staticmethod(torch.pow)
    floor = staticmethod(torch.floor)
    join = staticmethod(_torch_join)


def _constant_math(m: Any, count: Any, value: Any) -> Any:
    return value


def _polynomial_math(
    m: Any,
    count: Any,
    init_value: Any,
    end_value: Any,
    power: Any,
    transition_steps: Any,
    transition_begin: Any,
) -> Any:
    if transition_steps <= 0:
        return init_value
    c = m.clip(count - max(transition_begin, 0), 0, transition_steps)
    frac = 1 - c / transition_steps
    return (init_value - end_value) * m.pow(frac, power) + end_value


def _exponential_math(
    m: Any,
    count: Any,
    init_value: Any,
    decay_rate: Any,
    end_value: Any,
    transition_steps: Any,
    transition_begin: Any,
    staircase: bool,
) -> Any:
    if transition_steps <= 0:
        return init_value
    decreased = count - max(transition_begin, 0)
    # the power is taken of a non-negative count only: below the start the value is
    # init_value anyway, and pow(rate, negative) would overflow into the gradient
    p = m.maximum(decreased, 0) / transition_steps
    if staircase:
        p = m.floor(p)
    rate = m.where(decay_rate == 0, 1.0, decay_rate)  # rate 0: init_value, with a finite gradient
    value = m.where(decreased <= 0, init_value, init_value * m.pow(rate, p))
    if end_value is not None:
        value = m.where(decay_rate < 1, m.maximum(value, end_value), m.minimum(value, end_value))
    return m.where(decay_rate == 0, init_value, value)


def _cosine_math(m: Any, count: Any, init_value: Any, alpha: Any, exponent: Any, decay_steps: Any) -> Any:
    c = m.minimum(count, decay_steps)
    cosine_decay = 0.5 * (1 + m.cos(math.pi * c / decay_steps))
    decayed = (1 - alpha) * m.pow(cosine_decay, exponent) + alpha
    return init_value * decayed


def _warmup_cosine_math(
    m: Any,
    count: Any,
    init_value: Any,
    peak_value: Any,
    end_value: Any,
    exponent: Any,
    warmup_steps: Any,
    decay_steps: Any,
) -> Any:
    zero_peak = peak_value == 0
    alpha = m.where(zero_peak, 0.0, end_value / m.where(zero_peak, 1.0, peak_value))
    return m.join(
        count,
        [
            lambda c: _polynomial_math(m, c, init_value, peak_value, 1.0, warmup_steps, 0),
            lambda c: _cosine_math(m, c, peak_value, alpha, exponent, decay_steps - warmup_steps),
        ],
        [warmup_steps],
    )


def _warmup_exponential_math(
    m: Any,
    count: Any,
    init_value: Any,
    peak_value: Any,
    decay_rate: Any,
    end_value: Any,
    warmup_steps: Any,
    transition_steps: Any,
    transition_begin: Any,
    staircase: bool,
) -> Any:
    return m.join(
        count,
        [
            lambda c: _polynomial_math(m, c, init_value, peak_value, 1.0, warmup_steps, 0),
            lambda c: _exponential_math(
                m, c, peak_value, decay_rate, end_value, transition_steps, transition_begin, staircase
            ),
        ],
        [warmup_steps],
    )


def _piecewise_constant_math(m: Any, count: Any, init_value: Any, scales: Any, boundaries: Any) -> Any:
    value = init_value
    for boundary, scale in zip(boundaries, scales):
        value = m.where(count < boundary, value, scale * value)
    return value


def _interpolate_math(m: Any, count: Any, cosine: bool, init_value: Any, boundaries_and_scales: Any) -> Any:
    """optax's piecewise_interpolate_schedule: interpolates between the running products
    of the scales, from 0 to the first boundary, then between boundaries."""
    bounds = [0, *sorted(boundaries_and_scales)]
    values = [init_value]
    for b in bounds[1:]:
        values.append(values[-1] * boundaries_and_scales[b])
    out = 0.0
    for lo, hi, start, end in zip(bounds[:-1], bounds[1:], values[:-1], values[1:]):
        pct = (count - lo) / max(hi - lo, 1)
        if cosine:
            segment = end + (start - end) / 2.0 * (m.cos(math.pi * pct) + 1)
        else:
            segment = (end - start) * pct + start
        # a sum over the intervals holding the count, as optax's indicator.dot
        out = out + m.where((count >= lo) & (count < hi), segment, 0.0)
    return out + m.where(bounds[-1] <= count, values[-1], 0.0)


def _cosine_onecycle_math(
    m: Any,
    count: Any,
    peak_value: Any,
    div_factor: Any,
    final_div_factor: Any,
    transition_steps: int,
    pct_start: float,
) -> Any:
    scales = {
        int(pct_start * transition_steps): div_factor,
        int(transition_steps): 1.0 / (div_factor * final_div_factor),
    }
    return _interpolate_math(m, count, True, peak_value / div_factor, scales)


def _linear_onecycle_math(
    m: Any,
    count: Any,
    peak_value: Any,
    div_factor: Any,
    final_div_factor: Any,
    transition_steps: int,
    pct_start: float,
    pct_final: float,
) -> Any:
    scales = {
        int(pct_start * transition_steps): div_factor,
        int(pct_final * transition_steps): 1.0 / div_factor,
        transition_steps: 1.0 / final_div_factor,
    }
    return _interpolate_math(m, count, False, peak_value / div_factor, scales)


def _sgdr_math(m: Any, count: Any, cycles: Any, steps: Any) -> Any:
    parts = [
        (lambda c, hp=hp, s=s: _warmup_cosine_math(m, c, **hp, warmup_steps=s[0], decay_steps=s[1]))
        for hp, s in zip(cycles, steps)
    ]
    boundaries, total = [], 0
    for _, decay_steps in steps:
        total += decay_steps
        boundaries.append(total)
    return m.join(count, parts, boundaries[:-1])
