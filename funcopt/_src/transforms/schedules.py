"""Schedules: functions ``count -> value`` (optax's names, arguments and math).

A schedule gives a hyperparameter (a learning rate, a weight decay) for a step count.
Every schedule here takes either count:

- a Python int (or float): the value is a Python float computed in double precision,
  as optax computes it with ``jax_enable_x64``;
- a tensor (0-d for one count; a tensor of counts gives their values elementwise): the
  value is a tensor, computed with tensor ops only, so that a compiled step traces one
  graph for the whole run (no Python branch reads the count's value).

Hyperparameters (``init_value``, ``peak_value``, ``decay_rate``, ...) may be Python
numbers or 0-d tensors: with tensors, a schedule works under ``torch.func.vmap`` (a sweep
over peak learning rates is one batched call) and ``torch.func.grad``. Step counts
(``transition_steps``, ``warmup_steps``, ``boundaries``, ...) are Python numbers: they
fix the schedule's structure.

Dtype rule for a tensor result: the promoted dtype of the floating-point tensor
hyperparameters if any, else torch's default dtype (float32), whatever the count's
dtype. The math runs in float64 (float32 on MPS, which has no float64), with one
rounding to the result's dtype at the end.
"""

from __future__ import annotations

import functools
import numbers
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import optree
import torch
from torch import Tensor

from ..core.base import a_kind
from .schedule_math import (
    _constant_math,
    _cosine_math,
    _cosine_onecycle_math,
    _exponential_math,
    _linear_onecycle_math,
    _piecewise_constant_math,
    _polynomial_math,
    _py_join,
    _PyMath,
    _sgdr_math,
    _torch_join,
    _TorchMath,
    _warmup_cosine_math,
    _warmup_exponential_math,
)

__all__ = [
    "constant_schedule",
    "cosine_decay_schedule",
    "cosine_onecycle_schedule",
    "exponential_decay",
    "join_schedules",
    "linear_onecycle_schedule",
    "linear_schedule",
    "piecewise_constant_schedule",
    "polynomial_schedule",
    "sgdr_schedule",
    "warmup_cosine_decay_schedule",
    "warmup_exponential_decay_schedule",
]

Scalar = float | Tensor
"""A hyperparameter: a Python number or a 0-d tensor."""
Schedule = Callable[[int | float | Tensor], float | Tensor]
"""A function from a step count to a value (optax's ``Schedule``)."""


# ---------------------------------------------------------------------------------------
# The callable that the public functions return.


class _Schedule:
    """A schedule: `math(m, count, **hyper, **structure)` evaluated in Python doubles
    (Python count, no tensor hyperparameter) or in tensors. A class, not a closure, so
    that it pickles (a param group holding it goes into a state_dict)."""

    def __init__(
        self,
        name: str,
        math_fn: Callable[..., Any],
        hyper: Mapping[str, Any],
        structure: Mapping[str, Any],
        args: Mapping[str, Any],
    ) -> None:
        self.name = name
        self.math_fn = math_fn
        self.hyper: Any = dict(hyper)  # a pytree of hyperparameters (numbers, tensors, None)
        self.structure = dict(structure)  # Python values that fix the computation
        self.args = dict(args)  # as the user gave them, for repr

    def __call__(self, count: int | float | Tensor) -> float | Tensor:
        _check_count(self.name, count)
        tensors = [x for x in optree.tree_leaves(self.hyper) if isinstance(x, Tensor)]
        if not isinstance(count, Tensor) and not tensors:
            count = count if isinstance(count, int) else float(count)
            hyper = optree.tree_map(float, self.hyper)
            return float(self.math_fn(_PyMath, count, **hyper, **self.structure))
        device = _device([*tensors, count] if isinstance(count, Tensor) else tensors)
        dtype = _result_dtype(tensors)
        compute = torch.float32 if device.type == "mps" else torch.float64

        def to_compute(x: Any) -> Tensor:
            if isinstance(x, Tensor):
                return x.to(device=device, dtype=compute)
            return torch.tensor(float(x), dtype=compute, device=device)

        t_count = to_compute(count)
        out = self.math_fn(_TorchMath, t_count, **optree.tree_map(to_compute, self.hyper), **self.structure)
        out = out.to(dtype)
        if out.shape != t_count.shape:  # a constant part: one value for each count
            out = torch.broadcast_to(out, torch.broadcast_shapes(out.shape, t_count.shape))
        return out

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.args.items())
        return f"funcopt.{self.name}({args})"

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickles as the public factory's call (``funcopt.linear_schedule(...)``)."""
        return (functools.partial(getattr(sys.modules["funcopt"], self.name), **self.args), ())


