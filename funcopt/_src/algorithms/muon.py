"""Muon: momentum orthogonalized by a Newton–Schulz iteration (``torch.optim.Muon``).

.. math::
   B_t = \\mu B_{t-1} + (1 - \\mu) g_t, \\quad
   \\tilde B_t = \\begin{cases} (1 - \\mu) g_t + \\mu B_t & \\text{Nesterov} \\\\ B_t \\end{cases}, \\quad
   O_t = \\mathrm{NS}^{(a, b, c)}_k(\\tilde B_t; \\epsilon)

   \\theta_t = (1 - \\gamma\\lambda)\\,\\theta_{t-1} - \\gamma\\, s(A, B)\\, O_t, \\quad
   s(A, B) = \\sqrt{\\max(1, A / B)} \\text{ (original) or } 0.2 \\sqrt{\\max(A, B)} \\text{ (match\\_rms\\_adamw)}

for an ``A x B`` param. Each of the ``k`` Newton–Schulz steps maps ``X`` (scaled to a
Frobenius norm of 1, and transposed to be wide) to ``a X + (b G + c G^2) X`` with
``G = X X^T``; torch computes them in bfloat16 (``ns_dtype``, a funcopt extra, may
choose another dtype). Muon steps 2-D params only.
"""

from __future__ import annotations

import functools
import math
from typing import Any, NamedTuple

import optree
import torch
from torch import Tensor

from ..core.base import GradientTransformation, Params
from ..engine.algorithm import Algorithm
from ..engine.bounds import Bound, Check, Hyperparams
from ..engine.ops import Coef, Ops, _cast, nonzero

DEFAULT_NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)  # torch's (Keller Jordan's) a, b, c
ADJUST_LR_FNS = ("original", "match_rms_adamw")


class MuonState(NamedTuple):
    """Per-param state with torch's key: the momentum buffer (zeros at the start)."""

    momentum_buffer: Params


def _momentum_buffer(p: Tensor) -> Tensor:
    if p.is_complex():  # torch checks it as it creates the state, in its step
        raise RuntimeError("Muon does not support complex parameters")
    return torch.zeros_like(p, memory_format=torch.preserve_format)


def _initial(**_: Any) -> MuonState:
    return MuonState(momentum_buffer=_momentum_buffer)


def _creates(**_: Any) -> tuple[str, ...]:
    """What pickles made before the algorithms pickled by name refer to (kept for those)."""
    return ("momentum_buffer",)


def _schedule(
    *, lr: Coef, momentum: Coef, weight_decay: Coef, **_: Any
) -> tuple[tuple[()], tuple[Coef, Coef, Any]]:
    # torch's step takes a tensor lr as a tensor (its products round in its dtype):
    # the adapters' step gets it as a number, and its dtype with it
    lr_dtype = lr.dtype if isinstance(lr, Tensor) else None
    return (), (1 - momentum, 1 - lr * weight_decay, lr_dtype)


def _addmm(m: Tensor, x: Tensor, y: Tensor, beta: Coef, alpha: Coef = 1) -> Tensor:
    """``beta * m + alpha * (x @ y)``: ``torch.addmm`` as torch's step calls it (rounding
    once), or for tensor coefficients in products cast to the matrices' dtype."""
    if isinstance(beta, Tensor) or isinstance(alpha, Tensor):
        return m * _cast(beta, m) + (x @ y) * _cast(alpha, m)
    return torch.addmm(m, x, y, beta=beta, alpha=alpha)


def _clamp_min(x: Tensor, low: Coef) -> Tensor:
    """``x.clamp(min=low)``, a tensor `low` (a tensor hyperparameter) in `x`'s dtype."""
    if isinstance(low, Tensor):
        return torch.maximum(x, low.to(x.dtype))
    return torch.clamp(x, min=low)


