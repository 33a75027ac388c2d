"""optax.contrib's optimizers that need more than one gradient (optax's names, arguments
and math): `sam` (sharpness-aware minimization, with `normalize`) and `sophia` (with
`hutchinson_estimator_diag_hessian`).

`sam`'s opaque mode takes a ``grad_fn(params, i) -> grads`` extra argument of `update`;
`sophia` takes an ``obj_fn(params) -> loss`` extra argument, from which its Hessian
estimator takes a Hessian-vector product (``torch.func.jvp`` of ``torch.func.grad``)."""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import optree
import torch
from torch import Tensor
from torch.func import grad as func_grad
from torch.func import jvp

from ..core.base import (
    GradientTransformation,
    MaskedNode,
    Params,
    State,
    Updates,
    apply_updates,
    chain,
    check_transformation,
    empty_init,
    readable,
    tracing,
)
from ..transforms.blocks import add_decayed_weights, scale_by_learning_rate
from ..transforms.clipping import Scalar, map_updates
from ._common import (
    _bias_correction,
    _check_state,
    _count,
    _increment,
    _lowest_dtype,
    copy,
    device_of,
    leafwise,
    make_key,
    norm,
    pick,
    present,
    rademacher_like,
    split,
    zeros,
)

__all__ = [
    "HutchinsonState",
    "SAMState",
    "SophiaState",
    "hutchinson_estimator_diag_hessian",
    "normalize",
    "sam",
    "scale_by_sophia",
    "sophia",
]


# ---------------------------------------------------------------- SAM


def _normalize_update(updates: Updates, state: State, params: Params | None = None, **extra_args: Any) -> Any:
    if not present(updates):
        return updates, state
    g_norm = norm(updates)
    return map_updates(lambda g: g / g_norm.to(g.dtype), updates), state


def normalize() -> GradientTransformation:
    """Divide the updates by their global norm (optax.contrib's ``normalize``, SAM's
    adversarial direction; `normalize_by_update_norm` adds an eps).

    Example:
        >>> import torch, funcopt as fo
        >>> fo.normalize().update([torch.tensor([3.0, 4.0])], fo.EmptyState())[0]
        [tensor([0.6000, 0.8000])]
    """
    return GradientTransformation(empty_init, _normalize_update)


class SAMState(NamedTuple):
    """The steps since the last outer step, the outer and adversarial optimizers'
    states, and the params of the last outer step (`MaskedNode` in opaque mode, which
    keeps none: optax's None)."""

    steps_since_sync: Tensor
    opt_state: State
    adv_state: State
    cache: Any


def _sam_init(
    optimizer: GradientTransformation, adv_optimizer: GradientTransformation, opaque: bool, params: Params
) -> SAMState:
    steps = torch.zeros((), dtype=torch.int32, device=device_of(params))
    cache = MaskedNode() if opaque else copy(params)
    return SAMState(steps, optimizer.init(params), adv_optimizer.init(params), cache)


def _negate(tree: Any) -> Any:
    return map_updates(torch.neg, tree)


def _sam_transparent(
    optimizer: GradientTransformation, adv_optimizer: GradientTransformation, sync_period: int, reset_state: bool,
    updates: Updates, state: State, params: Params | None = None, *, grad_fn: Any = None, **extra_args: Any,
) -> tuple[Updates, State]:  # fmt: skip
    _check_state(state, SAMState, "sam update")
    first, last = state.steps_since_sync == 0, state.steps_since_sync == sync_period - 1
    adv_updates, adv_state = adv_optimizer.update(updates, state.adv_state, params)
    adv_updates = _negate(adv_updates)
    opt_updates, opt_state = optimizer.update(updates, state.opt_state, state.cache)
    opt_updates = optree.tree_map(lambda c, p, u: c - p + u, state.cache, params, opt_updates)  # type: ignore[arg-type]
    cache = pick(first, params, state.cache)
    out = pick(last, opt_updates, adv_updates)
    adv_state = pick(last, adv_optimizer.init(params) if reset_state else state.adv_state, adv_state)
    opt_state = pick(last, opt_state, state.opt_state)
    steps = (state.steps_since_sync + 1) % sync_period
    return out, SAMState(steps, opt_state, adv_state, cache)