def _device(tensors: Sequence[Tensor]) -> torch.device:
    """Where to compute: an accelerator among the tensors' devices if any (moving a 0-d
    CPU tensor there does not wait for the accelerator, the other way would), else the CPU."""
    return next((t.device for t in tensors if t.device.type != "cpu"), tensors[0].device)


def _result_dtype(tensors: Sequence[Tensor]) -> torch.dtype:
    dtype = None
    for t in tensors:
        if t.is_floating_point():
            dtype = t.dtype if dtype is None else torch.promote_types(dtype, t.dtype)
    return torch.get_default_dtype() if dtype is None else dtype


def _check_count(fn: str, count: Any) -> None:
    """Raise a TypeError unless `count` is a step count: a real number or a tensor of
    numbers. A string (optax refuses one too) or a bool would pass through ``float()``
    or integer math, as a count the caller did not mean."""
    if isinstance(count, Tensor) and count.dtype != torch.bool:
        return
    if isinstance(count, numbers.Real) and not isinstance(count, bool):
        return
    what = "a tensor of bool" if isinstance(count, Tensor) else a_kind(count)
    raise TypeError(f"{fn}: the count must be a number or a tensor of numbers (the step count), got {what}")


def _check_scalar(fn: str, name: str, value: Any, optional: bool = False) -> None:
    if optional and value is None:
        return
    if not isinstance(value, (numbers.Real, Tensor)):
        raise TypeError(f"{fn}: {name} must be a number or a 0-d tensor, got {a_kind(value)}")


def _check_steps(fn: str, name: str, value: Any) -> None:
    if isinstance(value, (Tensor, bool)) or not isinstance(value, numbers.Real):
        raise TypeError(
            f"{fn}: {name} must be a Python number (it fixes the schedule's structure, "
            f"which a tensor cannot), got {a_kind(value)}"
        )


# ---------------------------------------------------------------------------------------
# The public functions.


def constant_schedule(value: Scalar) -> Schedule:
    """A schedule that is `value` at every count.

    Example:
        >>> import torch, funcopt as fo
        >>> fo.constant_schedule(0.1)(5)
        0.1
        >>> fo.constant_schedule(0.1)(torch.tensor(5))
        tensor(0.1000)
    """
    _check_scalar("constant_schedule", "value", value)
    return _Schedule("constant_schedule", _constant_math, {"value": value}, {}, {"value": value})


def polynomial_schedule(
    init_value: Scalar,
    end_value: Scalar,
    power: Scalar,
    transition_steps: int,
    transition_begin: int = 0,
) -> Schedule:
    """From `init_value` to `end_value` over `transition_steps` steps after
    `transition_begin`: ``(init - end) * (1 - t / transition_steps) ** power + end``, with
    ``t = clip(count - transition_begin, 0, transition_steps)``.

    As optax: ``transition_steps <= 0`` gives the constant `init_value`, and a negative
    `transition_begin` counts as 0.

    Example:
        >>> import funcopt as fo
        >>> s = fo.polynomial_schedule(1.0, 0.01, power=2, transition_steps=100)
        >>> s(0), s(50), s(100), s(200)
        (1.0, 0.2575, 0.01, 0.01)
    """
    hyper = {"init_value": init_value, "end_value": end_value, "power": power}
    return _polynomial("polynomial_schedule", hyper, transition_steps, transition_begin)


def _polynomial(fn: str, hyper: dict[str, Any], transition_steps: int, transition_begin: int) -> _Schedule:
    for name, value in hyper.items():
        _check_scalar(fn, name, value)
    _check_steps(fn, "transition_steps", transition_steps)
    _check_steps(fn, "transition_begin", transition_begin)
    structure = {"transition_steps": transition_steps, "transition_begin": transition_begin}
    return _Schedule(fn, _polynomial_math, {"power": 1.0, **hyper}, structure, {**hyper, **structure})


