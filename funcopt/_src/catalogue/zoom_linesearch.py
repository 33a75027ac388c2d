"""optax's zoom line search (optax's names, arguments and math):
`scale_by_zoom_linesearch`, a step size with a sufficient decrease and a small curvature
(the strong Wolfe conditions), by Algorithms 3.5 and 3.6 of Nocedal and Wright (1999)
with Hager and Zhang's approximate decrease near a minimum.

Each trial of optax's loop runs one of two phases (``lax.cond``): the search for an
interval that holds a good step size, or the zoom into it. Here each trial computes both
phases' next point, evaluates the objective once at the one its phase picks, and keeps
that phase's bookkeeping (``torch.where``): the same trials and values, and one branch-free
body for eager mode and for tracers. The loop is `linesearch.search` (see there)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import optree
import torch
from torch import Tensor
from torch.func import grad_and_value

from ..core.base import GradientTransformation, Params, State, Updates
from ..core.hyperparams import _increment
from ..transforms.clipping import Scalar
from ._common import _check_state, check_params, device_of, pick, scalar
from .linesearch import (
    add_scale,
    as_grad,
    loss_of,
    objective,
    real_dot,
    scale_tree,
    search,
    value_dtype,
    zeros_like_tree,
)

__all__ = ["ScaleByZoomLinesearchState", "ZoomLinesearchInfo", "scale_by_zoom_linesearch"]

_INF = float("inf")


class ZoomLinesearchInfo(NamedTuple):
    """The trials of the last search and its final errors: sufficient decrease and small
    curvature (0 where met)."""

    num_linesearch_steps: Tensor
    decrease_error: Tensor
    curvature_error: Tensor


class ScaleByZoomLinesearchState(NamedTuple):
    """The step size found last, the loss and its gradient there (which
    `value_and_grad_from_state` hands to the next step), and `info`."""

    learning_rate: Tensor
    value: Tensor
    grad: Any
    info: ZoomLinesearchInfo


torch.serialization.add_safe_globals(
    [ZoomLinesearchInfo, ScaleByZoomLinesearchState]
)  # loads with torch.load(weights_only=True)


class _Zoom(NamedTuple):
    """optax's ``ZoomLinesearchState``, less what stays fixed (params, updates)."""

    count: Tensor  # type: ignore[assignment]  # optax's name, which shadows tuple.count
    stepsize_guess: Tensor
    stepsize: Tensor
    value: Tensor
    grad: Any
    slope: Tensor
    value_init: Tensor
    slope_init: Tensor
    decrease_error: Tensor
    curvature_error: Tensor
    error: Tensor
    interval_found: Tensor
    done: Tensor
    failed: Tensor
    low: Tensor
    value_low: Tensor
    slope_low: Tensor
    high: Tensor
    value_high: Tensor
    slope_high: Tensor
    cubic_ref: Tensor
    value_cubic_ref: Tensor
    safe_stepsize: Tensor
    safe_value: Tensor
    safe_grad: Any


def _cubicmin(a: Tensor, fa: Tensor, fpa: Tensor, b: Tensor, fb: Tensor, c: Tensor, fc: Tensor) -> Tensor:
    """The critical point of the cubic through (a, fa), (b, fb), (c, fc) with slope fpa
    at a, as optax's (from scipy); nan where there is none, and then unused. The
    divisions and the root see safe values there, so that a derivative through the
    search (``torch.func.grad``) is not nan."""
    db, dc = b - a, c - a
    denom = (db * dc) ** 2 * (db - dc)
    ok = denom != 0.0
    denom = torch.where(ok, denom, 1.0)
    rb, rc = fb - fa - fpa * db, fc - fa - fpa * dc
    big_a = (dc**2 * rb + -(db**2) * rc) / denom
    big_b = (-(dc**3) * rb + db**3 * rc) / denom
    radical = big_b * big_b - 3.0 * big_a * fpa
    ok = ok & (radical >= 0.0) & (big_a != 0.0)
    root = torch.sqrt(torch.where(ok, radical, 1.0))
    return torch.where(ok, a + (-big_b + root) / (3.0 * torch.where(ok, big_a, 1.0)), torch.nan)


def _quadmin(a: Tensor, fa: Tensor, fpa: Tensor, b: Tensor, fb: Tensor) -> Tensor:
    """The critical point of the quadratic through (a, fa), (b, fb) with slope fpa at a
    (nan where there is none, as in `_cubicmin`)."""
    db = b - a
    ok = db != 0.0
    big_b = (fb - fa - fpa * db) / torch.where(ok, db, 1.0) ** 2
    ok = ok & (big_b != 0.0)
    return torch.where(ok, a - fpa / (2.0 * torch.where(ok, big_b, 1.0)), torch.nan)