def _sam_opaque(
    optimizer: GradientTransformation, adv_optimizer: GradientTransformation, sync_period: int, reset_state: bool,
    updates: Updates, state: State, params: Params | None = None, *, grad_fn: Any = None, **extra_args: Any,
) -> tuple[Updates, State]:  # fmt: skip
    _check_state(state, SAMState, "sam update")
    if grad_fn is None:
        raise ValueError(
            "sam with opaque_mode=True needs grad_fn: call update(grads, state, params, grad_fn=...)"
        )
    adv_params, adv_updates, adv_state = params, updates, state.adv_state
    for i in range(sync_period - 1):
        adv_updates, adv_state = adv_optimizer.update(adv_updates, adv_state, adv_params)
        adv_params = apply_updates(adv_params, _negate(adv_updates))
        adv_updates = grad_fn(adv_params, i)
    if reset_state:
        adv_state = adv_optimizer.init(params)
    out, opt_state = optimizer.update(adv_updates, state.opt_state, params)
    return out, SAMState(torch.zeros_like(state.steps_since_sync), opt_state, adv_state, MaskedNode())


def sam(
    optimizer: GradientTransformation,
    adv_optimizer: GradientTransformation,
    sync_period: int = 2,
    reset_state: bool = True,
    opaque_mode: bool = False,
    batch_axis_name: str | None = None,
) -> GradientTransformation:
    """Sharpness-aware minimization (Foret et al. 2021; optax.contrib's ``sam``): steps
    of `adv_optimizer` *up* the loss (``sync_period - 1`` of them), then a step of
    `optimizer` from the original params with the gradient found there.

    Transparent mode (the default) takes one gradient per `update`: the adversarial
    steps are returned as updates, then the outer one, which brings the params back.
    Opaque mode does it all in one `update`, calling its extra argument
    ``grad_fn(params, i) -> grads`` for the gradients at the adversarial points.
    `adv_optimizer` is usually ``chain(normalize(), scale(-rho))`` (optax's docs:
    ``chain(normalize(), sgd(rho))``); its updates are negated, a step up the loss.

    Example:
        >>> import torch, funcopt as fo
        >>> tx = fo.sam(fo.sgd(lr=0.1), fo.chain(fo.normalize(), fo.scale(-0.05)), opaque_mode=True)
        >>> p = [torch.tensor([1.0])]
        >>> tx.update([torch.tensor([2.0])], tx.init(p), p, grad_fn=lambda q, i: [2 * q[0]])[0]
        [tensor([-0.2100])]
    """
    check_transformation(optimizer, "sam (optimizer)")
    check_transformation(adv_optimizer, "sam (adv_optimizer)")
    if sync_period < 1:
        raise ValueError(f"sam: sync_period must be >= 1, got {sync_period}")
    if batch_axis_name is not None:
        raise ValueError(
            "sam: batch_axis_name (jax's pmean across devices) has no counterpart here; average the gradients "
            "across processes in grad_fn (torch.distributed.all_reduce) and leave batch_axis_name None"
        )
    update = _sam_opaque if opaque_mode else _sam_transparent
    return GradientTransformation(
        functools.partial(_sam_init, optimizer, adv_optimizer, opaque_mode),
        functools.partial(update, optimizer, adv_optimizer, sync_period, reset_state),
    )


# ---------------------------------------------------------------- Sophia


class HutchinsonState(NamedTuple):
    """The random key (a 0-d int64 tensor) of `hutchinson_estimator_diag_hessian`."""

    key: Tensor


def _hutchinson_init(seed: int | Tensor, params: Params) -> HutchinsonState:
    return HutchinsonState(make_key(seed, device_of(params)))


