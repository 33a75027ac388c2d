"""Schedule-free's own math, written once: the averaging weight of a step and the
interpolated step of ``y`` and ``z``. The functional `schedule_free` runs it on 0-d
tensors and with `PURE` ops leaf by leaf; the drop-in classes (``torch/schedule_free.py``)
on Python numbers and with `FOREACH` ops over a param group's lists, in place."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ..engine.ops import ForEach, Pure

__all__ = ["FOREACH", "PURE", "averaging", "interpolate"]

Coef = Any  # a Python number, or a 0-d tensor


def _maximum(a: Coef, b: Coef) -> Coef:
    return torch.maximum(a, b) if isinstance(a, Tensor) or isinstance(b, Tensor) else max(a, b)


def _ratio(weight: Coef, total: Coef) -> Coef:
    """``weight / total``, 0 for 0 / 0 (the learning rate 0 so far: no averaging yet)."""
    if not isinstance(weight, Tensor) and not isinstance(total, Tensor):
        return weight / total if total != 0 else 0.0
    return torch.where(
        torch.isnan(weight) | torch.isnan(total),
        torch.full_like(weight, float("nan")),
        torch.nan_to_num(weight / total, nan=0.0, posinf=float("inf")),
    )


def averaging(
    step: Coef, lr: Coef, lr_max: Coef, weight_sum: Coef, r: Coef, weight_lr_power: Coef
) -> tuple[Coef, Coef, Coef]:
    """The weight ``c`` of the new ``z`` in the average ``x`` at `step` (from 1): with
    ``w = step ** r * lr_max ** weight_lr_power``, ``c = w / sum(w)``. Returns ``c``, the
    new ``lr_max`` and the new ``sum(w)``."""
    lr_max = _maximum(lr_max, lr)
    weight = lr_max**weight_lr_power
    if isinstance(r, Tensor) or r != 0:
        weight = step**r * weight
    weight_sum = weight_sum + weight
    return _ratio(weight, weight_sum), lr_max, weight_sum


class _ForEach(ForEach):
    @staticmethod
    def toward_(out: list[Tensor], y: list[Tensor], z: list[Tensor], weight: float) -> list[Tensor]:
        """``y + weight * (z - y)`` into `out`, which is `y` (the params)."""
        torch._foreach_lerp_(out, z, weight)
        return out


class _Pure(Pure):
    @staticmethod
    def toward_(out: Tensor | None, y: Tensor, z: Tensor, weight: Coef) -> Tensor:
        """``weight * (z - y)`` added to the update `out` (None: a zero update)."""
        step = Pure.mul(z - y, weight)
        return step if out is None else out + step


FOREACH = _ForEach()
PURE = _Pure()


def interpolate(
    o: Any, out: Any, y: Any, z: Any, direction: Any, lr: Coef, c: Coef, b1: Coef
) -> tuple[Any, Any]:
    """The schedule-free step of the params ``y`` (into `out`) and of ``z``, the base
    iterate, along `direction` ``d``, with the average ``x`` not formed:

        y <- lerp(y, z, c) + lr * (b1 * (1 - c) - 1) * d        z <- z - lr * d

    (the authors' form; ``y = b1 * x + (1 - b1) * z``). A base optimizer's update ``u``
    is ``d`` with ``lr = -1``. Returns ``(out, z)``."""
    out = o.toward_(out, y, z, c)
    out = o.add_(out, direction, alpha=lr * (b1 * (1 - c) - 1))
    z = o.add_(z, direction, alpha=-lr)
    return out, z