def linear_schedule(
    init_value: Scalar,
    end_value: Scalar,
    transition_steps: int,
    transition_begin: int = 0,
) -> Schedule:
    """From `init_value` to `end_value` linearly over `transition_steps` steps after
    `transition_begin` (`polynomial_schedule` with ``power=1``).

    Example:
        >>> import funcopt as fo
        >>> s = fo.linear_schedule(0.0, 1.0, transition_steps=10, transition_begin=5)
        >>> s(0), s(10), s(15), s(20)
        (0.0, 0.5, 1.0, 1.0)
    """
    hyper = {"init_value": init_value, "end_value": end_value}
    return _polynomial("linear_schedule", hyper, transition_steps, transition_begin)


def exponential_decay(
    init_value: Scalar,
    transition_steps: int,
    decay_rate: Scalar,
    transition_begin: int = 0,
    staircase: bool = False,
    end_value: Scalar | None = None,
) -> Schedule:
    """``init_value * decay_rate ** ((count - transition_begin) / transition_steps)``
    from `transition_begin` on (`init_value` before); with `staircase`, the exponent is
    floored. `end_value` bounds the value: from below when ``decay_rate < 1``, from
    above otherwise.

    As optax: ``transition_steps <= 0`` or ``decay_rate == 0`` give the constant
    `init_value` (`end_value` ignored), a negative `transition_begin` counts as 0, and a
    negative `decay_rate` is taken to the power as is (NaN for a fractional exponent).

    Example:
        >>> import funcopt as fo
        >>> s = fo.exponential_decay(1.0, transition_steps=10, decay_rate=0.5, end_value=0.2)
        >>> s(0), s(10), s(20), s(30)
        (1.0, 0.5, 0.25, 0.2)
    """
    fn = "exponential_decay"
    _check_scalar(fn, "init_value", init_value)
    _check_scalar(fn, "decay_rate", decay_rate)
    _check_scalar(fn, "end_value", end_value, optional=True)
    _check_steps(fn, "transition_steps", transition_steps)
    _check_steps(fn, "transition_begin", transition_begin)
    hyper = {"init_value": init_value, "decay_rate": decay_rate, "end_value": end_value}
    structure = {
        "transition_steps": transition_steps,
        "transition_begin": transition_begin,
        "staircase": bool(staircase),
    }
    return _Schedule(fn, _exponential_math, hyper, structure, {**hyper, **structure})


def cosine_decay_schedule(
    init_value: Scalar,
    decay_steps: int,
    alpha: Scalar = 0.0,
    exponent: Scalar = 1.0,
) -> Schedule:
    """Cosine decay from `init_value` to ``alpha * init_value`` over `decay_steps`:
    ``init * ((1 - alpha) * (0.5 * (1 + cos(pi * t / decay_steps))) ** exponent + alpha)``
    with ``t = min(count, decay_steps)``.

    Example:
        >>> import funcopt as fo
        >>> s = fo.cosine_decay_schedule(1.0, decay_steps=100, alpha=0.1)
        >>> s(0), round(s(50), 6), s(100), s(1000)
        (1.0, 0.55, 0.1, 0.1)
    """
    fn = "cosine_decay_schedule"
    for name, value in (("init_value", init_value), ("alpha", alpha), ("exponent", exponent)):
        _check_scalar(fn, name, value)
    _check_steps(fn, "decay_steps", decay_steps)
    if not decay_steps > 0:
        raise ValueError(f"{fn} needs a positive decay_steps, got {decay_steps}")
    hyper = {"init_value": init_value, "alpha": alpha, "exponent": exponent}
    structure = {"decay_steps": decay_steps}
    return _Schedule(fn, _cosine_math, hyper, structure, {**hyper, **structure})


