"""Adafactor: second moments factored into row and column averages (``torch.optim.Adafactor``).

.. math::
   \\hat\\beta_{2,t} = 1 - t^{\\tau}, \\quad
   \\rho_t = \\min(\\gamma, 1/\\sqrt t), \\quad
   \\alpha_t = \\max(\\epsilon_2, \\mathrm{RMS}(\\theta_{t-1}))\\, \\rho_t

   R_t = \\hat\\beta_{2,t} R_{t-1} + (1 - \\hat\\beta_{2,t})\\, \\mathrm{mean}_{-1}(g_t^2), \\quad
   C_t = \\hat\\beta_{2,t} C_{t-1} + (1 - \\hat\\beta_{2,t})\\, \\mathrm{mean}_{-2}(g_t^2), \\quad
   \\hat V_t = \\frac{R_t C_t}{\\max(\\mathrm{mean}_{-2}(R_t), \\epsilon_1)}

   U_t = g_t / \\max(\\hat V_t, \\epsilon_1^2)^{1/2}, \\quad
   \\theta_t = (1 - \\gamma\\lambda)\\,\\theta_{t-1} - \\alpha_t\\, U_t / \\max(1, \\mathrm{RMS}(U_t) / d)

A param of more than one dimension keeps the row and column factors (``row_var``, shaped
like the param with its last dimension 1, ``col_var`` with its second-to-last 1), a
vector or a 0-d param the full ``variance``, as torch keeps them. The per-tensor
norms are read as Python numbers in the torch classes' step, as torch reads them; the
functional update keeps them in float64 tensors (traceable and batchable).
"""

from __future__ import annotations

import numbers
from typing import Any, NamedTuple

import torch
from torch import Tensor

from ..core.base import GradientTransformation, Params, readable
from ..engine.algorithm import Algorithm
from ..engine.bounds import Bound, Check, Hyperparams, check_pair
from ..engine.ops import Coef, Ops, nonzero, power


class AdafactorState(NamedTuple):
    """Per-param state with torch's keys: the step count, the row and column factors of
    the second moment for a param of two or more dimensions, the full second moment
    (``variance``) for the others (an empty node where a param has no such entry)."""

    step: Params
    row_var: Params
    col_var: Params
    variance: Params


def _real(p: Tensor) -> None:
    if p.is_complex():  # torch checks it as it creates the state, in its step
        raise RuntimeError("Adafactor does not support complex parameters")


def _row_var(p: Tensor) -> Tensor | None:
    _real(p)
    return p.new_zeros((*p.shape[:-1], 1)) if p.dim() > 1 else None


def _col_var(p: Tensor) -> Tensor | None:
    _real(p)
    return p.new_zeros((*p.shape[:-2], 1, p.shape[-1])) if p.dim() > 1 else None


def _variance(p: Tensor) -> Tensor | None:
    _real(p)
    return None if p.dim() > 1 else torch.zeros_like(p, memory_format=torch.preserve_format)


def _initial(**_: Any) -> AdafactorState:
    return AdafactorState(step=0.0, row_var=_row_var, col_var=_col_var, variance=_variance)


def _first_min(a: Coef, b: Coef) -> Coef:
    """Python's ``min(a, b)`` (`a` unless ``b < a``), as torch's step takes it, also of a
    tensor `a` it may read (torch's ``min(lr, 1 / sqrt(step))`` is a tensor lr or a
    float); where a tensor may not be read (traced, batched or differentiated),
    ``torch.where``."""
    if not isinstance(a, Tensor) and not isinstance(b, Tensor):
        return min(a, b)
    if not isinstance(b, Tensor) and not torch.compiler.is_compiling() and readable(a):
        return b if b < a else a
    return torch.where(torch.as_tensor(b < a), b, a)


def _schedule(
    step: Coef,
    *,
    lr: Coef,
    beta2_decay: Coef,
    weight_decay: Coef,
    **_: Any,
) -> tuple[tuple[Coef], tuple[Coef, Coef, Any, Coef]]:
    step = step + 1
    one_minus_beta2 = power(step, beta2_decay)
    rho = _first_min(lr, 1 / power(step, 0.5))
    # torch's step size is a tensor (rounding in its dtype) where it took a tensor lr:
    # the adapters' step gets it as a number, and its dtype with it
    rho_dtype = rho.dtype if isinstance(rho, Tensor) else None
    decay = 1 - lr * weight_decay
    return (step,), (one_minus_beta2, rho, rho_dtype, decay)