def _errors(hp: dict[str, Any], s: _Zoom, eta: Tensor, value: Tensor, slope: Tensor) -> tuple[Tensor, Tensor]:
    """The sufficient decrease error (Armijo, or Hager and Zhang's approximate one near a
    minimum) and the small curvature error at step size `eta`: 0 where met, inf for nan."""
    decrease = value - s.value_init - hp["slope_rtol"] * eta * s.slope_init
    if hp["approx_dec_rtol"] is not None:
        approx = slope - (2 * hp["slope_rtol"] - 1.0) * s.slope_init
        delta_values = value - s.value_init - hp["approx_dec_rtol"] * torch.abs(s.value_init)
        decrease = torch.minimum(torch.maximum(approx, delta_values), decrease)
    curvature = torch.abs(slope) - hp["curv_rtol"] * torch.abs(s.slope_init)
    return tuple(  # type: ignore[return-value]
        torch.where(torch.isnan(e), _INF, torch.clamp_min(e, 0.0)) for e in (decrease, curvature)
    )


def _search_point(hp: dict[str, Any], s: _Zoom) -> tuple[Tensor, Tensor]:
    """Phase 1's next step size (the guess, then larger ones) and whether it reached the
    largest step size."""
    eta = torch.where(s.count == 0, s.stepsize_guess, hp["increase_factor"] * s.stepsize)
    if hp["max_learning_rate"] is None:
        return eta, torch.zeros_like(s.done)
    largest = scalar(hp["max_learning_rate"], eta.dtype, eta.device)
    return torch.minimum(eta, largest), eta >= largest


def _zoom_point(hp: dict[str, Any], s: _Zoom) -> tuple[Tensor, Tensor]:
    """Phase 2's next step size (cubic, else quadratic interpolation, else bisection) and
    whether the interval is below `stepsize_precision`."""
    delta = torch.abs(s.high - s.low)
    left, right = torch.minimum(s.high, s.low), torch.maximum(s.high, s.low)
    cubic = _cubicmin(s.low, s.value_low, s.slope_low, s.high, s.value_high, s.cubic_ref, s.value_cubic_ref)
    use_cubic = (cubic > left + 0.2 * delta) & (cubic < right - 0.2 * delta)
    quad = _quadmin(s.low, s.value_low, s.slope_low, s.high, s.value_high)
    use_quad = ~use_cubic & (quad > left + 0.1 * delta) & (quad < right - 0.1 * delta)
    middle = torch.where(use_cubic, cubic, s.cubic_ref)
    middle = torch.where(use_quad, quad, middle)
    middle = torch.where(~use_cubic & ~use_quad, (s.low + s.high) / 2.0, middle)
    return middle, delta <= hp["stepsize_precision"]


def _after_search(
    hp: dict[str, Any], s: _Zoom, eta: Tensor, value: Tensor, grad: Any, slope: Tensor, max_reached: Tensor
) -> _Zoom:
    """Phase 1's bookkeeping (Algorithm 3.5) after a trial at `eta`."""
    dec, curv = _errors(hp, s, eta, value, slope)
    error = torch.maximum(dec, curv)
    tol = hp["tol"]
    safe = pick(dec <= tol, (eta, value, grad), (s.safe_stepsize, s.safe_value, s.safe_grad))
    set_high = (dec > 0.0) | ((value >= s.value) & (s.count > 0))
    set_low = (slope >= 0.0) & ~set_high
    low, value_low, slope_low, high, value_high, slope_high = pick(
        set_low,
        (eta, value, slope, s.stepsize, s.value, s.slope),
        (s.stepsize, s.value, s.slope, eta, value, slope),
    )
    found = set_high | set_low | (error <= tol)
    done = (error <= tol) | (max_reached & ~found)
    failed = (s.count + 1 >= hp["max_linesearch_steps"]) & ~done
    return s._replace(
        count=_increment(s.count), stepsize=eta, value=value, grad=grad, slope=slope,
        decrease_error=dec, curvature_error=curv, error=error, interval_found=found, done=done, failed=failed,
        low=low, value_low=value_low, slope_low=slope_low, high=high, value_high=value_high, slope_high=slope_high,
        cubic_ref=low, value_cubic_ref=value_low, safe_stepsize=safe[0], safe_value=safe[1], safe_grad=safe[2],
    )  # fmt: skip