def warmup_cosine_decay_schedule(
    init_value: Scalar,
    peak_value: Scalar,
    warmup_steps: int,
    decay_steps: int,
    end_value: Scalar = 0.0,
    exponent: Scalar = 1.0,
) -> Schedule:
    """Linear warmup from `init_value` to `peak_value` over `warmup_steps`, then cosine
    decay to `end_value`, reached at count `decay_steps` (which includes the warmup).

    As optax, the decay is `cosine_decay_schedule` with ``alpha = end_value /
    peak_value``, so a zero `peak_value` decays to 0, whatever `end_value`.

    Example:
        >>> import funcopt as fo
        >>> s = fo.warmup_cosine_decay_schedule(0.0, 1.0, warmup_steps=10, decay_steps=110, end_value=0.1)
        >>> s(0), s(5), s(10), round(s(60), 6), s(110)
        (0.0, 0.5, 1.0, 0.55, 0.1)
    """
    fn = "warmup_cosine_decay_schedule"
    hyper = {"init_value": init_value, "peak_value": peak_value, "end_value": end_value, "exponent": exponent}
    for name, value in hyper.items():
        _check_scalar(fn, name, value)
    _check_steps(fn, "warmup_steps", warmup_steps)
    _check_steps(fn, "decay_steps", decay_steps)
    if not decay_steps - warmup_steps > 0:
        raise ValueError(
            f"{fn} needs decay_steps > warmup_steps (decay_steps is the whole schedule's "
            f"length, warmup included), got warmup_steps={warmup_steps}, decay_steps={decay_steps}"
        )
    structure = {"warmup_steps": warmup_steps, "decay_steps": decay_steps}
    args = {"init_value": init_value, "peak_value": peak_value, **structure, "end_value": end_value}
    return _Schedule(fn, _warmup_cosine_math, hyper, structure, {**args, "exponent": exponent})


def warmup_exponential_decay_schedule(
    init_value: Scalar,
    peak_value: Scalar,
    warmup_steps: int,
    transition_steps: int,
    decay_rate: Scalar,
    transition_begin: int = 0,
    staircase: bool = False,
    end_value: Scalar | None = None,
) -> Schedule:
    """Linear warmup from `init_value` to `peak_value` over `warmup_steps`, then
    `exponential_decay` from `peak_value` (its count starting at 0 after the warmup).

    Example:
        >>> import funcopt as fo
        >>> s = fo.warmup_exponential_decay_schedule(0.0, 1.0, warmup_steps=10, transition_steps=10, decay_rate=0.5)
        >>> s(5), s(10), s(20), s(30)
        (0.5, 1.0, 0.5, 0.25)
    """
    fn = "warmup_exponential_decay_schedule"
    for name, value in (("init_value", init_value), ("peak_value", peak_value), ("decay_rate", decay_rate)):
        _check_scalar(fn, name, value)
    _check_scalar(fn, "end_value", end_value, optional=True)
    for name, steps in (
        ("warmup_steps", warmup_steps),
        ("transition_steps", transition_steps),
        ("transition_begin", transition_begin),
    ):
        _check_steps(fn, name, steps)
    hyper = {
        "init_value": init_value,
        "peak_value": peak_value,
        "decay_rate": decay_rate,
        "end_value": end_value,
    }
    structure = {
        "warmup_steps": warmup_steps,
        "transition_steps": transition_steps,
        "transition_begin": transition_begin,
        "staircase": bool(staircase),
    }
    return _Schedule(fn, _warmup_exponential_math, hyper, structure, {**hyper, **structure})


def piecewise_constant_schedule(
    init_value: Scalar, boundaries_and_scales: Mapping[int, Scalar] | None = None
) -> Schedule:
    """`init_value` times the product of the scales whose boundary the count has reached
    (``count >= boundary``). Scales must be non-negative.

    Example:
        >>> import funcopt as fo
        >>> s = fo.piecewise_constant_schedule(1.0, {100: 0.1, 200: 0.5})
        >>> s(99), s(100), s(250)
        (1.0, 0.1, 0.05)
    """
    fn = "piecewise_constant_schedule"
    _check_scalar(fn, "init_value", init_value)
    items = sorted((boundaries_and_scales or {}).items())
    for boundary, scale in items:
        _check_steps(fn, "each boundary", boundary)
        _check_scalar(fn, f"the scale at boundary {boundary}", scale)
        if not isinstance(scale, Tensor) and not scale >= 0:
            raise ValueError(f"{fn} needs non-negative scales, got {scale} at boundary {boundary}")
    hyper = {"init_value": init_value, "scales": [s for _, s in items]}
    structure = {"boundaries": [b for b, _ in items]}
    args = {"init_value": init_value, "boundaries_and_scales": boundaries_and_scales}
    return _Schedule(fn, _piecewise_constant_math, hyper, structure, args)


