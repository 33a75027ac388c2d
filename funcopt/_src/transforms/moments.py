"""optax's moment accumulators: `trace` (momentum), `ema`, `scale_by_adam` and `scale_by_rms`, each
with its math written once against the ops (`math(o, u, owned, p, buffers, c)`) for the pure
update and the in-place chain of the torch face (torch/chain_inplace.py); `scale_by_adam`'s is
`fo.adam`'s own (algorithms/adam.py, through from_algorithm.py), `trace`'s SGD's momentum
(algorithms/sgd.py's ``momentum_step``)."""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import optree
import torch
from torch import Tensor

from ..algorithms import adam, sgd
from ..core.base import (
    GradientTransformation,
    Params,
    State,
    Updates,
)
from ..core.hyperparams import accepts_schedules
from ..engine.ops import Pure, nonzero
from .blocks import (
    _alike,
    _average_of_squares,
    _bias_correction,
    _buffer,
    _check_dtype,
    _check_state,
    _columns,
    _count,
    _increment,
    _zeros,
    wide_count,
)
from .clipping import Scalar, coef
from .from_algorithm import BlockMath, betas_and_eps, step_leaves

__all__ = [
    "EmaState",
    "ScaleByAdamState",
    "ScaleByRmsState",
    "ScaleByRmsWithCountState",
    "TraceState",
    "ema",
    "scale_by_adam",
    "scale_by_rms",
    "trace",
]


class TraceState(NamedTuple):
    """The trace of past updates, like the params (optax's ``TraceState``)."""

    trace: Params


def _trace_init(accumulator_dtype: torch.dtype | None, params: Params) -> TraceState:
    return TraceState(trace=_zeros(params, accumulator_dtype))


def _trace_update(
    decay: Scalar,
    nesterov: bool,
    accumulator_dtype: torch.dtype | None,
    updates: Updates,
    state: State,
    params: Params | None = None,
    **extra_args: Any,
) -> tuple[Updates, State]:
    who = "trace update"
    _check_state(state, TraceState, who)
    (gs, ts), unflatten = _columns(who, updates, state, ("trace",))
    out, new = list(gs), list(ts)
    for i, (g, t) in enumerate(zip(gs, ts)):
        if g is None:
            continue
        g, t = _alike(g, _buffer(who, i, t))
        out[i], _, (new_t,) = _trace_math(nesterov, Pure, g, False, None, (t,), (coef(decay, g),))
        new[i] = new_t if accumulator_dtype is None else new_t.to(accumulator_dtype)
    return unflatten(out), TraceState(unflatten(new))


def _trace_math(nesterov: bool, o: Any, u: Any, owned: bool, p: Any, buffers: Any, c: Any) -> Any:
    """``trace = updates + decay * trace``; the update is the trace, or ``updates + decay
    * trace`` with `nesterov`: SGD's momentum (``sgd.momentum_step``) with no dampening,
    its Nesterov direction optax's product then sum."""
    ((t0,), (decay,)) = buffers, c
    direction, t = sgd.momentum_step(o, u, t0, decay, 0, nesterov, fused_nesterov=False)
    return direction, nesterov, (t,)


@accepts_schedules
def trace(
    decay: Scalar, nesterov: bool = False, accumulator_dtype: torch.dtype | None = None
) -> GradientTransformation:
    """Momentum: ``trace = updates + decay * trace``, the new updates being the trace
    (``updates + decay * trace`` with `nesterov`), as optax's ``trace``; torch's SGD
    momentum without dampening. `accumulator_dtype` is the dtype of the stored trace
    (default: the params').

    Example:
        >>> import torch, funcopt as fo
        >>> tx = fo.trace(decay=0.9)
        >>> grads = [torch.ones(2)]
        >>> updates, state = tx.update(grads, tx.init(grads))
        >>> tx.update(grads, state)[0]
        [tensor([1.9000, 1.9000])]
    """
    _check_dtype("trace: accumulator_dtype", accumulator_dtype)
    return GradientTransformation(
        functools.partial(_trace_init, accumulator_dtype),
        functools.partial(_trace_update, decay, nesterov, accumulator_dtype),
    )


