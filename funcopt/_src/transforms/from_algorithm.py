"""A building block's per-element math from an engine `Algorithm`'s, so that an
algorithm and the block of optax's that computes the same update share one copy of the
math: ``scale_by_adam`` runs `fo.adam`'s (``algorithms/adam.py``), ``scale_by_yogi``
`fo.Yogi`'s, ...

A block's math (see ``blocks.py``) is ``math(o, u, owned, p, buffers, c) -> (update,
owned, new buffers)``: it turns the update so far `u` into the block's. An algorithm's is
``elementwise(o, out, p, g, *buffers, coefficients, **hyperparams) -> (out, new
buffers)``: it adds its step to ``out``. The two meet where the algorithm steps a zero
update (``out`` None, not allocated, which every ops namespace takes) with `u` as its
gradient, a learning rate of -1 and no weight decay: its ``out`` is then the
block's update. The block computes the algorithm's coefficients with the algorithm's own
``schedule`` (at its count, as a float64 tensor), so both faces of the block, the pure
update and the in-place chain of ``fo.Optimizer`` (``torch/chain_inplace.py``), run the
same ops on the same values and agree bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from ..core.base import Params, State, Updates, a_kind, flatten_together
from ..engine.ops import Pure
from .blocks import _alike, _buffer, _columns
from .clipping import coef

__all__ = ["BlockMath", "betas_and_eps", "step_leaves"]


class BlockMath:
    """A block's ``math(o, u, owned, p, buffers, c)`` that runs `elementwise`, an
    algorithm's, on a zero update with `u` as the gradient (see the module's text).

    `c` holds the algorithm's coefficients, then one value for each name in `per_step`:
    hyperparameters that the block computes at each step or takes as 0-d tensors (cast,
    as the coefficients, to each leaf's dtype). `hyperparams` makes the algorithm's
    keyword arguments from those values; `static` are the others (Python values, fixed for
    the block). The block's buffers are the algorithm's first ones; `absent` more, which
    the block does not hold, are passed as None (Adam's ``max_exp_avg_sq``)."""

    def __init__(
        self,
        elementwise: Callable[..., tuple[Any, Sequence[Any]]],
        per_step: int,
        hyperparams: Callable[..., dict[str, Any]],
        absent: int = 0,
        **static: Any,
    ) -> None:
        self.elementwise, self.per_step, self.hyperparams = elementwise, per_step, hyperparams
        self.absent, self.static = (None,) * absent, static

    def __call__(self, o: Any, u: Any, owned: bool, p: Any, buffers: Sequence[Any], c: Sequence[Any]) -> Any:
        k = len(c) - self.per_step
        out, new = self.elementwise(
            o, None, p, u, *buffers, *self.absent, tuple(c[:k]),
            **self.static, **self.hyperparams(*c[k:]),
        )  # fmt: skip
        return out, True, tuple(new)[: len(buffers)]


def betas_and_eps(b1: Any, b2: Any, eps: Any, eps_root: Any) -> dict[str, Any]:
    """The keyword arguments of Adam-like math (Adam's, Yogi's) from its per-step values."""
    return {"betas": (b1, b2), "eps": eps, "eps_root": eps_root}


def step_leaves(
    who: str,
    math: Any,
    scalars: Sequence[Any],
    updates: Updates,
    state: State,
    fields: Sequence[str],
    stored: Sequence[torch.dtype | str | None],
    params: Params | None = None,
) -> tuple[Updates, list[Any]]:
    """A block's pure update: its `math` with the `Pure` ops on each leaf that has an
    update, with the per-param buffers in the fields `fields` of `state`, and the
    `scalars` (its ``c``) cast to the leaf's dtype. The update and the buffers step in
    their promoted dtype (optax's, where a ``mu_dtype`` differs), and each new buffer is
    stored as `stored` says for its field: in that dtype, in the old buffer's (``"own"``),
    or as computed (None). The math reads each leaf's param from `params`, where a block
    needs them (else None). Returns the new updates and one tree of new buffers per field
    (a leaf without an update keeps its own)."""
    (gs, *columns), unflatten = _columns(who, updates, state, fields)
    ps: list[Any] = [None] * len(gs)
    if params is not None:
        (_, ps), _ = flatten_together(
            updates, params, names=(f"{who}: updates", "params"), hint="Pass the params given to init."
        )
    out, new = list(gs), [list(column) for column in columns]
    by_dtype: dict[torch.dtype, list[Any]] = {}  # the scalars in each leaf's dtype
    for i, g in enumerate(gs):
        if g is None:
            continue
        olds = [_buffer(who, i, column[i]) for column in columns]
        g, *buffers = _alike(g, *olds)
        c = by_dtype.get(g.dtype)
        if c is None:
            c = by_dtype[g.dtype] = [_coefficient(x, g) for x in scalars]
        p = ps[i]
        if params is not None and not isinstance(p, torch.Tensor):
            raise ValueError(f"{who}: leaf {i} has an update but params holds {a_kind(p)} for it")
        out[i], _, values = math(Pure, g, False, p, buffers, c)
        for column, old, value, dtype in zip(new, olds, values, stored):
            column[i] = value if dtype is None else value.to(old.dtype if dtype == "own" else dtype)
    return unflatten(out), [unflatten(column) for column in new]


def _coefficient(x: Any, g: Tensor) -> Any:
    """A scalar of the math for leaf `g`: `coef`'s cast, but a bool tensor (a choice the
    math makes with ``o.where``: RAdam's rectification) stays bool."""
    return x if isinstance(x, Tensor) and x.dtype == torch.bool else coef(x, g)