def _after_zoom(
    hp: dict[str, Any], s: _Zoom, eta: Tensor, value: Tensor, grad: Any, slope: Tensor, too_small: Tensor
) -> _Zoom:
    """Phase 2's bookkeeping (Algorithm 3.6) after a trial at `eta`, the interval's middle."""
    dec, curv = _errors(hp, s, eta, value, slope)
    error = torch.maximum(dec, curv)
    better = (dec <= hp["tol"]) & (value < s.safe_value)
    safe = pick(better, (eta, value, grad), (s.safe_stepsize, s.safe_value, s.safe_grad))
    done = error <= hp["tol"]
    set_high_to_middle = (dec > 0.0) | (value >= s.value_low)
    set_high_to_low = (slope * (s.high - s.low) >= 0.0) & ~set_high_to_middle
    middle, old_high, old_low = (
        (eta, value, slope),
        (s.high, s.value_high, s.slope_high),
        (s.low, s.value_low, s.slope_low),
    )
    high = pick(set_high_to_low, old_low, pick(set_high_to_middle, middle, old_high))
    low = pick(~set_high_to_middle, middle, old_low)
    cubic_ref = pick(set_high_to_middle | set_high_to_low, (s.high, s.value_high), (s.low, s.value_low))
    max_iter_reached = s.count + 1 >= hp["max_linesearch_steps"]
    failed = (max_iter_reached | (too_small & (safe[0] > 0.0))) & ~done
    return s._replace(
        count=_increment(s.count), stepsize=eta, value=value, grad=grad, slope=slope,
        decrease_error=dec, curvature_error=curv, error=error, done=done, failed=failed,
        low=low[0], value_low=low[1], slope_low=low[2], high=high[0], value_high=high[1], slope_high=high[2],
        cubic_ref=cubic_ref[0], value_cubic_ref=cubic_ref[1], safe_stepsize=safe[0], safe_value=safe[1], safe_grad=safe[2],
    )  # fmt: skip


def _safe_step(s: _Zoom) -> _Zoom:
    """A failed search's result: the best step size with a sufficient decrease, if any
    (or if the last trial left the domain), else the last trial."""
    use_safe = (s.safe_stepsize > 0.0) | torch.isinf(s.decrease_error)
    eta, value, grad = pick(
        use_safe, (s.safe_stepsize, s.safe_value, s.safe_grad), (s.stepsize, s.value, s.grad)
    )
    return s._replace(stepsize=eta, value=value, grad=grad)


def _trial(hp: dict[str, Any], at: Callable[[Tensor], tuple[Tensor, Any, Tensor]], s: _Zoom) -> _Zoom:
    """One trial of the search: the point of the current phase, evaluated once."""
    search_eta, max_reached = _search_point(hp, s)
    zoom_eta, too_small = _zoom_point(hp, s)
    eta = torch.where(s.interval_found, zoom_eta, search_eta)
    value, grad, slope = at(eta)
    new = pick(
        s.interval_found,
        _after_zoom(hp, s, eta, value, grad, slope, too_small),
        _after_search(hp, s, eta, value, grad, slope, max_reached),
    )
    return pick(new.failed, _safe_step(new), new)


def _zoom_init(params: Params) -> ScaleByZoomLinesearchState:
    dtype, device = value_dtype(params), device_of(params)
    number = functools.partial(torch.tensor, dtype=dtype, device=device)
    info = ZoomLinesearchInfo(torch.zeros((), dtype=torch.int32, device=device), number(_INF), number(_INF))
    return ScaleByZoomLinesearchState(number(1.0), number(_INF), zeros_like_tree(params), info)


def _start(
    hp: dict[str, Any], state: ScaleByZoomLinesearchState, value: Tensor, grad: Any, slope: Tensor
) -> _Zoom:
    """optax's ``init_fn`` of the zoom line search."""
    lr = state.learning_rate
    zero, inf, no = (
        torch.zeros_like(lr),
        torch.full_like(lr, _INF),
        torch.zeros((), dtype=torch.bool, device=lr.device),
    )
    guess = torch.ones_like(lr) if hp["initial_guess_strategy"] == "one" else lr
    return _Zoom(
        count=torch.zeros_like(state.info.num_linesearch_steps), stepsize_guess=guess, stepsize=zero,
        value=value, grad=grad, slope=slope, value_init=value, slope_init=slope,
        decrease_error=inf, curvature_error=inf, error=inf, interval_found=no, done=no, failed=no,
        low=zero, value_low=value, slope_low=slope, high=zero, value_high=value, slope_high=slope,
        cubic_ref=zero, value_cubic_ref=value, safe_stepsize=zero, safe_value=value, safe_grad=grad,
    )  # fmt: skip