class EmaState(NamedTuple):
    """The step count and the moving average, like the params (optax's ``EmaState``)."""

    count: Tensor  # type: ignore[assignment]  # optax's name, which shadows tuple.count
    ema: Params


def _ema_init(accumulator_dtype: torch.dtype | None, params: Params) -> EmaState:
    return EmaState(count=_count(params), ema=_zeros(params, accumulator_dtype))


def _ema_update(
    decay: Scalar,
    debias: bool,
    accumulator_dtype: torch.dtype | None,
    updates: Updates,
    state: State,
    params: Params | None = None,
    **extra_args: Any,
) -> tuple[Updates, State]:
    who = "ema update"
    _check_state(state, EmaState, who)
    (gs, es), unflatten = _columns(who, updates, state, ("ema",))
    count = _increment(state.count)
    scalars = _ema_scalars(decay, debias, count)
    out, new = list(gs), list(es)
    for i, (g, e) in enumerate(zip(gs, es)):
        if g is None:
            continue
        g, e = _alike(g, _buffer(who, i, e))
        out[i], _, (new_e,) = _ema_math(debias, Pure, g, False, None, (e,), [coef(x, g) for x in scalars])
        new[i] = new_e if accumulator_dtype is None else new_e.to(accumulator_dtype)
    return unflatten(out), EmaState(count, unflatten(new))


def _ema_scalars(decay: Scalar, debias: bool, count: Tensor) -> tuple[Any, ...]:
    """`_ema_math`'s coefficients at the step whose count (incremented) is `count`."""
    return 1 - decay, _bias_correction(decay, count) if debias else 1


def _ema_math(debias: bool, o: Any, u: Any, owned: bool, p: Any, buffers: Any, c: Any) -> Any:
    """``ema = (1 - decay) * updates + decay * ema`` (as one lerp), debiased or not."""
    ((e0,), (weight, correction)) = buffers, c
    e = o.lerp_(e0, u, weight)
    if debias:
        return o.div(e, correction), True, (e,)
    return e, False, (e,)


@accepts_schedules
def ema(
    decay: Scalar, debias: bool = True, accumulator_dtype: torch.dtype | None = None
) -> GradientTransformation:
    """An exponential moving average of the updates, ``ema = (1 - decay) * updates +
    decay * ema``, divided by ``1 - decay**count`` with `debias` (optax's ``ema``).
    `accumulator_dtype` is the dtype of the stored average (default: the params').

    Example:
        >>> import torch, funcopt as fo
        >>> tx = fo.ema(decay=0.9)
        >>> grads = [torch.full((2,), 2.0)]
        >>> tx.update(grads, tx.init(grads))[0]  # debiased: the first update itself
        [tensor([2., 2.])]
    """
    _check_dtype("ema: accumulator_dtype", accumulator_dtype)
    return GradientTransformation(
        functools.partial(_ema_init, accumulator_dtype),
        functools.partial(_ema_update, decay, debias, accumulator_dtype),
    )


class ScaleByAdamState(NamedTuple):
    """The step count and Adam's moments, like the params (optax's ``ScaleByAdamState``)."""

    count: Tensor  # type: ignore[assignment]  # optax's name, which shadows tuple.count
    mu: Params
    nu: Params


def _adam_init(mu_dtype: torch.dtype | None, params: Params) -> ScaleByAdamState:
    return ScaleByAdamState(count=_count(params), mu=_zeros(params, mu_dtype), nu=_zeros(params, None))


def _adam_update(
    b1: Scalar,
    b2: Scalar,
    eps: Scalar,
    eps_root: Scalar,
    mu_dtype: torch.dtype | None,
    nesterov: bool,
    updates: Updates,
    state: State,
    params: Params | None = None,
    **extra_args: Any,
) -> tuple[Updates, State]:
    who = "scale_by_adam update"
    _check_state(state, ScaleByAdamState, who)
    scalars = _adam_scalars(b1, b2, eps, eps_root, nesterov, state.count)
    math = _adam_math(b2, nesterov)
    out, (mu, nu) = step_leaves(who, math, scalars, updates, state, ("mu", "nu"), (mu_dtype, "own"))
    return out, ScaleByAdamState(_increment(state.count), mu, nu)