class _Joined:
    """`join_schedules`'s result (a class, so that it pickles)."""

    def __init__(self, schedules: Sequence[Schedule], boundaries: Sequence[int]) -> None:
        self.schedules = list(schedules)
        self.boundaries = list(boundaries)

    def __call__(self, count: int | float | Tensor) -> float | Tensor:
        _check_count("join_schedules", count)
        if not isinstance(count, Tensor):
            return _py_join(count, self.schedules, self.boundaries)

        def as_tensor(value: Any) -> Tensor:  # a user's schedule may return a number
            if isinstance(value, Tensor):
                return value
            return torch.tensor(float(value), dtype=torch.get_default_dtype(), device=count.device)

        parts = [lambda c, s=s: as_tensor(s(c)) for s in self.schedules]
        return _torch_join(count, parts, self.boundaries)

    def __repr__(self) -> str:
        return f"funcopt.join_schedules({self.schedules!r}, {self.boundaries!r})"


def join_schedules(schedules: Sequence[Schedule], boundaries: Sequence[int]) -> Schedule:
    """Schedule ``schedules[i]`` from ``boundaries[i - 1]`` on (each gets the count
    since its boundary): the last schedule whose boundary the count has reached gives
    the value. With a tensor count every schedule is evaluated and ``torch.where``
    selects (their values promote as ``torch.where``'s do).

    As optax, the boundaries pair with ``schedules[1:]`` in order (unsorted boundaries
    are taken as given, and extra schedules or boundaries are ignored).

    Example:
        >>> import funcopt as fo
        >>> s = fo.join_schedules([fo.constant_schedule(1.0), fo.linear_schedule(1.0, 0.0, 10)], [5])
        >>> s(4), s(5), s(10), s(15)
        (1.0, 1.0, 0.5, 0.0)
    """
    schedules = list(schedules)
    if not schedules:
        raise ValueError("join_schedules needs at least one schedule")
    for boundary in boundaries:
        _check_steps("join_schedules", "each boundary", boundary)
    for s in schedules:
        if not callable(s):
            raise TypeError(f"join_schedules: each schedule must be a function of the count, got {a_kind(s)}")
    return _Joined(schedules, list(boundaries))


def _check_onecycle(
    fn: str, transition_steps: int, peak_value: Scalar, div_factor: Scalar, final_div_factor: Scalar
) -> None:
    _check_steps(fn, "transition_steps", transition_steps)
    if transition_steps <= 0:
        raise ValueError(f"{fn} needs a positive transition_steps, got {transition_steps}")
    for name, value in (
        ("peak_value", peak_value),
        ("div_factor", div_factor),
        ("final_div_factor", final_div_factor),
    ):
        _check_scalar(fn, name, value)
        if name != "peak_value" and not isinstance(value, Tensor) and value == 0:
            raise ValueError(f"{fn}: {name} divides the peak value, so it must not be 0")


def cosine_onecycle_schedule(
    transition_steps: int,
    peak_value: Scalar,
    pct_start: float = 0.3,
    div_factor: Scalar = 25.0,
    final_div_factor: Scalar = 1e4,
) -> Schedule:
    """One cycle (Smith et al., 2017): cosine from ``peak_value / div_factor`` up to
    `peak_value` over the first ``pct_start`` of `transition_steps`, then cosine down to
    ``peak_value / (div_factor * final_div_factor)``, held after `transition_steps`.

    As optax, a negative count gives 0.

    Example:
        >>> import funcopt as fo
        >>> s = fo.cosine_onecycle_schedule(100, peak_value=1.0, div_factor=10.0, final_div_factor=100.0)
        >>> round(s(0), 12), s(30), s(100)
        (0.1, 1.0, 0.001)
    """
    fn = "cosine_onecycle_schedule"
    _check_onecycle(fn, transition_steps, peak_value, div_factor, final_div_factor)
    _check_steps(fn, "pct_start", pct_start)
    hyper = {"peak_value": peak_value, "div_factor": div_factor, "final_div_factor": final_div_factor}
    structure = {"transition_steps": transition_steps, "pct_start": pct_start}
    args = {"transition_steps": transition_steps, "peak_value": peak_value, "pct_start": pct_start}
    args.update(div_factor=div_factor, final_div_factor=final_div_factor)
    return _Schedule(fn, _cosine_onecycle_math, hyper, structure, args)


