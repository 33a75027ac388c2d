"""SparseAdam: Adam on the entries a sparse gradient holds (``torch.optim.SparseAdam``).

For the entries :math:`i` that the (coalesced) sparse gradient holds, and no others:

.. math::
   m_{t,i} = \\beta_1 m_{t-1,i} + (1 - \\beta_1) g_{t,i}, \\quad
   v_{t,i} = \\beta_2 v_{t-1,i} + (1 - \\beta_2) g_{t,i}^2, \\quad
   \\theta_{t,i} = \\theta_{t-1,i}
   - \\gamma \\frac{\\sqrt{1 - \\beta_2^t}}{1 - \\beta_1^t}\\,
   \\frac{m_{t,i}}{\\sqrt{v_{t,i}} + \\epsilon}

The step count advances at every step that has a gradient, also one that holds no
entry (which changes nothing else), as torch's does. Sparse gradients are its only
input: a dense one raises torch's error.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from torch import Tensor

from ..core.base import GradientTransformation, Params
from ..engine.algorithm import Algorithm
from ..engine.bounds import Bound
from ..engine.ops import Coef, Ops

DENSE_GRADIENT = "SparseAdam does not support dense gradients, please consider Adam instead"
"""torch's error for a dense gradient."""


class SparseAdamState(NamedTuple):
    """Per-param state (each field mirrors the params pytree), with torch's keys."""

    step: Params
    exp_avg: Params
    exp_avg_sq: Params


def _initial(**_: Any) -> SparseAdamState:
    return SparseAdamState(step=0.0, exp_avg=0.0, exp_avg_sq=0.0)


def _sqrt(x: Coef) -> Coef:
    """``math.sqrt`` for a Python float (torch's rounding), ``torch.sqrt`` for a tensor."""
    return torch.sqrt(x) if isinstance(x, Tensor) else math.sqrt(x)


def _schedule(step: Coef, *, lr: Coef, betas: tuple[Coef, Coef], **_: Any) -> tuple[tuple[Coef], tuple[Coef]]:
    beta1, beta2 = betas
    step = step + 1
    bias_correction1 = 1 - beta1**step
    bias_correction2 = 1 - beta2**step
    return (step,), (lr * _sqrt(bias_correction2) / bias_correction1,)


def _elementwise(
    o: Ops,
    out: Tensor | None,
    p: Tensor,
    g: Tensor,
    exp_avg: Tensor,
    exp_avg_sq: Tensor,
    coefficients: tuple[Coef],
    *,
    betas: tuple[Coef, Coef],
    eps: Coef,
    maximize: bool,
    **_: Any,
) -> tuple[Tensor, tuple[Tensor, Tensor]]:
    if not g.is_sparse:
        raise RuntimeError(DENSE_GRADIENT)
    (step_size,) = coefficients
    beta1, beta2 = betas
    if maximize:
        g = -g
    g = g.coalesce()  # the update is non-linear, so indices must be unique
    indices, values = g._indices(), g._values()
    if values.numel() == 0:  # nothing to update (the step count still advances)
        return (g if out is None else out), (exp_avg, exp_avg_sq)
    # a coalesced tensor's indices are valid by construction: no invariant check
    sparse: Callable[[Tensor], Tensor] = lambda v: torch.sparse_coo_tensor(  # noqa: E731
        indices, v, g.shape, check_invariants=False
    )
    # old <- b * old + (1 - b) * new, as old += (1 - b) * (new - old) on the held entries
    old_exp_avg = exp_avg.sparse_mask(g)._values()
    exp_avg_update = o.mul_(values - old_exp_avg, 1 - beta1)
    exp_avg = o.add_(exp_avg, sparse(exp_avg_update))
    old_exp_avg_sq = exp_avg_sq.sparse_mask(g)._values()
    exp_avg_sq_update = o.mul_(values.pow(2) - old_exp_avg_sq, 1 - beta2)
    exp_avg_sq = o.add_(exp_avg_sq, sparse(exp_avg_sq_update))
    # the new moments' values, added densely again (torch avoids another sparse_mask)
    numer = exp_avg_update + old_exp_avg
    denom = o.add_(o.sqrt_(exp_avg_sq_update + old_exp_avg_sq), eps)
    out = o.add_(out, sparse(o.mul_(numer / denom, -step_size)))
    return out, (exp_avg, exp_avg_sq)


SPARSE_ADAM = Algorithm(
    name="SparseAdam",
    state=SparseAdamState,
    counters=("step",),
    initial=_initial,
    schedule=_schedule,
    elementwise=_elementwise,
    bounds=(
        Bound("lr", "Invalid learning rate: {}", positive=True),
        Bound("eps", "Invalid epsilon value: {}", positive=True),
        Bound("betas", "Invalid beta parameter at index 0: {}", index=0, high=1.0, inclusive=False),
        Bound("betas", "Invalid beta parameter at index 1: {}", index=1, high=1.0, inclusive=False),
    ),
    sparse=True,
)


def sparse_adam(
    lr: float | Tensor = 1e-3,
    betas: tuple[float | Tensor, float | Tensor] = (0.9, 0.999),
    eps: float | Tensor = 1e-8,
    maximize: bool = False,
) -> GradientTransformation:
    """SparseAdam as a pure transformation, with ``torch.optim.SparseAdam``'s arguments.

    Args:
        lr: learning rate.
        betas: decay rates of the running averages of the gradient and its square.
        eps: added to the denominator (after the square root).
        maximize: maximize the objective instead of minimizing it.

    The gradients must be sparse COO tensors (such as ``nn.Embedding(sparse=True)``
    gives): only the entries they hold change, in the params and in both moments; a
    dense gradient raises torch's error. The updates are sparse tensors too
    (`apply_updates` adds them to the params). Hyperparameters may be 0-d tensors.

    Example:
        >>> import torch, funcopt as fo
        >>> params = {"w": torch.tensor([1.0, -2.0, 3.0])}
        >>> tx = fo.sparse_adam(lr=0.1)
        >>> state = tx.init(params)
        >>> grads = {"w": torch.sparse_coo_tensor([[0, 2]], [0.5, -0.5], (3,), check_invariants=True)}
        >>> updates, state = tx.update(grads, state, params)
        >>> fo.apply_updates(params, updates)["w"], state.exp_avg["w"]
        (tensor([ 0.9000, -2.0000,  3.1000]), tensor([ 0.0500,  0.0000, -0.0500]))
    """
    return SPARSE_ADAM.transform(lr=lr, betas=betas, eps=eps, maximize=maximize)