def _adam_math(b2: Scalar, nesterov: bool) -> BlockMath:
    """``scale_by_adam``'s math: `fo.adam`'s (``adam._elementwise``), its second moment one
    lerp where `b2` is a tensor (see ``adam._second_moment``)."""
    return BlockMath(
        adam._elementwise, 4, betas_and_eps, absent=1, weight_decay=0, amsgrad=False, maximize=False,
        decoupled_weight_decay=False, nesterov=bool(nesterov), lerp_second_moment=isinstance(b2, Tensor),
        root_of_quotient=True,
    )  # fmt: skip


def _adam_scalars(
    b1: Scalar, b2: Scalar, eps: Scalar, eps_root: Scalar, nesterov: bool, count: Tensor
) -> tuple[Any, ...]:
    """`_adam_math`'s coefficients and per-step hyperparameters after `count` steps: Adam's
    schedule (``adam._schedule``) with a learning rate of -1, in float64 (float32 on MPS)."""
    _, coefficients = adam._schedule(
        wide_count(count), lr=-1, betas=(b1, b2), weight_decay=0, counter_dtypes=(None,), nesterov=nesterov
    )
    # the denominator is optax's sqrt(nu / bc2 + eps_root) + eps (`root_of_quotient`): the
    # math reads no sqrt(bc2), given as 1
    if nesterov:  # the step size is 1 (-lr): the bias correction is in the numerator's weights
        step_size, _, bc2, decay, momentum_weight, grad_weight = coefficients
        return step_size, 1, bc2, decay, momentum_weight, grad_weight, b1, b2, eps, eps_root
    # mu * s / (sqrt(nu / bc2 + eps_root) + eps), with s = 1 / bc1 the step size, is
    # mu / (sqrt(nu / (bc2 * s**2) + eps_root / s**2) + eps / s), a step size of 1: an op
    # fewer per element
    s, _, bc2, decay = coefficients
    root = eps_root / (s * s) if nonzero(eps_root) else eps_root
    return 1, 1, bc2 * (s * s), decay, b1, b2, eps / s, root


@accepts_schedules
def scale_by_adam(
    b1: Scalar = 0.9,
    b2: Scalar = 0.999,
    eps: Scalar = 1e-8,
    eps_root: Scalar = 0.0,
    mu_dtype: torch.dtype | None = None,
    *,
    nesterov: bool = False,
) -> GradientTransformation:
    """Adam's scaling, without the learning rate (optax's ``scale_by_adam``):
    ``mu_hat / (sqrt(nu_hat + eps_root) + eps)`` with the bias-corrected moving averages
    of the updates (`b1`) and of their squares (`b2`); `nesterov` takes Dozat's Nesterov
    momentum. `mu_dtype` is the dtype of the stored first moment (default: the params').
    Chain it with `scale_by_learning_rate` for Adam. Its ``sqrt`` has derivative 0 at 0,
    so a meta-gradient through it is finite where an update entry is exactly 0, also
    with ``eps_root=0`` (optax's is NaN there).

    Example:
        >>> import torch, funcopt as fo
        >>> tx = fo.scale_by_adam()
        >>> grads = [torch.tensor([0.5, -2.0])]
        >>> tx.update(grads, tx.init(grads))[0]  # the first step: the sign, to round-off
        [tensor([ 1., -1.])]
    """
    _check_dtype("scale_by_adam: mu_dtype", mu_dtype)
    return GradientTransformation(
        functools.partial(_adam_init, mu_dtype),
        functools.partial(_adam_update, b1, b2, eps, eps_root, mu_dtype, nesterov),
    )


class ScaleByRmsState(NamedTuple):
    """The moving average of squared updates, like the params (optax's ``ScaleByRmsState``)."""

    nu: Params


class ScaleByRmsWithCountState(NamedTuple):
    """The step count and the moving average of squared updates (optax's
    ``ScaleByRmsWithCountState``), for `scale_by_rms` with `bias_correction`."""

    count: Tensor  # type: ignore[assignment]  # optax's name, which shadows tuple.count
    nu: Params


def _full(params: Params, value: Scalar) -> Params:
    """`value` in the shape and dtype of each param (None stays None)."""
    if isinstance(value, Tensor):
        return optree.tree_map(lambda p: torch.zeros_like(p) + coef(value, p), params)
    return optree.tree_map(lambda p: torch.full_like(p, value), params)