def _max(a: Coef, b: Coef) -> Coef:
    """Python's ``max(a, b)`` of numbers, as torch's step takes it; of tensors (`Pure`),
    ``torch.maximum`` in `b`'s dtype."""
    if not isinstance(a, Tensor) and not isinstance(b, Tensor):
        return max(a, b)
    if not isinstance(a, Tensor):
        return torch.clamp(b, min=a)
    return torch.maximum(a.to(b.dtype), b)


def _clamp_min(x: Tensor, low: Coef) -> Tensor:
    """``x.clamp(min=low)``, a tensor `low` (a tensor hyperparameter) in `x`'s dtype."""
    if isinstance(low, Tensor):
        return torch.maximum(x, low.to(x.dtype))
    return torch.clamp(x, min=low)


def _fits(t: Tensor | None, shape: tuple[int, ...] | None) -> bool:
    """Whether a buffer is absent where `shape` is None, else of that shape (compared
    size by size: the sizes may be symbolic, in a compiled step with dynamic shapes)."""
    if t is None or shape is None:
        return t is None and shape is None
    return t.dim() == len(shape) and all(a == b for a, b in zip(t.shape, shape))


def _check_buffers(
    g: Tensor, row_var: Tensor | None, col_var: Tensor | None, variance: Tensor | None
) -> None:
    """Raise if the buffers are not those `init` makes for a param shaped like `g`: the
    state was made for other params (the engine checks only buffers shaped like their
    param), where broadcasting would give the state and the update another shape."""
    # as usual (checked per param, at every step: cheaply)
    if g.dim() > 1:
        if (
            variance is None
            and row_var is not None
            and col_var is not None
            and row_var.shape == (*g.shape[:-1], 1)
            and col_var.shape == (*g.shape[:-2], 1, g.shape[-1])
        ):
            return
    elif row_var is None and col_var is None and variance is not None and variance.shape == g.shape:
        return
    if g.dim() > 1:
        expected = {
            "row_var": (*g.shape[:-1], 1),
            "col_var": (*g.shape[:-2], 1, g.shape[-1]),
            "variance": None,
        }
    else:
        expected = {"row_var": None, "col_var": None, "variance": tuple(g.shape)}
    given = {"row_var": row_var, "col_var": col_var, "variance": variance}
    if all(_fits(given[name], shape) for name, shape in expected.items()):
        return
    shapes = {name: None if t is None else tuple(t.shape) for name, t in given.items()}
    show = lambda shapes: ", ".join(f"{k} {'none' if v is None else v}" for k, v in shapes.items())  # noqa: E731
    raise ValueError(
        f"Adafactor update: a gradient of shape {tuple(g.shape)} needs {show(expected)} "
        f"but the state has {show(shapes)}: pass a state that init made from these params (in a "
        "torch optimizer, the param was replaced or resized: `del optimizer.state[param]` starts it afresh)"
    )


def _elementwise(
    o: Ops,
    out: Tensor | None,
    p: Tensor | None,
    g: Tensor,
    row_var: Tensor | None,
    col_var: Tensor | None,
    variance: Tensor | None,
    coefficients: tuple[Coef, Coef, Any, Coef],
    *,
    eps: tuple[Coef | None, Coef],
    d: Coef,
    weight_decay: Coef,
    maximize: bool,
    **_: Any,
) -> tuple[Tensor, tuple[Tensor | None, Tensor | None, Tensor | None]]:
    one_minus_beta2, rho, rho_dtype, decay = coefficients
    assert p is not None  # needs_params
    _check_buffers(g, row_var, col_var, variance)
    if rho_dtype is not None and not isinstance(rho, Tensor):  # the adapters' step
        rho = torch.tensor(rho, dtype=rho_dtype)
    eps1, eps2 = eps
    if eps1 is None:
        eps1 = torch.finfo(p.dtype).eps
    if maximize:
        g = o.neg(g)
    # of the param before its decay (torch's p.norm(2) is this norm, behind a layer of Python)
    alpha = _max(eps2, o.item(torch.linalg.vector_norm(p)) / p.numel() ** 0.5) * rho
    if nonzero(weight_decay):
        out = o.decay_(out, p, decay)
    if g.dim() > 1:
        # (g * g).mean over a dimension, without a temporary the size of g
        row_mean = torch.norm(g, dim=-1, keepdim=True).square().div(g.size(-1))
        row_var = o.lerp_(row_var, row_mean, one_minus_beta2)
        col_mean = torch.norm(g, dim=-2, keepdim=True).square().div(g.size(-2))
        col_var = o.lerp_(col_var, col_mean, one_minus_beta2)
        estimate = (row_var @ col_var).div(_clamp_min(row_var.mean(dim=-2, keepdim=True), eps1))
    else:
        variance = o.lerp_(variance, g * g, one_minus_beta2)
        estimate = variance
    update = _clamp_min(estimate, eps1 * eps1).rsqrt().mul(g)
    denom = _max(1.0, o.item(torch.linalg.vector_norm(update)) / (update.numel() ** 0.5 * d))
    out = o.add_(out, update, alpha=-alpha / denom)
    return out, (row_var, col_var, variance)


