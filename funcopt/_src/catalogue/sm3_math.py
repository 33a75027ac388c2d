"""SM3's step of one tensor, written once: its accumulator kept as one vector per
dimension, and its momentum. The functional `scale_by_sm3` runs it with `PURE` ops (the
engine's `Pure` and SM3's own: new tensors, coefficients may be 0-d tensors); the drop-in
class ``fo.SM3`` with `IN_PLACE` ops (the engine's `InPlace` and SM3's own), which
overwrite the vectors and the momentum (coefficients are numbers)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ..engine import ops

__all__ = ["IN_PLACE", "PURE", "sm3_moments"]

Coef = Any  # a Python number, or a 0-d tensor (PURE)


def axis_maxima(t: Tensor) -> list[Tensor]:
    """For each dimension k of `t`, its maximum over the other dimensions, as a vector.
    Halves first (the maxima over the trailing half's dimensions, then over the leading
    half's), so that every full pass reduces whole trailing or leading blocks: 2 passes
    over `t` for any number of dimensions, not one strided pass per dimension (a max is
    exact, so any order gives the same values)."""
    if t.ndim == 1:
        return [t]
    if t.ndim == 2:
        return [t.amax(1), t.amax(0)]
    h = t.ndim // 2
    return axis_maxima(t.amax(dim=tuple(range(h, t.ndim)))) + axis_maxima(t.amax(dim=tuple(range(h))))


def outer_minimum(vs: list[Tensor]) -> Tensor:
    """The elementwise minimum of the broadcast vectors `vs` (each of shape ``1 x .. x n_k
    x .. x 1``), the halves first: one full-size op (a min is exact, any order)."""
    if len(vs) == 1:
        return vs[0]
    h = len(vs) // 2
    return torch.minimum(outer_minimum(vs[:h]), outer_minimum(vs[h:]))


class InPlace(ops.InPlace):
    """The engine's `InPlace`, and SM3's own ops, which write into the accumulator
    vectors and the momentum."""

    @staticmethod
    def accumulate(low: Tensor, g: Tensor, c0: Coef, c2: Coef) -> Tensor:
        """``c0 * g^2 + c2 * low`` into `low` (a new tensor, or a 1-d param's vector)."""
        if c2 != 1:
            low.mul_(c2)
        return low.addcmul_(g, g, value=c0)

    @staticmethod
    def scaled(g: Tensor, accum: Tensor, eps: Coef) -> Tensor:
        """``g / sqrt(accum + eps)``, 0 where ``accum`` is not above 0 (a new tensor)."""
        return torch.add(accum, eps).rsqrt_().masked_fill_(accum.gt(0).logical_not_(), 0.0).mul_(g)

    @staticmethod
    def ema(nu: Tensor, up: Tensor, b1: Coef) -> Tensor:
        """``(1 - b1) * up + b1 * nu`` into `nu`."""
        return nu.mul_(b1).add_(up, alpha=1 - b1)

    @staticmethod
    def per_axis(accum: Tensor, mu: list[Tensor]) -> list[Tensor]:
        """The new vectors: ``accum``'s maximum over the other dimensions, into `mu`."""
        if accum.ndim < 2:
            return mu  # (`accumulate` wrote into the vector)
        return [m.copy_(v) for m, v in zip(mu, axis_maxima(accum))]


class Pure(ops.Pure):
    """The engine's `Pure`, and SM3's own ops: new tensors; mutates nothing."""

    @staticmethod
    def accumulate(low: Tensor, g: Tensor, c0: Coef, c2: Coef) -> Tensor:
        return c0 * g**2 + c2 * low

    @staticmethod
    def scaled(g: Tensor, accum: Tensor, eps: Coef) -> Tensor:
        return g * torch.where(accum > 0, torch.rsqrt(accum + eps), 0.0)

    @staticmethod
    def ema(nu: Tensor, up: Tensor, b1: Coef) -> Tensor:
        return (1 - b1) * up + b1 * nu

    @staticmethod
    def per_axis(accum: Tensor, mu: list[Tensor]) -> list[Tensor]:
        return [accum] if accum.ndim < 2 else axis_maxima(accum)


IN_PLACE = InPlace()
PURE = Pure()


def sm3_moments(
    o: Any, g: Tensor, mu: list[Tensor], nu: Tensor, *, c0: Coef, c2: Coef, b1: Coef, eps: Coef
) -> tuple[list[Tensor], Tensor]:
    """SM3's step of a tensor's gradient `g` (optax's ``scale_by_sm3``): the accumulator
    ``c0 * g^2 + c2 * min over dimensions of mu`` (``c0 = 1 - b2``, or 1 where
    ``b2 = 1``), the gradient scaled by it, and the momentum `nu` of that. Returns the
    new per-dimension vectors and the momentum, which is the update's direction."""
    if g.ndim < 2:
        low = mu[0]  # (IN_PLACE: the accumulator is then written into the vector itself)
    else:
        shaped = [m.reshape([1] * k + [g.shape[k]] + [1] * (g.ndim - k - 1)) for k, m in enumerate(mu)]
        low = outer_minimum(shaped)
    accum = o.accumulate(low, g, c0, c2)
    nu = o.ema(nu, o.scaled(g, accum, eps), b1)
    return o.per_axis(accum, mu), nu