def _hutchinson_update(
    updates: Updates, state: State, params: Params | None = None, obj_fn: Any = None, **extra_args: Any
) -> tuple[Updates, State]:
    _check_state(state, HutchinsonState, "hutchinson_estimator_diag_hessian update")
    if params is None:
        raise ValueError(
            "hutchinson_estimator_diag_hessian needs the params: call update(grads, state, params)"
        )
    if obj_fn is None:
        raise ValueError(
            "hutchinson_estimator_diag_hessian needs obj_fn: call update(..., obj_fn=loss_of_params)"
        )
    key, subkey = split(state.key)
    leaves, treedef = optree.tree_flatten(params)
    dtype = _lowest_dtype(params)
    signs = treedef.unflatten([r.to(dtype) for r in rademacher_like(subkey, leaves)])
    hvp = jvp(func_grad(obj_fn), (params,), (signs,))[1]
    return optree.tree_map(torch.mul, hvp, signs), HutchinsonState(key)


def hutchinson_estimator_diag_hessian(random_seed: int | Tensor | None = None) -> GradientTransformation:
    """Hutchinson's estimate of the Hessian's diagonal (optax.contrib's): ``r * (H r)``
    for random signs ``r``, from the extra argument ``obj_fn(params) -> loss``. The
    signs come from funcopt's pure counter-based generator (not jax's numbers), keyed
    by `random_seed` (default 0).

    Example:
        >>> import torch, funcopt as fo
        >>> tx = fo.hutchinson_estimator_diag_hessian()
        >>> p = [torch.tensor([1.0, 2.0])]
        >>> tx.update(p, tx.init(p), p, obj_fn=lambda q: (q[0] ** 3).sum())[0]  # exact for a separable loss
        [tensor([ 6., 12.])]
    """
    return GradientTransformation(
        functools.partial(_hutchinson_init, 0 if random_seed is None else random_seed), _hutchinson_update
    )


class SophiaState(NamedTuple):
    """The step count, the momentum, the EMA of the Hessian's diagonal, and the Hessian
    estimator's state (optax's names)."""

    count: Tensor  # type: ignore[assignment]  # optax's name, which shadows tuple.count
    mu: Params
    nu: Params
    hessian_fn_state: State


def _sophia_init(
    hessian_fn: GradientTransformation, mu_dtype: torch.dtype | None, params: Params
) -> SophiaState:
    return SophiaState(_count(params), zeros(params, mu_dtype), zeros(params), hessian_fn.init(params))


def _sophia_update(
    b1: Scalar, b2: Scalar, eps: Scalar, gamma: Scalar, clip_threshold: Scalar | None, update_interval: int,
    hessian_fn: GradientTransformation, mu_dtype: torch.dtype | None, verbose: bool, every: int,
    updates: Updates, state: State, params: Params | None = None, **hess_fn_kwargs: Any,
) -> tuple[Updates, State]:  # fmt: skip
    who = "sophia update"
    _check_state(state, SophiaState, who)
    if params is None:
        raise ValueError("sophia needs the params: call update(grads, state, params, obj_fn=...)")
    count = _increment(state.count)
    grads = updates

    def step(g: Tensor, m0: Tensor, h: Tensor) -> tuple[Tensor, ...]:
        mu = (1 - b1) * g + b1 * m0
        u = (mu / _bias_correction(b1, count).to(mu.dtype)) / torch.clamp(gamma * h, min=eps)
        if clip_threshold is not None:
            u = torch.clamp(u, -clip_threshold, clip_threshold)  # type: ignore[arg-type]
        return u, mu if mu_dtype is None else mu.to(mu_dtype)

    out, mu = leafwise(who, step, updates, state.mu, state.nu, n_out=2)
    if (
        verbose
        and clip_threshold is not None
        and not tracing()
        and readable(count)
        and int(count) % every == 0
    ):
        leaves = present(out)
        win = sum(int((u.abs() < clip_threshold).sum()) for u in leaves) / max(
            1, sum(u.numel() for u in leaves)
        )
        print(f"Sophia optimizer win rate: {win}")

    def refreshed() -> tuple[State, Params]:
        diag, h_state = hessian_fn.update(grads, state.hessian_fn_state, params=params, **hess_fn_kwargs)
        nu = leafwise(who, lambda d, n0: ((1 - b2) * d + b2 * n0,), diag, state.nu)[0]
        return h_state, nu

    due = state.count % update_interval == 0
    if not tracing() and readable(state.count):
        h_state, nu = refreshed() if bool(due) else (state.hessian_fn_state, state.nu)
    else:  # one graph for every step: both sides, then a pick
        h_new, nu_new = refreshed()
        h_state, nu = pick(due, h_new, state.hessian_fn_state), pick(due, nu_new, state.nu)
    return out, SophiaState(count, mu, nu, h_state)


