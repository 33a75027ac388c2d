"""Wrappers around transformations: `MultiSteps` and `apply_if_finite` here, and
`inject_hyperparams`, `lookahead`, `schedule_free` in modules of their own (optax's names,
arguments and math), with the helpers they share.

Every wrapper is branch-free: where optax chooses with ``lax.cond``, these compute both
sides and pick with ``torch.where``, so that a compiled step is one graph for every
step (``torch.compile(fullgraph=True)`` does not recompile as counters change) and
``torch.func.vmap`` batches it. Counters are 0-d int32 tensors that saturate at their
largest value, as optax's ``safe_increment``. A wrapper passes extra keyword arguments
of ``update`` (a loss value) to the transformation it wraps, when there are any.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import optree
import torch
from torch import Tensor

from ..core.base import (
    GradientTransformation,
    MaskedNode,
    Params,
    State,
    Updates,
    a_kind,
    check_transformation,
    readable,
    tracing,
)
from ..core.hyperparams import (
    ScheduledState,
    _check_state,
    _counter,
    _device,
    _increment,
    _tensors,
    _update,
)

__all__ = [
    "ApplyIfFiniteState",
    "MultiSteps",
    "MultiStepsState",
    "apply_if_finite",
    "skip_large_updates",
    "skip_not_finite",
]


# ----------------------------------------------------------------------------- helpers


def _float_dtypes(tree: Any) -> list[torch.dtype]:
    """The real dtypes of the floating (or complex) tensors of `tree`."""
    return [
        t.real.dtype if t.is_complex() else t.dtype
        for t in _tensors(tree)
        if t.is_floating_point() or t.is_complex()
    ]


def _highest_dtype(tree: Any) -> torch.dtype:
    """The widest float dtype of `tree` (optax's ``tree.dtype(tree, 'highest')``), or
    the default dtype if it holds no float tensor."""
    dtypes = _float_dtypes(tree)
    return functools.reduce(torch.promote_types, dtypes) if dtypes else torch.get_default_dtype()


def _lowest_dtype(tree: Any) -> torch.dtype:
    """The narrowest float dtype of `tree`, or the default dtype if it holds none."""
    dtypes = _float_dtypes(tree)
    return min(dtypes, key=lambda d: d.itemsize) if dtypes else torch.get_default_dtype()


def _map_updates(fn: Callable[..., Any], updates: Updates, *others: Any, who: str, what: str) -> Any:
    """``fn(u, *o)`` for each leaf ``u`` of `updates` and the matching leaves of
    `others`; a None update stays None."""
    try:
        return optree.tree_map(
            lambda u, *o: None if u is None else fn(u, *o), updates, *others, none_is_leaf=True
        )
    except ValueError as e:
        raise ValueError(
            f"{who}: the updates and {what} do not have the same structure ({e}). Pass gradients with the "
            "structure of the params that init was given."
        ) from None


class _CannotPick(ValueError):
    """Two states that `_where` cannot choose between leaf by leaf."""


def _where(keep_new: Tensor, new: Any, old: Any, who: str) -> Any:
    """`new` where `keep_new` is True, else `old`, leaf by leaf over two states of one
    structure (optax's ``lax.cond`` between them); each leaf keeps `old`'s dtype, so
    that the state's dtypes do not change from step to step. States of two structures
    (a buffer made at the first step) are chosen as a whole in Python, where the
    condition may be read (not under torch.compile or torch.func). Leaves that one tensor
    fills in both states (the step counter that an algorithm shares among its params)
    get one tensor in the result too: a compiled step guards on that sharing."""
    picked: dict[tuple[int, int], Tensor] = {}  # eager: by id
    traced: list[tuple[Tensor, Tensor, Tensor]] = []  # compiling: id() would guard on each tensor

    def pick(n: Any, o: Any) -> Any:
        if isinstance(n, Tensor) and isinstance(o, Tensor):
            compiling = torch.compiler.is_compiling()
            if compiling:
                for n2, o2, result in traced:
                    if n2 is n and o2 is o:
                        return result
            elif (id(n), id(o)) in picked:
                return picked[id(n), id(o)]
            cond = keep_new if keep_new.device == o.device else keep_new.to(o.device)
            result = torch.where(cond, n.to(o.dtype), o)
            if compiling:
                traced.append((n, o, result))
            else:
                picked[id(n), id(o)] = result
            return result
        if not isinstance(n, Tensor) and not isinstance(o, Tensor) and (n is o or n == o):
            return o
        raise _CannotPick(f"it holds {a_kind(o)} where its update returned {a_kind(n)}")

    try:
        return optree.tree_map(pick, new, old)
    except ValueError as e:
        # a buffer made at the first step (fo.sgd's momentum buffer, an empty node before):
        # no tensor to pick from on one side; choose the whole state in Python where one may
        if not tracing() and readable(keep_new):
            return new if bool(keep_new) else old
        raise ValueError(
            f"{who}: the inner state has another structure after this step than before it ({e}), as where "
            "a buffer appears at the first step (fo.sgd's momentum buffer), or holds other Python values. "
            "Under torch.compile or torch.func "
            "the wrapper cannot choose between the two states with torch.where: take the first steps outside "
            "them, until the inner transformation has stepped once, or use an inner transformation whose "
            "state keeps its structure"
        ) from None


def _zero_unless(keep: Tensor, updates: Updates) -> Updates:
    """`updates` where `keep`, else zeros (a None update stays None)."""
    return optree.tree_map(
        lambda u: (
            None if u is None else torch.where(keep, u, torch.zeros((), dtype=u.dtype, device=u.device))
        ),
        updates,
        none_is_leaf=True,
    )


def _all_finite(tree: Any) -> Tensor:
    """A 0-d bool tensor: whether every element of every tensor of `tree` is finite."""
    tensors = _tensors(tree)
    if not tensors:
        return torch.ones((), dtype=torch.bool)
    device = tensors[0].device
    return torch.stack([torch.isfinite(t).all().to(device) for t in tensors]).all()


# ---------------------------------------------------------------------- apply_if_finite


class ApplyIfFiniteState(NamedTuple):
    """The state of `apply_if_finite` (optax's fields).

    Attributes:
        notfinite_count: consecutive updates with an inf or a NaN (0 after a finite one).
        last_finite: whether the last update was finite.
        total_notfinite: updates with an inf or a NaN since init (never reset).
        inner_state: the wrapped transformation's state.
    """

    notfinite_count: Tensor
    last_finite: Tensor
    total_notfinite: Tensor
    inner_state: State


def apply_if_finite(
    inner: GradientTransformation, max_consecutive_errors: int | Tensor
) -> GradientTransformation:
    """Skip the updates whose gradients hold an inf or a NaN (optax's ``apply_if_finite``).

    Where any gradient element is not finite, the update is all zeros and the inner
    state stays as it was, so one bad batch (an overflow in mixed precision) does not
    poison the optimizer's moments. After more than `max_consecutive_errors` such
    updates in a row, the wrapper gives up and applies the update anyway. The state
    counts them (`ApplyIfFiniteState`), for logging.

    Both outcomes are computed and one is picked with ``torch.where``: no
    data-dependent branch, so a compiled step is one graph.

    Example:
        >>> import torch, funcopt as fo
        >>> tx = fo.apply_if_finite(fo.adamax(lr=0.1), max_consecutive_errors=2)
        >>> params = [torch.zeros(2)]
        >>> state = tx.init(params)
        >>> updates, state = tx.update([torch.tensor([1.0, float("nan")])], state, params)
        >>> updates[0], int(state.notfinite_count), int(state.inner_state.step[0])
        (tensor([0., 0.]), 1, 0)
        >>> updates, state = tx.update([torch.tensor([1.0, 1.0])], state, params)
        >>> updates[0], int(state.notfinite_count), int(state.total_notfinite)
        (tensor([-0.1000, -0.1000]), 0, 1)
    """
    check_transformation(inner, "apply_if_finite")
    if not isinstance(max_consecutive_errors, Tensor) and not max_consecutive_errors >= 0:
        raise ValueError(
            f"apply_if_finite: max_consecutive_errors must be >= 0, got {max_consecutive_errors}"
        )
    return GradientTransformation(
        functools.partial(_finite_init, inner),
        functools.partial(_finite_update, inner, max_consecutive_errors),
    )


def _finite_init(inner: GradientTransformation, params: Params) -> ApplyIfFiniteState:
    return ApplyIfFiniteState(
        notfinite_count=_counter(params),
        last_finite=torch.ones((), dtype=torch.bool, device=_device(params)),
        total_notfinite=_counter(params),
        inner_state=inner.init(params),
    )


def _finite_update(
    inner: GradientTransformation,
    max_consecutive_errors: int | Tensor,
    updates: Updates,
    state: ApplyIfFiniteState,
    params: Params | None = None,
    **extra_args: Any,
) -> tuple[Updates, ApplyIfFiniteState]:
    who = "apply_if_finite update"
    _check_state(state, ApplyIfFiniteState, who)
    count = state.notfinite_count
    finite = _all_finite(updates).to(count.device)
    notfinite_count = torch.where(finite, torch.zeros_like(count), _increment(count))
    new_updates, new_inner = _update(inner, updates, state.inner_state, params, extra_args)
    apply = finite | (notfinite_count > max_consecutive_errors)
    return _zero_unless(apply, new_updates), ApplyIfFiniteState(
        notfinite_count=notfinite_count,
        last_finite=finite,
        total_notfinite=torch.where(finite, state.total_notfinite, _increment(state.total_notfinite)),
        inner_state=_where(apply, new_inner, state.inner_state, who),
    )


# ---------------------------------------------------------------------------- MultiSteps


class MultiStepsState(NamedTuple):
    """The state of `MultiSteps` (optax's fields).

    Attributes:
        mini_step: mini-steps accumulated since the last update (0 to k - 1).
        gradient_step: updates made by the inner transformation.
        inner_opt_state: the wrapped transformation's state.
        acc_grads: the gradients accumulated over the mini-steps (their mean, or sum).
        skip_state: what ``should_skip_update_fn`` returned at the last mini-step.
    """

    mini_step: Tensor
    gradient_step: Tensor
    inner_opt_state: State
    acc_grads: Any
    skip_state: Any = ()


def skip_not_finite(
    updates: Updates, gradient_step: Tensor, params: Params | None
) -> tuple[Tensor, dict[str, Tensor]]:
    """A ``should_skip_update_fn`` for `MultiSteps`: skip a mini-step whose gradients
    hold an inf or a NaN (optax's). Its skip state holds ``should_skip`` and
    ``num_not_finite``, the number of such elements."""
    counts = [torch.logical_not(torch.isfinite(u)).sum() for u in _tensors(updates)]
    num_not_finite = torch.stack(counts).sum() if counts else torch.zeros((), dtype=torch.int64)
    should_skip = num_not_finite > 0
    return should_skip, {"should_skip": should_skip, "num_not_finite": num_not_finite}


def skip_large_updates(
    updates: Updates, gradient_step: Tensor, params: Params | None, max_squared_norm: float | Tensor
) -> tuple[Tensor, dict[str, Tensor]]:
    """A ``should_skip_update_fn`` for `MultiSteps` (with `max_squared_norm` bound by
    ``functools.partial``): skip a mini-step whose squared global norm is not below
    `max_squared_norm` (a NaN norm too), as optax's. Its skip state holds
    ``should_skip`` and ``norm_squared``."""
    squares = [(u * u.conj()).real.sum() if u.is_complex() else (u * u).sum() for u in _tensors(updates)]
    norm_sq = torch.stack(squares).sum() if squares else torch.zeros(())
    should_skip = torch.logical_not(norm_sq < max_squared_norm)
    return should_skip, {"should_skip": should_skip, "norm_squared": norm_sq}


def _no_skip(updates: Updates, gradient_step: Tensor, params: Params | None) -> tuple[Tensor, tuple[()]]:
    return torch.zeros((), dtype=torch.bool, device=gradient_step.device), ()


class MultiSteps:
    """Accumulate gradients over `every_k_schedule` mini-steps, then take one step of
    `opt` with their mean (or sum): gradient accumulation, as optax's ``MultiSteps``.

    The updates of the mini-steps in between are zeros, so the usual loop
    (``update``, then `apply_updates`) stays as it is; ``has_updated(state)`` tells
    whether the last call stepped. `every_k_schedule` is an int, or a function of the
    number of steps taken so far (``state.gradient_step``) that returns one, to grow
    the batch size over training.

    Args:
        opt: the transformation to step every k mini-steps.
        every_k_schedule: mini-steps per step (an int >= 1), or ``gradient_step -> k``.
        use_grad_mean: average the gradients (the default), or else sum them.
        should_skip_update_fn: ``fn(updates, gradient_step, params) -> (skip, skip_state)``
            with ``skip`` a 0-d bool tensor; a skipped mini-step leaves the state as it
            was, as if it had not happened (`skip_not_finite`, `skip_large_updates`).
        accumulator_dtype: dtype of the accumulated gradients; None (the default)
            keeps each param's own (optax's default is float32).

    Mini-steps and steps are one code path (picked with ``torch.where``), so a
    compiled step does not recompile from one mini-step to the next.

    Example:
        >>> import torch, funcopt as fo
        >>> opt = fo.MultiSteps(fo.sgd(lr=1.0), every_k_schedule=2)
        >>> params = [torch.zeros(1)]
        >>> state = opt.init(params)
        >>> updates, state = opt.update([torch.tensor([1.0])], state, params)
        >>> updates[0], bool(opt.has_updated(state))
        (tensor([0.]), False)
        >>> updates, state = opt.update([torch.tensor([3.0])], state, params)
        >>> updates[0], bool(opt.has_updated(state))  # minus the mean of 1 and 3
        (tensor([-2.]), True)
    """

    def __init__(
        self,
        opt: GradientTransformation,
        every_k_schedule: int | Callable[[Tensor], int | Tensor],
        use_grad_mean: bool = True,
        should_skip_update_fn: Callable[..., tuple[Tensor, Any]] | None = None,
        accumulator_dtype: torch.dtype | None = None,
    ) -> None:
        check_transformation(opt, "MultiSteps")
        if not callable(every_k_schedule):
            if (
                isinstance(every_k_schedule, bool)
                or not isinstance(every_k_schedule, int)
                or every_k_schedule < 1
            ):
                raise ValueError(
                    f"MultiSteps: every_k_schedule must be an int >= 1 or a function of the step count, "
                    f"got {every_k_schedule!r}"
                )
        self._opt = opt
        self._every_k_schedule = every_k_schedule
        self._use_grad_mean = use_grad_mean
        self._should_skip_update_fn = should_skip_update_fn  # None: never skip (pickles with no private name)
        self._accumulator_dtype = accumulator_dtype

    @property
    def inner_opt(self) -> GradientTransformation:
        """The wrapped transformation."""
        return self._opt

    def _k(self, gradient_step: Tensor) -> int | Tensor:
        if not callable(self._every_k_schedule):
            return self._every_k_schedule
        k = self._every_k_schedule(gradient_step)
        return k.to(torch.int32) if isinstance(k, Tensor) else k

    def _skip(self, updates: Updates, gradient_step: Tensor, params: Params | None) -> tuple[Tensor, Any]:
        skip, skip_state = (self._should_skip_update_fn or _no_skip)(updates, gradient_step, params)
        if not (isinstance(skip, Tensor) and skip.dtype == torch.bool and skip.shape == ()):
            what = (
                f"dtype {skip.dtype} and shape {tuple(skip.shape)}"
                if isinstance(skip, Tensor)
                else a_kind(skip)
            )
            raise ValueError(
                f"MultiSteps: should_skip_update_fn must return a 0-d bool tensor (and a skip state); it returned {what}"
            )
        return skip, skip_state

    def init(self, params: Params) -> MultiStepsState:
        """The state before the first mini-step: zero counters, zero accumulators."""

        def zeros(p: Any) -> Any:
            if p is None:
                return MaskedNode()  # no leaf: a None leaf would not pass torch.func.vmap
            return torch.zeros_like(p, dtype=self._accumulator_dtype or p.dtype)

        gradient_step = _counter(params)
        zero_updates = optree.tree_map(
            lambda p: None if p is None else torch.zeros_like(p), params, none_is_leaf=True
        )
        _, skip_state = self._skip(zero_updates, gradient_step, params)
        return MultiStepsState(
            mini_step=_counter(params),
            gradient_step=gradient_step,
            inner_opt_state=self._opt.init(params),
            acc_grads=optree.tree_map(zeros, params, none_is_leaf=True),
            skip_state=skip_state,
        )

    def update(
        self, updates: Updates, state: MultiStepsState, params: Params | None = None, **extra_args: Any
    ) -> tuple[Updates, MultiStepsState]:
        """Accumulate `updates`; every k-th mini-step, step the inner transformation
        with the accumulated gradients and return its updates (else zeros)."""
        who = "MultiSteps update"
        _check_state(state, MultiStepsState, who)
        k = self._k(state.gradient_step)
        skip, skip_state = self._skip(updates, state.gradient_step, params)
        n = state.mini_step

        def accumulate(g: Tensor, acc: Any) -> Tensor:
            if not isinstance(acc, Tensor):
                raise ValueError(f"{who}: got a gradient for a param that was None at init")
            if self._use_grad_mean:  # Welford's running mean, as optax
                return (acc + (g - acc) / (n + 1)).to(acc.dtype)
            return (acc + g).to(acc.dtype)

        emit = n == k - 1
        step = emit & ~skip  # the inner transformation steps
        acc_grads = _map_updates(accumulate, updates, state.acc_grads, who=who, what="the state's acc_grads")
        inner_grads = _map_updates(
            lambda g, acc: acc.to(g.dtype), updates, acc_grads, who=who, what="acc_grads"
        )
        final_updates, new_inner = _update(self._opt, inner_grads, state.inner_opt_state, params, extra_args)
        restarted = optree.tree_map(
            lambda acc: None if acc is None else torch.where(emit, torch.zeros_like(acc), acc),
            acc_grads,
            none_is_leaf=True,
        )
        new_state = MultiStepsState(
            mini_step=torch.where(skip, n, torch.remainder(_increment(n), k).to(n.dtype)),
            gradient_step=torch.where(step, _increment(state.gradient_step), state.gradient_step),
            inner_opt_state=_where(step, new_inner, state.inner_opt_state, who),
            acc_grads=_where(~skip, _fill_skipped(restarted, state.acc_grads), state.acc_grads, who),
            skip_state=skip_state,
        )
        return _zero_unless(step, final_updates), new_state

    def has_updated(self, state: MultiStepsState) -> Tensor:
        """Whether the last `update` stepped the inner transformation (a 0-d bool tensor)."""
        return (state.mini_step == 0) & (state.gradient_step > 0)

    def gradient_transformation(self) -> GradientTransformation:
        """This wrapper as a `GradientTransformation` (for `chain` and the adapter)."""
        return GradientTransformation(self.init, self.update)


def _fill_skipped(new: Any, old: Any) -> Any:
    """`new` (mapped over the gradients, so None where a gradient is None) with the
    leaves of `old` (a state tree: a tensor, or a MaskedNode for a None param) there."""
    return optree.tree_map(lambda n, o: o if n is None else n, new, old, none_is_leaf=True)


torch.serialization.add_safe_globals(  # load with torch.load(weights_only=True)
    [ApplyIfFiniteState, MultiStepsState, ScheduledState]
)