def _is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real)


def _validate(hp: Hyperparams) -> None:
    """torch's checks after lr's, in torch's order (on numbers: a tensor may be batched)."""
    beta2_decay, eps, d = hp.get("beta2_decay", -0.8), hp.get("eps", (None, 1e-3)), hp.get("d", 1.0)
    if _is_number(beta2_decay) and not 0.0 >= beta2_decay:
        raise ValueError(f"beta2_decay should be <= 0 but is: {beta2_decay}")
    check_pair("eps", eps)
    if eps[0] is not None and _is_number(eps[0]) and not 0.0 <= eps[0]:
        raise ValueError(f"epsilon1 should be >= 0 but is: {eps[0]}")
    if _is_number(eps[1]) and not 0.0 <= eps[1]:
        raise ValueError(f"epsilon2 should be >= 0 but is: {eps[1]}")
    if _is_number(d) and not 1.0 <= d:
        raise ValueError(f"Clipping threshold d should be >= 1 but is: {d}")
    weight_decay = hp.get("weight_decay", 0.0)
    if _is_number(weight_decay) and not 0.0 <= weight_decay:
        raise ValueError(f"weight_decay should be >= 0 but is: {weight_decay}")


ADAFACTOR = Algorithm(
    name="Adafactor",
    state=AdafactorState,
    counters=("step",),
    initial=_initial,
    schedule=_schedule,
    elementwise=_elementwise,
    bounds=(Bound("lr", "Learning rate should be >= 0 but is: {}"), Check(_validate, pairs=("eps",))),
    per_element=False,  # per-tensor norms and a matrix product
    buffers_like_param=False,
    needs_params=True,  # the step size scales with the param's RMS
)


def adafactor(
    lr: float | Tensor = 1e-2,
    beta2_decay: float | Tensor = -0.8,
    eps: tuple[float | Tensor | None, float | Tensor] = (None, 1e-3),
    d: float | Tensor = 1.0,
    weight_decay: float | Tensor = 0.0,
    *,
    maximize: bool = False,
) -> GradientTransformation:
    """Adafactor as a pure transformation, with ``torch.optim.Adafactor``'s arguments and
    defaults.

    Args:
        lr: the largest relative step size :math:`\\rho_t`, and the weight decay's factor.
        beta2_decay: the second moments' decay: ``1 - beta2`` at step t is ``t**beta2_decay``.
        eps: ``(epsilon1, epsilon2)``: epsilon1 (None: the param dtype's machine epsilon)
            keeps the denominators from zero; epsilon2 is the smallest param RMS the step
            size scales with.
        d: the clipping threshold of the update's RMS.
        weight_decay: decoupled decay: the params are multiplied by ``1 - lr * weight_decay``.
        maximize: maximize the objective instead of minimizing it.

    Every param needs the update's params (its step size scales with the param's RMS).
    Params of two or more dimensions keep factored second moments (``row_var`` and
    ``col_var``), the others a full ``variance``. Complex params are not supported
    (as in torch).

    Example:
        >>> import torch, funcopt as fo
        >>> params = {"w": torch.tensor([[1.0, -2.0], [3.0, 4.0]]), "b": torch.tensor([0.5, -0.5])}
        >>> tx = fo.adafactor(lr=0.1)
        >>> state = tx.init(params)
        >>> state.row_var["w"].shape, state.col_var["w"].shape, state.variance["b"].shape
        (torch.Size([2, 1]), torch.Size([1, 2]), torch.Size([2]))
        >>> grads = {"w": torch.tensor([[0.5, -0.5], [1.0, 2.0]]), "b": torch.tensor([0.1, 0.2])}
        >>> updates, state = tx.update(grads, state, params)
        >>> fo.apply_updates(params, updates)["b"]
        tensor([ 0.4500, -0.5500])
    """
    return ADAFACTOR.transform(
        lr=lr,
        beta2_decay=beta2_decay,
        eps=eps,
        d=d,
        weight_decay=weight_decay,
        maximize=maximize,
    )
