"""`lookahead` (optax's): slow weights that follow the fast optimizer's every `sync_period` steps."""

from __future__ import annotations

import functools
import warnings
from typing import Any, NamedTuple

import optree
import torch
from torch import Tensor

from ..core.base import (
    GradientTransformation,
    Params,
    State,
    Updates,
    a_kind,
    check_transformation,
)
from ..core.hyperparams import (
    _check_state,
    _counter,
    _update,
)
from .wrappers import _map_updates, _where

__all__ = ["LookaheadParams", "LookaheadState", "lookahead"]


class LookaheadState(NamedTuple):
    """The state of `lookahead`: the fast optimizer's state, and the fast steps taken
    since the last synchronization."""

    fast_state: State
    steps_since_sync: Tensor


class LookaheadParams(NamedTuple):
    """The fast and slow params of `lookahead` (Zhang et al., 2019).

    Compute gradients at ``fast``; evaluate (test, infer) at ``slow``. Start both at
    the same values with ``LookaheadParams.init_synced(params)``.
    """

    fast: Params
    slow: Params

    @classmethod
    def init_synced(cls, params: Params) -> LookaheadParams:
        """Fast params `params`, and slow params a copy of them (not the same tensors:
        a compiled step guards on which of its inputs are one tensor, and would compile
        again once they part)."""
        slow = optree.tree_map(lambda p: None if p is None else p.clone(), params, none_is_leaf=True)
        return cls(fast=params, slow=slow)


def lookahead(
    fast_optimizer: GradientTransformation,
    sync_period: int,
    slow_step_size: float | Tensor,
    reset_state: bool = False,
) -> GradientTransformation:
    """The Lookahead optimizer (Zhang et al., 2019), as optax's ``lookahead``.

    `fast_optimizer` steps the fast params; every `sync_period` steps the slow params
    move `slow_step_size` of the way towards the fast ones, and the fast params restart
    from there. It works on `LookaheadParams`: pass them as ``params`` to ``init`` and
    ``update``, gradients computed at ``params.fast``, and apply the returned updates
    (a `LookaheadParams` too) unchanged with `apply_updates`. With `reset_state`, the
    fast optimizer's state restarts from its init at each synchronization.

    Example:
        >>> import torch, funcopt as fo
        >>> tx = fo.lookahead(fo.sgd(lr=1.0), sync_period=2, slow_step_size=0.5)
        >>> params = fo.LookaheadParams.init_synced([torch.zeros(1)])
        >>> state = tx.init(params)
        >>> for _ in range(2):
        ...     updates, state = tx.update([torch.ones(1)], state, params)
        ...     params = fo.apply_updates(params, updates)
        >>> params.fast[0], params.slow[0]  # two fast steps to -2, then halfway back
        (tensor([-1.]), tensor([-1.]))
    """
    check_transformation(fast_optimizer, "lookahead")
    if not isinstance(sync_period, Tensor) and (isinstance(sync_period, bool) or not sync_period >= 1):
        raise ValueError(f"lookahead: sync_period must be >= 1, got {sync_period!r}")
    return GradientTransformation(
        functools.partial(_lookahead_init, fast_optimizer),
        functools.partial(_lookahead_update, fast_optimizer, sync_period, slow_step_size, reset_state),
    )


def _lookahead_init(fast_optimizer: GradientTransformation, params: Params) -> LookaheadState:
    if isinstance(params, LookaheadParams):
        fast = params.fast
    else:
        warnings.warn(
            "lookahead init: params is not a LookaheadParams; taking it as the fast params. Pass "
            "fo.LookaheadParams.init_synced(params), as update needs both fast and slow params",
            stacklevel=2,
        )
        fast = params
    return LookaheadState(fast_state=fast_optimizer.init(fast), steps_since_sync=_counter(fast))


def _lookahead_update(
    fast_optimizer: GradientTransformation,
    sync_period: int,
    slow_step_size: float | Tensor,
    reset_state: bool,
    updates: Updates,
    state: LookaheadState,
    params: LookaheadParams | None = None,
    **extra_args: Any,
) -> tuple[LookaheadParams, LookaheadState]:
    who = "lookahead update"
    _check_state(state, LookaheadState, who)
    if not isinstance(params, LookaheadParams):
        raise TypeError(
            f"{who}: params must be the LookaheadParams(fast=..., slow=...), got "
            f"{'None' if params is None else a_kind(params)}; gradients are those of params.fast"
        )
    updates, fast_state = _update(fast_optimizer, updates, state.fast_state, params.fast, extra_args)
    sync = state.steps_since_sync == sync_period - 1
    # fast + updates is the last fast step; at a sync, slow moves towards it and fast restarts at slow
    diff = _map_updates(
        lambda u, f, s: f + u - s,
        updates,
        params.fast,
        params.slow,
        who=who,
        what="params.fast and params.slow",
    )
    slow = _map_updates(
        lambda d: torch.where(sync, slow_step_size * d, torch.zeros_like(d)), diff, who=who, what=""
    )
    fast = _map_updates(
        lambda u, d: torch.where(sync, u - (1 - slow_step_size) * d, u), updates, diff, who=who, what=""
    )
    if reset_state:
        fast_state = _where(sync, fast_optimizer.init(params.fast), fast_state, who)
    steps = torch.remainder(state.steps_since_sync + 1, sync_period).to(state.steps_since_sync.dtype)
    return LookaheadParams(fast=fast, slow=slow), LookaheadState(fast_state, steps)


torch.serialization.add_safe_globals(
    [LookaheadParams, LookaheadState]
)  # load with torch.load(weights_only=True)