def newton_schulz(
    x: Tensor,
    ns_coefficients: tuple[Coef, Coef, Coef],
    ns_steps: int,
    eps: Coef,
    dtype: torch.dtype = torch.bfloat16,
) -> tuple[Tensor, Tensor]:
    """torch's ``_zeropower_via_newtonschulz``: ``ns_steps`` quintic Newton–Schulz steps
    in `dtype` from `x` over its Frobenius norm (at least `eps`). Returns the result and
    the scaled `x` (torch scales `x` itself in place where it is already of `dtype`).
    Only ops with batching rules: it runs under ``vmap`` over a stack of matrices."""
    if ns_steps >= 100:
        raise ValueError("Number of steps must be less than 100 for computational efficiency")
    if x.dim() != 2:
        raise ValueError("Input tensor gradient must be a 2D matrix")
    if len(ns_coefficients) != 3:
        raise ValueError("Coefficients must be a tuple of exactly 3 values")
    a, b, c = ns_coefficients
    tall = x.size(0) > x.size(1)
    ortho = x.to(dtype).mT if tall else x.to(dtype)  # wide: X X^T is the smaller Gram matrix
    ortho = ortho / _clamp_min(ortho.norm(), eps)  # a spectral norm of at most 1
    scaled = ortho.mT if tall else ortho
    for _ in range(ns_steps):
        gram = ortho @ ortho.mT
        ortho = _addmm(ortho, _addmm(gram, gram, gram, beta=b, alpha=c), ortho, beta=a)
    return (ortho.mT if tall else ortho), scaled


def adjust_lr(lr: Coef, adjust_lr_fn: str | None, shape: torch.Size) -> Coef:
    """torch's ``_adjust_lr``: the learning rate for an ``A x B`` param."""
    rows, cols = shape[:2]
    if adjust_lr_fn is None or adjust_lr_fn == "original":
        ratio = math.sqrt(max(1, rows / cols))
    elif adjust_lr_fn == "match_rms_adamw":
        ratio = 0.2 * math.sqrt(max(rows, cols))
    else:
        ratio = 1.0
    return lr * ratio


def _elementwise(
    o: Ops,
    out: Tensor | None,
    p: Tensor | None,
    g: Tensor,
    momentum_buffer: Tensor | None,
    coefficients: tuple[Coef, Coef, Any],
    *,
    lr: Coef,
    weight_decay: Coef,
    momentum: Coef,
    nesterov: bool,
    ns_coefficients: tuple[Coef, Coef, Coef],
    eps: Coef,
    ns_steps: int,
    adjust_lr_fn: str | None,
    ns_dtype: torch.dtype = torch.bfloat16,
    **_: Any,
) -> tuple[Tensor, tuple[Tensor]]:
    one_minus_momentum, decay, lr_dtype = coefficients
    if g.dim() != 2:
        raise ValueError(
            f"Param gradient must be a 2D matrix (Muon got one of shape {tuple(g.shape)}): give "
            "other params another optimizer (fo.partition), and vmap init and update over a stack of models"
        )
    if lr_dtype is not None and not isinstance(lr, Tensor):  # the adapters' step
        lr = torch.tensor(lr, dtype=lr_dtype)
    if momentum_buffer is None:  # a loaded state without it: torch's step creates zeros
        momentum_buffer = torch.zeros_like(g, memory_format=torch.preserve_format)
    buf = o.lerp_(momentum_buffer, g, one_minus_momentum)
    update = o.lerp(g, buf, momentum) if nesterov else buf
    ortho, scaled = newton_schulz(update, ns_coefficients, ns_steps, eps, ns_dtype)
    if update is buf and buf.dtype == ns_dtype:
        buf = scaled  # torch 2.13 scales its momentum buffer itself then (its bfloat16 view)
    if nonzero(weight_decay):
        out = o.decay_(out, p, decay)
    out = o.add_(out, ortho.to(g.dtype), alpha=-adjust_lr(lr, adjust_lr_fn, g.shape))
    return out, (buf,)


def _validate(hp: Hyperparams) -> None:
    adjust_lr_fn = hp.get("adjust_lr_fn")
    if adjust_lr_fn is not None and adjust_lr_fn not in ADJUST_LR_FNS:
        raise ValueError(f"Adjust learning rate function {adjust_lr_fn} is not supported")