def _rms_init(initial_scale: Scalar, bias_correction: bool, params: Params) -> State:
    nu = _full(params, initial_scale)
    return (
        ScaleByRmsWithCountState(count=_count(params), nu=nu) if bias_correction else ScaleByRmsState(nu=nu)
    )


def _rms_update(
    decay: Scalar,
    eps: Scalar,
    eps_in_sqrt: bool,
    bias_correction: bool,
    updates: Updates,
    state: State,
    params: Params | None = None,
    **extra_args: Any,
) -> tuple[Updates, State]:
    who = "scale_by_rms update"
    _check_state(state, ScaleByRmsWithCountState if bias_correction else ScaleByRmsState, who)
    (gs, vs), unflatten = _columns(who, updates, state, ("nu",))
    count = _increment(state.count) if bias_correction else None
    scalars = _rms_scalars(decay, eps, count)
    math = functools.partial(_rms_math, eps_in_sqrt, bias_correction, not isinstance(decay, Tensor))
    out, new = list(gs), list(vs)
    for i, (g, v0) in enumerate(zip(gs, vs)):
        if g is None:
            continue
        g, v0 = _alike(g, _buffer(who, i, v0))
        out[i], _, (new[i],) = math(Pure, g, False, None, (v0,), [coef(x, g) for x in scalars])
    if count is None:
        return unflatten(out), ScaleByRmsState(unflatten(new))
    return unflatten(out), ScaleByRmsWithCountState(count, unflatten(new))


def _rms_scalars(decay: Scalar, eps: Scalar, count: Tensor | None) -> tuple[Any, ...]:
    """`_rms_math`'s coefficients at the step whose count (incremented) is `count` (None
    without bias correction)."""
    return decay, 1 - decay, 1 if count is None else _bias_correction(decay, count), eps


def _rms_math(
    eps_in_sqrt: bool,
    bias_correction: bool,
    fused: bool,
    o: Any,
    u: Any,
    owned: bool,
    p: Any,
    buffers: Any,
    c: Any,
) -> Any:
    """``updates / sqrt(nu_hat + eps)``, or ``updates / (sqrt(nu_hat) + eps)``; `fused`
    where `decay` is not a tensor."""
    ((v0,), (decay, one_minus_decay, correction, eps)) = buffers, c
    nu = _average_of_squares(o, fused, v0, u, decay, one_minus_decay)
    if eps_in_sqrt:  # nu_hat + eps: a new tensor (nu is the state)
        denom = o.add_(o.div(nu, correction), eps) if bias_correction else o.add(nu, eps)
        denom = o.sqrt_(denom)
    else:
        denom = o.add_(o.sqrt_(o.div(nu, correction)) if bias_correction else o.sqrt(nu), eps)
    return o.div(u, denom), True, (nu,)


@accepts_schedules
def scale_by_rms(
    decay: Scalar = 0.9,
    eps: Scalar = 1e-8,
    initial_scale: Scalar = 0.0,
    eps_in_sqrt: bool = True,
    bias_correction: bool = False,
) -> GradientTransformation:
    """Divide the updates by the root of the moving average of their squares (optax's
    ``scale_by_rms``, RMSprop's scaling): ``updates / sqrt(nu + eps)``, or ``updates /
    (sqrt(nu) + eps)`` without `eps_in_sqrt`. `initial_scale` is the average's initial
    value; `bias_correction` divides it by ``1 - decay**count`` (the state then holds
    the count).

    Example:
        >>> import torch, funcopt as fo
        >>> tx = fo.scale_by_rms(decay=0.75, eps=0.0)
        >>> grads = [torch.tensor([2.0, -4.0])]
        >>> tx.update(grads, tx.init(grads))[0]  # nu = 0.25 * grads**2
        [tensor([ 2., -2.])]
    """
    return GradientTransformation(
        functools.partial(_rms_init, initial_scale, bias_correction),
        functools.partial(_rms_update, decay, eps, eps_in_sqrt, bias_correction),
    )


torch.serialization.add_safe_globals(  # load with torch.load(weights_only=True)
    [EmaState, ScaleByAdamState, ScaleByRmsState, ScaleByRmsWithCountState, TraceState]
)
