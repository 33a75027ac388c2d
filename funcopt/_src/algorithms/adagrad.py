"""Adagrad (Duchi et al., 2011), as ``torch.optim.Adagrad``.

.. math::
   \\tilde\\gamma = \\frac{\\gamma}{1 + (t - 1)\\eta}, \\quad
   s_t = s_{t-1} + g_t^2, \\quad
   \\theta_t = \\theta_{t-1} - \\tilde\\gamma\\, \\frac{g_t}{\\sqrt{s_t} + \\epsilon}

Sparse gradients update only the entries they hold, as in torch.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import torch
from torch import Tensor

from ..core.base import GradientTransformation, Params
from ..engine.algorithm import Algorithm
from ..engine.bounds import Bound
from ..engine.ops import Coef, Ops, nonzero


class AdagradState(NamedTuple):
    """Per-param state (each field mirrors the params pytree), with torch's keys."""

    step: Params
    sum: Params


def _initial(*, initial_accumulator_value: Any, **_: Any) -> AdagradState:
    return AdagradState(step=0.0, sum=initial_accumulator_value)


def _schedule(step: Coef, *, lr: Coef, lr_decay: Coef, **_: Any) -> tuple[tuple[Coef], tuple[Coef]]:
    step = step + 1
    return (step,), (lr / (1 + (step - 1) * lr_decay),)


def _elementwise(
    o: Ops,
    out: Tensor | None,
    p: Tensor,
    g: Tensor,
    sum_: Tensor,
    coefficients: tuple[Coef],
    *,
    eps: Coef,
    weight_decay: Coef,
    maximize: bool,
    eps_root: Coef = 0.0,
    zero_where_no_sum: bool = False,
    **_: Any,
) -> tuple[Tensor, tuple[Tensor]]:
    """Adagrad's step, also ``scale_by_rss``'s (catalogue/accumulators.py). funcopt only,
    as optax's: `eps_root` and `zero_where_no_sum` (no step, where ``0 / 0`` would be one,
    where the sum is not positive)."""
    (clr,) = coefficients
    if maximize:
        g = o.neg(g)
    if nonzero(weight_decay):  # never with a sparse gradient (see Algorithm.check_sparse_grad)
        g = o.add(g, p, alpha=weight_decay)
    if g.is_sparse:  # the update is non-linear, so indices must be unique
        g = g.coalesce()
        indices, values = g._indices(), g._values()
        # a coalesced tensor's indices are valid by construction: no invariant check
        sparse = lambda v: torch.sparse_coo_tensor(indices, v, g.shape, check_invariants=False)  # noqa: E731
        sum_ = o.add_(sum_, sparse(values.pow(2)))
        std_values = o.add_(o.sqrt_(sum_.sparse_mask(g)._values()), eps)
        step = sparse(values / std_values)
        out = o.add_(out, step, alpha=-clr)
    else:
        sum_ = o.addcmul_(sum_, g, g, value=1)
        std = o.sqrt(sum_) if not nonzero(eps_root) else o.sqrt_(o.add(sum_, eps_root))
        std = o.add_(std, eps)
        if zero_where_no_sum:  # g / inf: a zero step
            std = o.where(o.gt(sum_, 0), std, math.inf)
        out = o.addcdiv_(out, g, std, value=-clr)
    return out, (sum_,)


ADAGRAD = Algorithm(
    name="Adagrad",
    state=AdagradState,
    counters=("step",),
    initial=_initial,
    schedule=_schedule,
    elementwise=_elementwise,
    bounds=(
        Bound("lr", "Invalid learning rate: {}"),
        Bound("lr_decay", "Invalid lr_decay value: {}"),
        Bound("weight_decay", "Invalid weight_decay value: {}"),
        Bound("initial_accumulator_value", "Invalid initial_accumulator_value value: {}"),
        Bound("eps", "Invalid epsilon value: {}"),
        Bound("eps_root", "Invalid eps_root value: {}"),
    ),
    sparse=True,
)


def adagrad(
    lr: float | Tensor = 1e-2,
    lr_decay: float | Tensor = 0.0,
    weight_decay: float | Tensor = 0.0,
    initial_accumulator_value: float | Tensor = 0.0,
    eps: float | Tensor = 1e-10,
    maximize: bool = False,
    *,
    eps_root: float | Tensor = 0.0,
) -> GradientTransformation:
    """Adagrad as a pure transformation, with ``torch.optim.Adagrad``'s arguments.

    Args:
        lr: learning rate.
        lr_decay: the learning rate at step ``t`` is ``lr / (1 + (t - 1) * lr_decay)``.
        weight_decay: L2 penalty, added to the gradient as ``weight_decay * param``.
        initial_accumulator_value: starting value of the sum of squared gradients.
        eps: added to the denominator (after the square root).
        maximize: maximize the objective instead of minimizing it.
        eps_root: added inside the square root, ``sqrt(sum + eps_root)`` (funcopt only;
            0 is torch's rule). Not needed for finite meta-gradients: the functional
            step takes ``sqrt`` with derivative 0 at 0.

    Hyperparameters may be 0-d tensors, to differentiate or ``vmap`` over them.
    Sparse gradients are accepted (without weight decay), as in torch.

    Example:
        >>> import torch, funcopt as fo
        >>> params = {"w": torch.tensor([1.0, -2.0])}
        >>> tx = fo.adagrad(lr=0.1)
        >>> state = tx.init(params)
        >>> updates, state = tx.update({"w": torch.tensor([0.5, -0.5])}, state, params)
        >>> fo.apply_updates(params, updates)["w"], state.sum["w"]
        (tensor([ 0.9000, -1.9000]), tensor([0.2500, 0.2500]))
    """
    return ADAGRAD.transform(
        lr=lr,
        lr_decay=lr_decay,
        weight_decay=weight_decay,
        initial_accumulator_value=initial_accumulator_value,
        eps=eps,
        maximize=maximize,
        eps_root=eps_root,
    )