MUON = Algorithm(
    name="Muon",
    state=MuonState,
    counters=(),
    initial=_initial,
    schedule=_schedule,
    elementwise=_elementwise,
    bounds=(
        Bound("lr", "Learning rate should be >= 0 but is: {}"),
        Bound("momentum", "momentum should be >= 0 but is: {}"),
        Bound("weight_decay", "weight decay should be >= 0 but is: {}"),
        Check(_validate),
    ),
    per_element=False,  # matrix products and a norm of the whole param
)


def muon(
    lr: float | Tensor = 1e-3,
    weight_decay: float | Tensor = 0.1,
    momentum: float | Tensor = 0.95,
    nesterov: bool = True,
    ns_coefficients: tuple[float | Tensor, float | Tensor, float | Tensor] = DEFAULT_NS_COEFFICIENTS,
    eps: float | Tensor = 1e-7,
    ns_steps: int = 5,
    adjust_lr_fn: str | None = None,
    *,
    ns_dtype: torch.dtype = torch.bfloat16,
) -> GradientTransformation:
    """Muon as a pure transformation, with ``torch.optim.Muon``'s arguments and defaults.

    Args:
        lr: learning rate.
        weight_decay: decoupled decay: the params are multiplied by ``1 - lr * weight_decay``.
        momentum: momentum factor.
        nesterov: orthogonalize the Nesterov average of the gradient and the momentum.
        ns_coefficients: the Newton–Schulz polynomial's coefficients ``(a, b, c)``.
        eps: the smallest norm the Newton–Schulz input is divided by.
        ns_steps: Newton–Schulz steps (under 100).
        adjust_lr_fn: the learning rate's scaling by the param's shape ``A x B``:
            ``"original"`` (or None) ``sqrt(max(1, A / B))``, ``"match_rms_adamw"``
            ``0.2 * sqrt(max(A, B))``.
        ns_dtype: the dtype of the Newton–Schulz iteration (funcopt only; bfloat16 is
            torch's). Its rounding makes the update a step function of its input: a
            derivative through several steps, or a comparison of a batched run with a
            loop, asks for float32 or float64.

    Every param must be a matrix (2-D; under ``vmap``, 2-D in each member): give the
    others another optimizer (see `partition`). Complex params are not supported, as
    in torch. ``weight_decay`` needs the update's params.

    Example:
        >>> import torch, funcopt as fo
        >>> params = {"w": torch.tensor([[1.0, 0.0], [0.0, 2.0]])}
        >>> tx = fo.muon(lr=0.1, weight_decay=0.0)
        >>> state = tx.init(params)
        >>> updates, state = tx.update({"w": torch.tensor([[1.0, 0.0], [0.0, 3.0]])}, state, params)
        >>> fo.apply_updates(params, updates)["w"]
        tensor([[0.8867, 0.0000],
                [0.0000, 1.9250]])
    """
    tx = MUON.transform(
        lr=lr,
        weight_decay=weight_decay,
        momentum=momentum,
        nesterov=nesterov,
        ns_coefficients=ns_coefficients,
        eps=eps,
        ns_steps=ns_steps,
        adjust_lr_fn=adjust_lr_fn,
        ns_dtype=ns_dtype,
    )
    return GradientTransformation(functools.partial(_init_matrices, tx.init), tx.update)


def _init_matrices(init: Any, params: Params) -> Any:
    """`init`, then a check that every param is a matrix, as torch's Muon checks its
    params at construction (its step would refuse the gradient of any other). The
    engine's checks of the leaves (tensors, float dtypes) come first."""
    state = init(params)
    for i, p in enumerate(optree.tree_leaves(params, none_is_leaf=True)):
        if isinstance(p, Tensor) and p.ndim != 2:
            raise ValueError(
                f"Muon only supports 2D parameters whereas we found a parameter with size: {p.size()} "
                f"(leaf {i} of the params). Give the others another optimizer, for example with fo.partition."
            )
    return state
