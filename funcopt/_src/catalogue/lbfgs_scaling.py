"""optax's L-BFGS direction (optax's names, arguments and math): `scale_by_lbfgs`.

It multiplies the updates by an approximation of the inverse Hessian built from the
last `memory_size` differences of params and updates (Nocedal and Wright, Algorithms 7.4
and 7.5). optax's ``lbfgs`` chains it with a zoom line search::

    fo.chain(fo.scale_by_lbfgs(), fo.scale(-1.0), fo.scale_by_zoom_linesearch(20, initial_guess_strategy="one"))

(``fo.lbfgs`` is ``torch.optim.LBFGS``'s algorithm, another one.) The memory is one
buffer per param with a leading dimension of `memory_size`, written at the count modulo
the size: the state keeps one structure, and the update runs under ``torch.func`` and
``torch.compile``."""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import optree
import torch
from torch import Tensor

from ..algorithms.lbfgs_loop import _two_loop
from ..core.base import GradientTransformation, Params, State, Updates
from ..core.hyperparams import _increment
from ._common import _check_state, _count, check_params, device_of, norm, sq_norm
from .linesearch import as_grad, real_dot, value_dtype

__all__ = ["ScaleByLBFGSState", "scale_by_lbfgs"]


class ScaleByLBFGSState(NamedTuple):
    """The step count (0-d int32), the params and updates of the last step, and the
    memory: the last differences of params and of updates (each leaf with a leading
    dimension of `memory_size`) and their weights ``1 / <dw, du>``."""

    count: Tensor  # type: ignore[assignment]  # optax's name, which shadows tuple.count
    params: Params
    updates: Updates
    diff_params_memory: Any
    diff_updates_memory: Any
    weights_memory: Tensor


torch.serialization.add_safe_globals([ScaleByLBFGSState])  # loads with torch.load(weights_only=True)


def _lbfgs_init(memory_size: int, params: Params) -> ScaleByLBFGSState:
    stacked = optree.tree_map(lambda p: p.new_zeros((memory_size, *p.shape)), params)
    zeros = functools.partial(optree.tree_map, torch.zeros_like)
    weights = torch.zeros(memory_size, dtype=value_dtype(params), device=device_of(params))
    return ScaleByLBFGSState(_count(params), zeros(params), zeros(params), stacked, zeros(stacked), weights)


def _row(tree: Any, i: int) -> Any:
    return optree.tree_map(lambda x: x[i], tree)


def _add_scale(x: Any, y: Any, eta: Tensor) -> Any:
    return optree.tree_map(lambda a, b: a + eta.to(a.real.dtype) * b, x, y)


def _scale(x: Any, scale: Tensor) -> Any:
    return optree.tree_map(lambda v: scale.to(v.real.dtype) * v, x)


def _precondition(updates: Any, dws: Any, dus: Any, rhos: Tensor, scale: Tensor) -> Any:
    """The two-loop recursion over the memory rows, oldest first (optax's
    ``_precondition_by_lbfgs``; the rows are already in that order): torch's L-BFGS's
    (algorithms/lbfgs_loop.py `_two_loop`) on trees, with every row in use (an unused
    row is zero, with a zero weight)."""
    m = rhos.shape[0]
    return _two_loop(
        updates, [_row(dws, i) for i in range(m)], [_row(dus, i) for i in range(m)], rhos, scale, [None] * m,
        dot=real_dot, axpy=_add_scale, mul=_scale, where=lambda use, a, b: a, used=lambda i: True,
    )  # fmt: skip