def _zoom_update(
    hp: dict[str, Any],
    updates: Updates, state: State, params: Params | None = None,
    *, value: Any = None, grad: Any = None, value_fn: Any = None, **extra_args: Any,
) -> tuple[Updates, State]:  # fmt: skip
    who = "scale_by_zoom_linesearch update"
    _check_state(state, ScaleByZoomLinesearchState, who)
    check_params(who, params)
    fn = objective(who, value, grad, value_fn, extra_args)
    dtype, device = state.learning_rate.dtype, state.learning_rate.device
    grad = as_grad(grad, params)
    value = scalar(value, dtype, device).reshape(())  # the loss at the params

    def at(eta: Tensor) -> tuple[Tensor, Any, Tensor]:
        """The loss, its gradient and its slope along the updates at ``params + eta u``."""
        g, v = grad_and_value(lambda p: loss_of(fn, p, dtype, device))(add_scale(params, eta, updates))
        return v, g, real_dot(updates, g).to(dtype)

    start = _start(hp, state, value, grad, real_dot(updates, grad).to(dtype))
    rounds = max(1, hp["max_linesearch_steps"])
    last = search(
        lambda s: ~(s.done | s.failed),
        functools.partial(_trial, hp, at),
        start,
        rounds,
        who,
        "max_linesearch_steps",
    )
    info = ZoomLinesearchInfo(last.count.to(torch.int32), last.decrease_error, last.curvature_error)
    new_grad = optree.tree_map(lambda g, old: g.to(old.dtype), last.grad, state.grad)
    return scale_tree(last.stepsize, updates), ScaleByZoomLinesearchState(
        last.stepsize, last.value, new_grad, info
    )


def scale_by_zoom_linesearch(
    max_linesearch_steps: int,
    max_learning_rate: Scalar | None = None,
    tol: Scalar = 0.0,
    increase_factor: Scalar = 2.0,
    slope_rtol: Scalar = 1e-4,
    curv_rtol: Scalar = 0.9,
    approx_dec_rtol: Scalar | None = 1e-6,
    stepsize_precision: Scalar = 1e-5,
    initial_guess_strategy: str = "keep",
    verbose: bool = False,
) -> GradientTransformation:
    """Zoom line search for a sufficient decrease and a small curvature (the strong Wolfe
    conditions), optax's ``scale_by_zoom_linesearch``: scales the updates ``u`` by a step
    size ``eta`` with
    ``f(w + eta u) <= f(w) + slope_rtol * eta * <u, grad f(w)> + tol`` (or, near a
    minimum, Hager and Zhang's approximate decrease, unless `approx_dec_rtol` is None) and
    ``|<u, grad f(w + eta u)>| <= curv_rtol * |<u, grad f(w)>| + tol``, in at most
    `max_linesearch_steps` evaluations of the loss and its gradient. The first trial is 1
    (``initial_guess_strategy="one"``) or the last step size (``"keep"``); later ones grow
    by `increase_factor` (up to `max_learning_rate`) until an interval holds a good step
    size, then shrink it by interpolation until one is found or the interval is shorter
    than `stepsize_precision`. A search that fails returns the best step size with a
    sufficient decrease, if any. ``curv_rtol=math.inf`` drops the curvature condition.

    ``update(updates, state, params, value=loss, grad=grads, value_fn=fn, **data)``:
    `fn(params, **data)` returns the loss (a 0-d tensor); `value` and `grad` are its value
    and gradient at `params`. The state keeps the loss and gradient at the point accepted,
    which `value_and_grad_from_state` hands to the next step. optax's ``lbfgs`` is
    ``fo.chain(fo.scale_by_lbfgs(), fo.scale(-1.0),
    fo.scale_by_zoom_linesearch(20, initial_guess_strategy="one"))``. `verbose` (optax's
    debug printing) is accepted and prints nothing.

    Example:
        >>> import torch, funcopt as fo
        >>> fn = lambda p: ((p["x"] - 1.0) ** 2).sum()
        >>> tx = fo.chain(fo.sgd(lr=1.0), fo.scale_by_zoom_linesearch(15))
        >>> params = {"x": torch.tensor([3.0, -1.0])}
        >>> state = tx.init(params)
        >>> value, grad = fo.value_and_grad_from_state(fn)(params, state=state)
        >>> updates, state = tx.update(grad, state, params, value=value, grad=grad, value_fn=fn)
        >>> fo.apply_updates(params, updates)["x"], float(state[1].learning_rate)
        (tensor([1., 1.]), 0.5)
    """
    who = "scale_by_zoom_linesearch"
    if isinstance(max_linesearch_steps, bool) or not isinstance(max_linesearch_steps, int):
        raise TypeError(f"{who}: max_linesearch_steps must be an int, got {max_linesearch_steps!r}")
    if initial_guess_strategy not in ("one", "keep"):
        raise ValueError(
            f"{who}: initial_guess_strategy must be 'one' or 'keep', got {initial_guess_strategy!r}"
        )
    hp: dict[str, Any] = dict(
        max_linesearch_steps=max_linesearch_steps, max_learning_rate=max_learning_rate, tol=tol,
        increase_factor=increase_factor, slope_rtol=slope_rtol, curv_rtol=curv_rtol,
        approx_dec_rtol=approx_dec_rtol, stepsize_precision=stepsize_precision,
        initial_guess_strategy=initial_guess_strategy,
    )  # fmt: skip
    return GradientTransformation(_zoom_init, functools.partial(_zoom_update, hp))