def scale_by_sophia(
    b1: Scalar = 0.965,
    b2: Scalar = 0.99,
    eps: Scalar = 1e-8,
    gamma: Scalar = 0.01,
    clip_threshold: Scalar | None = 1.0,
    update_interval: int = 10,
    hessian_diagonal_fn: GradientTransformation | None = None,
    mu_dtype: torch.dtype | None = None,
    verbose: bool = False,
    print_win_rate_every_n_steps: int = 0,
) -> GradientTransformation:
    """Sophia's scaling (Liu et al. 2023; optax.contrib's ``scale_by_sophia``): momentum
    over ``max(gamma * h, eps)``, ``h`` an EMA of a Hessian-diagonal estimate refreshed
    every `update_interval` steps, clipped to `clip_threshold`. The estimator
    (default: `hutchinson_estimator_diag_hessian`) receives the extra arguments of
    `update`, as ``obj_fn``. With `verbose`, prints the share of unclipped coordinates
    every `print_win_rate_every_n_steps` steps (outside tracing).

    Example:
        >>> import torch, funcopt as fo
        >>> tx = fo.scale_by_sophia()
        >>> p = [torch.tensor([1.0])]
        >>> tx.update([torch.tensor([2.0])], tx.init(p), p, obj_fn=lambda q: (q[0] ** 2).sum())[0]
        [tensor([1.])]
    """
    hessian_fn = hutchinson_estimator_diag_hessian() if hessian_diagonal_fn is None else hessian_diagonal_fn
    check_transformation(hessian_fn, "scale_by_sophia (hessian_diagonal_fn)")
    if verbose and print_win_rate_every_n_steps < 1:
        raise ValueError("scale_by_sophia: verbose needs print_win_rate_every_n_steps >= 1")
    return GradientTransformation(
        functools.partial(_sophia_init, hessian_fn, mu_dtype),
        functools.partial(
            _sophia_update, b1, b2, eps, gamma, clip_threshold, update_interval, hessian_fn, mu_dtype, verbose,
            print_win_rate_every_n_steps,
        ),
    )  # fmt: skip


def sophia(
    learning_rate: Any,
    b1: Scalar = 0.965,
    b2: Scalar = 0.99,
    eps: Scalar = 1e-8,
    weight_decay: Scalar = 1e-4,
    weight_decay_mask: Any = None,
    gamma: Scalar = 0.01,
    clip_threshold: Scalar | None = 1.0,
    update_interval: int = 10,
    hessian_diagonal_fn: GradientTransformation | None = None,
    mu_dtype: torch.dtype | None = None,
    verbose: bool = False,
    print_win_rate_every_n_steps: int = 0,
) -> GradientTransformation:
    """Sophia (optax.contrib's ``sophia``): `scale_by_sophia`, `add_decayed_weights`,
    the learning rate. `update` needs the params and ``obj_fn=`` (the loss as a
    function of the params) for the Hessian estimate.

    Example:
        >>> import torch, funcopt as fo
        >>> len(fo.sophia(1e-3).init([torch.zeros(2)]))
        3
    """
    return chain(
        scale_by_sophia(
            b1, b2, eps, gamma, clip_threshold, update_interval, hessian_diagonal_fn, mu_dtype, verbose,
            print_win_rate_every_n_steps,
        ),
        add_decayed_weights(weight_decay, mask=weight_decay_mask),
        scale_by_learning_rate(learning_rate),
    )  # fmt: skip
