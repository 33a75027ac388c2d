"""ASGD: averaged stochastic gradient descent (Polyak & Juditsky, 1992), as ``torch.optim.ASGD``.

.. math::
   \\theta_t = (1 - \\lambda \\eta_{t-1})\\, \\theta_{t-1} - \\eta_{t-1} g_t, \\quad
   \\bar\\theta_t = \\bar\\theta_{t-1} + \\mu_{t-1} (\\theta_t - \\bar\\theta_{t-1})

   \\eta_t = \\frac{\\gamma}{(1 + \\lambda \\gamma t)^\\alpha}, \\quad
   \\mu_t = \\frac{1}{\\max(1, t - t_0)}

The average :math:`\\bar\\theta` is torch's ``ax``: the params averaged over the steps
after ``t0`` (a copy of the params until then). It is read from the state; the params
themselves follow the plain SGD steps. ``eta`` and ``mu`` are per-param counters, kept
on the param's device, as torch keeps them.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import torch
from torch import Tensor

from ..core.base import GradientTransformation, Params
from ..engine.algorithm import Algorithm
from ..engine.bounds import Bound
from ..engine.ops import Coef, Ops, at_least, nonzero, power


class ASGDState(NamedTuple):
    """Per-param state (each field mirrors the params pytree), with torch's keys: the
    counters ``step``, ``eta`` (the step size) and ``mu`` (the averaging weight), and
    the average ``ax`` of the params."""

    step: Params
    eta: Params
    mu: Params
    ax: Params


def _initial(*, lr: Coef, **_: Any) -> ASGDState:
    return ASGDState(step=0.0, eta=lr, mu=1.0, ax=0.0)


def _schedule(
    step: Coef,
    eta: Coef,
    mu: Coef,
    *,
    lr: Coef,
    lambd: Coef,
    alpha: Coef,
    t0: Coef,
    as_torch_tensor: bool = False,
    **_: Any,
) -> tuple[tuple[Coef, Coef, Coef], tuple[Coef, Coef, Coef]]:
    # This step uses the eta and mu of the last (as read from their counters); the next
    # eta and mu follow from the new count, in torch's order of operations
    step = step + 1
    new_eta = _as_tensor(lr / power(1 + lambd * lr * step, alpha), as_torch_tensor, lr, lambd, alpha)
    new_mu = _as_tensor(1 / at_least(step - t0, 1), as_torch_tensor, t0)
    return (step, new_eta, new_mu), (eta, mu, 1 - lambd * eta)


def _as_tensor(value: Coef, default_dtype: bool, *sources: Coef) -> Coef:
    """`value` rounded as torch's step rounds it before copying it into its counter
    (``torch.as_tensor(value)``): kept in the dtype of the tensor hyperparameters among
    `sources` (torch computes in their dtype; a traced schedule, from float64 counters),
    else where it was computed from Python numbers (in doubles), in the counter's dtype
    (the functional state's, float64 for float64 params), or with `default_dtype` (the
    ASGD class) in the default dtype first, so that a counter of another dtype (float64,
    loaded by torch for float64 params) gets torch's value."""
    dtypes = [s.dtype for s in sources if isinstance(s, Tensor)]
    if dtypes:
        dtype = functools.reduce(torch.promote_types, dtypes)
    elif default_dtype:
        dtype = torch.get_default_dtype()
    else:
        return value
    if isinstance(value, Tensor):
        return value.to(dtype)
    return torch.tensor(value, dtype=dtype, device="cpu").item()


def _elementwise(
    o: Ops,
    out: Tensor | None,
    p: Tensor,
    g: Tensor,
    ax: Tensor,
    coefficients: tuple[Coef, Coef, Coef],
    *,
    weight_decay: Coef,
    maximize: bool,
    **_: Any,
) -> tuple[Tensor, tuple[Tensor]]:
    eta, mu, decay = coefficients
    if maximize:
        g = o.neg(g)
    if nonzero(weight_decay):
        g = o.add(g, p, alpha=weight_decay)
    out = o.decay_(out, p, decay)
    out = o.add_(out, g, alpha=-eta)
    new_p = o.new_param(out, p)  # ax follows the updated param
    if isinstance(mu, Tensor):  # traced or batched: no Python branch on its value
        ax = o.where(mu == 1, new_p, o.add_(ax, o.mul_(o.sub(new_p, ax), mu)))
    elif mu != 1:
        ax = o.add_(ax, o.mul_(o.sub(new_p, ax), mu))
    else:  # before t0 (and one step after it), the average is the param itself
        ax = o.copy_(ax, new_p)
    return out, (ax,)


ASGD_ = Algorithm(
    name="ASGD",
    state=ASGDState,
    counters=("step", "eta", "mu"),
    initial=_initial,
    schedule=_schedule,
    elementwise=_elementwise,
    bounds=(
        Bound("lr", "Invalid learning rate: {}"),
        Bound("weight_decay", "Invalid weight_decay value: {}"),
    ),
    needs_params=True,
)


def asgd(
    lr: float | Tensor = 1e-2,
    lambd: float | Tensor = 1e-4,
    alpha: float | Tensor = 0.75,
    t0: float | Tensor = 1e6,
    weight_decay: float | Tensor = 0.0,
    maximize: bool = False,
) -> GradientTransformation:
    """ASGD as a pure transformation, with ``torch.optim.ASGD``'s arguments and defaults.

    Args:
        lr: learning rate (the first step size; ``init`` reads it).
        lambd: decay term: it shrinks the params by ``1 - lambd * eta`` at each step,
            and the step size as ``lr / (1 + lambd * lr * t) ** alpha``.
        alpha: power of the step size's decay.
        t0: the step from which the params are averaged (into ``state.ax``).
        weight_decay: L2 penalty, added to the gradient as ``weight_decay * param``.
        maximize: maximize the objective instead of minimizing it.

    ``update`` needs the params (the average follows them). Hyperparameters may be 0-d
    tensors, to differentiate or ``vmap`` over them. The average is ``state.ax``: use
    it as the params to evaluate, as with torch's ASGD.

    Example:
        >>> import torch, funcopt as fo
        >>> params = {"w": torch.tensor([1.0, -2.0])}
        >>> tx = fo.asgd(lr=0.1, t0=0)
        >>> state = tx.init(params)
        >>> for _ in range(3):
        ...     updates, state = tx.update({"w": 2 * params["w"]}, state, params)
        ...     params = fo.apply_updates(params, updates)
        >>> params["w"], state.ax["w"]
        (tensor([ 0.5120, -1.0240]), tensor([ 0.5760, -1.1520]))
    """
    return ASGD_.transform(
        lr=lr, lambd=lambd, alpha=alpha, t0=t0, weight_decay=weight_decay, maximize=maximize
    )