def _lbfgs_update(
    memory_size: int, scale_init_precond: bool,
    updates: Updates, state: State, params: Params | None = None, **extra_args: Any,
) -> tuple[Updates, State]:  # fmt: skip
    who = "scale_by_lbfgs update"
    _check_state(state, ScaleByLBFGSState, who)
    check_params(who, params)
    assert params is not None  # (check_params raised otherwise)
    updates = as_grad(updates, params)  # a param without gradient: zeros, as torch's LBFGS
    count, weights_dtype = state.count, state.weights_memory.dtype
    first = count == 0
    memory_idx = torch.remainder(count, memory_size).to(torch.int64)
    prev_idx = torch.remainder(count - 1, memory_size).to(torch.int64).reshape(1)
    # 1. the memory, with the last step's differences (zero at the first step)
    diff_params = optree.tree_map(lambda p, q: torch.where(first, 0.0, p - q), params, state.params)
    diff_updates = optree.tree_map(lambda u, v: torch.where(first, 0.0, u - v), updates, state.updates)
    inner = real_dot(diff_updates, diff_params).to(weights_dtype)
    no_weight = first | (inner == 0.0)
    weight = torch.where(no_weight, 0.0, 1.0 / torch.where(no_weight, 1.0, inner))  # (safe under grad)
    put = lambda mem, new: mem.index_copy(0, prev_idx, new.unsqueeze(0).to(mem.dtype))  # noqa: E731
    dw_memory = optree.tree_map(put, state.diff_params_memory, diff_params)
    du_memory = optree.tree_map(put, state.diff_updates_memory, diff_updates)
    weights_memory = put(state.weights_memory, weight)
    # 2. the scale of the initial inverse Hessian
    if scale_init_precond:
        denominator = sq_norm(diff_updates).to(weights_dtype)
        positive = denominator > 0.0
        scale = torch.where(positive, inner / torch.where(positive, denominator, 1.0), 1.0)
        capped_inv_norm = torch.clamp_max(1.0 / norm(optree.tree_map(torch.detach, updates)), 1.0)
        scale = torch.where(first, capped_inv_norm.to(weights_dtype), scale)
    else:
        scale = torch.ones((), dtype=weights_dtype, device=weights_memory.device)
    # 3. the direction, from the rows oldest first (memory_idx is the oldest)
    order = torch.remainder(memory_idx + torch.arange(memory_size, device=memory_idx.device), memory_size)
    rows = functools.partial(optree.tree_map, lambda mem: mem.index_select(0, order))
    out = _precondition(
        updates, rows(dw_memory), rows(du_memory), weights_memory.index_select(0, order), scale
    )
    new = ScaleByLBFGSState(_increment(count), params, updates, dw_memory, du_memory, weights_memory)
    return out, new


def scale_by_lbfgs(memory_size: int = 10, scale_init_precond: bool = True) -> GradientTransformation:
    """The L-BFGS direction, optax's ``scale_by_lbfgs``: the updates times an
    approximation of the inverse Hessian from the last `memory_size` differences of
    params and updates (the gradients, usually). With `scale_init_precond`, the initial
    approximation is the identity scaled by ``<dw, du> / |du|^2`` of the last step (at
    the first step, by ``min(1, 1 / |updates|)``). Chain a line search after it
    (`scale_by_zoom_linesearch`): it updates its memory at each step from the params
    that the line search reached.

    Example:
        >>> import torch, funcopt as fo
        >>> fn = lambda p: 0.5 * (torch.tensor([1.0, 10.0]) * p**2).sum()
        >>> tx = fo.chain(fo.scale_by_lbfgs(), fo.scale(-1.0), fo.scale_by_zoom_linesearch(20, initial_guess_strategy="one"))
        >>> params = torch.tensor([1.0, 1.0])
        >>> state = tx.init(params)
        >>> value_and_grad = fo.value_and_grad_from_state(fn)
        >>> for _ in range(5):
        ...     value, grad = value_and_grad(params, state=state)
        ...     updates, state = tx.update(grad, state, params, value=value, grad=grad, value_fn=fn)
        ...     params = fo.apply_updates(params, updates)
        >>> float(fn(params)) < 1e-12
        True
    """
    if isinstance(memory_size, bool) or not isinstance(memory_size, int) or memory_size < 1:
        raise ValueError(f"scale_by_lbfgs: memory_size must be an int >= 1, got {memory_size!r}")
    return GradientTransformation(
        functools.partial(_lbfgs_init, memory_size),
        functools.partial(_lbfgs_update, memory_size, bool(scale_init_precond)),
    )