def linear_onecycle_schedule(
    transition_steps: int,
    peak_value: Scalar,
    pct_start: float = 0.3,
    pct_final: float = 0.85,
    div_factor: Scalar = 25.0,
    final_div_factor: Scalar = 1e4,
) -> Schedule:
    """One cycle in three linear phases: from ``peak_value / div_factor`` up to
    `peak_value` at ``pct_start * transition_steps``, back down to ``peak_value /
    div_factor`` at ``pct_final * transition_steps``, then down to ``peak_value /
    (div_factor * final_div_factor)`` at `transition_steps`, held after.

    As optax, a negative count gives 0, and phase boundaries that round to one step
    (``int(pct * transition_steps)``) merge, the later phase's scale replacing the
    earlier one's.

    Example:
        >>> import funcopt as fo
        >>> s = fo.linear_onecycle_schedule(100, peak_value=1.0, div_factor=10.0, final_div_factor=100.0)
        >>> s(0), s(30), s(85), s(100)
        (0.1, 1.0, 0.1, 0.001)
    """
    fn = "linear_onecycle_schedule"
    _check_onecycle(fn, transition_steps, peak_value, div_factor, final_div_factor)
    _check_steps(fn, "pct_start", pct_start)
    _check_steps(fn, "pct_final", pct_final)
    hyper = {"peak_value": peak_value, "div_factor": div_factor, "final_div_factor": final_div_factor}
    structure = {"transition_steps": transition_steps, "pct_start": pct_start, "pct_final": pct_final}
    args = {"transition_steps": transition_steps, "peak_value": peak_value, "pct_start": pct_start}
    args.update(pct_final=pct_final, div_factor=div_factor, final_div_factor=final_div_factor)
    return _Schedule(fn, _linear_onecycle_math, hyper, structure, args)


def sgdr_schedule(cosine_kwargs: Iterable[Mapping[str, Any]]) -> Schedule:
    """SGD with warm restarts (Loshchilov and Hutter, 2017): `warmup_cosine_decay_schedule`
    cycles one after the other, each given by a dict of its arguments; a cycle lasts its
    ``decay_steps``.

    Example:
        >>> import funcopt as fo
        >>> cycle = dict(init_value=0.0, peak_value=1.0, warmup_steps=5, decay_steps=20)
        >>> s = fo.sgdr_schedule([cycle, cycle])
        >>> s(5), s(20), s(25)
        (1.0, 0.0, 1.0)
    """
    fn = "sgdr_schedule"
    cycles, steps = [], []
    for i, kwargs in enumerate(cosine_kwargs):
        try:
            warmup_cosine_decay_schedule(**kwargs)  # checks this cycle's arguments
        except TypeError as e:
            raise TypeError(f"{fn}: cycle {i}: {e}") from None
        except ValueError as e:
            raise ValueError(f"{fn}: cycle {i}: {e}") from None
        hyper = {"init_value": kwargs["init_value"], "peak_value": kwargs["peak_value"]}
        hyper.update(end_value=kwargs.get("end_value", 0.0), exponent=kwargs.get("exponent", 1.0))
        cycles.append(hyper)
        steps.append((kwargs["warmup_steps"], kwargs["decay_steps"]))
    if not cycles:
        raise ValueError(f"{fn} needs at least one cycle in cosine_kwargs")
    args = {"cosine_kwargs": [{**c, "warmup_steps": w, "decay_steps": d} for c, (w, d) in zip(cycles, steps)]}
    return _Schedule(fn, _sgdr_math, {"cycles": cycles}, {"steps": steps}, args)
