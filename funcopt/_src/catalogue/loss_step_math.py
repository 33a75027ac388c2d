"""MoMo's step and the Polyak step size, written once: both read the loss, and sums
over all params. The functional forms (``fo.momo``, ``fo.scale_by_polyak``) run them on
0-d tensors, with `PURE` list ops leaf by leaf, so that they trace and batch; the
drop-in classes ``fo.Momo``, ``fo.PolyakSGD`` on Python numbers, with `IN_PLACE`
foreach ops over a param group's lists, in place, the sums read on the host once per
step (as `distance_math`). The scalar helpers below take either kind."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ..engine.ops import nonzero

__all__ = ["EPS64", "momo_step", "polyak_step_size"]

Coef = Any  # a Python number (the classes) or a 0-d tensor (the functional forms)
EPS64 = torch.finfo(torch.float64).eps  # optax's jnp.finfo(float).eps, with x64


def _where(condition: Coef, a: Coef, b: Coef) -> Coef:
    if isinstance(condition, Tensor):
        return torch.where(condition, a, b)
    return a if condition else b


def _at_least(x: Coef, low: Coef) -> Coef:
    """``clamp(x, min=low)`` (a nan stays nan)."""
    return torch.clamp(x, min=low) if isinstance(x, Tensor) else x if x != x or x >= low else low


def _minimum(a: Coef, b: Coef) -> Coef:
    """``torch.minimum(a, b)`` in `b`'s dtype (a nan `b` stays nan)."""
    if isinstance(b, Tensor):
        return torch.minimum(torch.as_tensor(a, dtype=b.dtype, device=b.device), b)
    return a if a <= b else b


def _over(x: Coef, n: Coef) -> Coef:
    """``x / n``, 0 where ``n <= EPS64`` (optax's guard of a vanishing norm)."""
    if isinstance(n, Tensor):
        return torch.where(n <= EPS64, 0.0, x / n)
    return 0.0 if n <= EPS64 else x / n


def polyak_step_size(
    value: Coef, sq_norm: Coef, *, f_min: Coef, max_lr: Coef, eps: Coef, variant: str
) -> Coef:
    """The Polyak step size ``min((value - f_min) / (sq_norm + eps), max_lr)``, 0 where
    the denominator is below float64's eps (optax's ``scale_by_polyak``); ``"sps+"``
    clips the gap at 0. `sq_norm` is the squared norm of the update it scales."""
    gap = value - f_min
    if variant == "sps+":
        gap = torch.relu(gap) if isinstance(gap, Tensor) else max(gap, 0.0) if gap == gap else gap
    denom = sq_norm + eps
    if isinstance(denom, Tensor):
        return torch.where(denom <= EPS64, torch.zeros_like(denom), _minimum(max_lr, gap / denom))
    return 0.0 if denom <= EPS64 else _minimum(max_lr, gap / denom)


def momo_step(
    o: Any, out: Any, ps: Any, gs: Any, exp_avg: Any, scalars: tuple[Coef, Coef, Coef], first: Coef, value: Coef,
    *, lr: Coef, beta: Coef, lower_bound: Coef, weight_decay: Coef, adapt_lower_bound: bool,
) -> tuple[Any, Any, tuple[Coef, Coef, Coef]]:  # fmt: skip
    """MoMo's step (Schaipp et al. 2023; optax.contrib's ``momo``) of the lists `ps`,
    `gs`, `exp_avg` (its momentum) into `out`, with `scalars` ``(barf, gamma, lb)`` (the
    averages of the loss and of ``<g, p>``, the lower bound) and the loss `value`;
    `first` says whether this is the first step (no averaging yet). Returns ``(out,
    exp_avg, (barf, gamma, lb))``."""
    barf0, gamma0, lb = scalars
    bt = _where(first, 0.0, beta)
    barf = bt * barf0 + (1 - bt) * value
    exp_avg = o.add_(o.mul_(exp_avg, bt), gs, alpha=1 - bt)
    gp, norm, iprod = o.dots([(gs, ps), (exp_avg, exp_avg), (exp_avg, ps)])  # (the params not yet moved)
    gamma = bt * gamma0 + (1 - bt) * gp
    wd = 1 + lr * weight_decay
    this_lb = lb
    if adapt_lower_bound:
        cap = wd * (barf - gamma) + iprod
        this_lb = _where(cap < wd * lb, _at_least(cap / (2 * wd), lower_bound), lb)
    tau = _minimum(lr, _over(_at_least(wd * (barf - this_lb - gamma) + iprod, 0.0), norm))
    if nonzero(weight_decay):
        out = o.add_(out, ps, alpha=-(lr * weight_decay) / wd)
    out = o.add_(out, exp_avg, alpha=-tau)
    if adapt_lower_bound:
        lb = _at_least((barf + iprod - gamma) - 0.5 * tau * norm, lower_bound)
    return out, exp_avg, (barf, gamma, lb)
