"""Wrappers around transformations: `inject_hyperparams`, `MultiSteps`,
`apply_if_finite`, `lookahead`, `schedule_free` (optax's names, arguments and math).

Every wrapper is branch-free: where optax chooses with ``lax.cond``, these compute both
sides and pick with ``torch.where``, so that a compiled step is one graph for every
step (``torch.compile(fullgraph=True)`` does not recompile as counters change) and
``torch.func.vmap`` batches it. Counters are 0-d int32 tensors that saturate at their
largest value, as optax's ``safe_increment``. A wrapper passes extra keyword arguments
of ``update`` (a loss value) to the transformation it wraps, when there are any.
"""

from __future__ import annotations

import functools
import inspect
import warnings
from collections.abc import Callable, Collection, Mapping
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
    chain,
    check_transformation,
    readable,
    tracing,
)
from ..core.hyperparams import (
    ScheduledState,
    _at,
    _check_state,
    _counter,
    _device,
    _increment,
    _tensors,
    _update,
)
from ..core.public import remember

__all__ = [
    "ApplyIfFiniteState",
    "InjectHyperparamsState",
    "LookaheadParams",
    "LookaheadState",
    "MultiSteps",
    "MultiStepsState",
    "ScheduleFreeState",
    "apply_if_finite",
    "inject_hyperparams",
    "lookahead",
    "schedule_free",
    "schedule_free_adamw",
    "schedule_free_eval_params",
    "schedule_free_sgd",
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


# ---------------------------------------------------------------------- inject_hyperparams


class InjectHyperparamsState(NamedTuple):
    """The state of a transformation made by `inject_hyperparams` (optax's fields).

    Attributes:
        count: updates made so far (a 0-d int32 tensor); schedules are evaluated at it.
        hyperparams: the hyperparameters of the last update, each a tensor (a tuple of
            them for a pair such as ``betas``): read them for logging, or replace one
            between steps with ``state._replace(hyperparams={**state.hyperparams,
            'lr': torch.full_like(state.hyperparams['lr'], 0.01)})``.
        inner_state: the inner transformation's state.
    """

    count: Tensor  # type: ignore[assignment]  # optax's name (it hides tuple.count)
    hyperparams: dict[str, Any]
    inner_state: State


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_dynamic(value: Any) -> bool:
    """Whether a hyperparameter value may live in the state: a number, a tensor or a
    schedule, or a tuple of them (``betas``)."""
    if isinstance(value, (tuple, list)):
        return len(value) > 0 and all(_is_dynamic(v) and not isinstance(v, (tuple, list)) for v in value)
    return _is_number(value) or isinstance(value, Tensor) or callable(value)


def _as_hyperparam(value: Any, dtype: torch.dtype, device: torch.device, float_default: bool) -> Any:
    """`value` (a number or tensor, or a tuple of them) as it lives in the state: a
    tensor, floats in `dtype`. A Python int becomes a float tensor where the factory's
    default is a float (``weight_decay=0``), else an int64 one."""
    if isinstance(value, tuple):
        return tuple(_as_hyperparam(v, dtype, device, float_default) for v in value)
    if isinstance(value, Tensor):
        return value.to(dtype) if value.is_floating_point() else value
    if isinstance(value, float) or (float_default and _is_number(value)):
        return torch.tensor(float(value), dtype=dtype, device=device)
    return torch.tensor(value, device=device)


def _float_default(default: Any) -> bool:
    if isinstance(default, (tuple, list)):
        return any(isinstance(v, float) for v in default)
    return isinstance(default, float)


def inject_hyperparams(
    inner_factory: Callable[..., GradientTransformation],
    static_args: str | Collection[str] = (),
    hyperparam_dtype: torch.dtype | None = None,
) -> Callable[..., GradientTransformation]:
    """Make a factory whose hyperparameters live in the state (optax's ``inject_hyperparams``).

    ``inject_hyperparams(fo.adamax)(lr=0.1)`` is ``fo.adamax(lr=0.1)`` with its numeric
    hyperparameters kept as tensors in ``state.hyperparams``: read them for logging,
    or replace one between steps (``state._replace(hyperparams={...})``); the next
    update uses the new value. A compiled step does not recompile for it (tensor
    values are not guarded, only their dtype: replace a value by one of the same dtype,
    as ``torch.full_like(state.hyperparams['lr'], 0.01)`` makes).

    A hyperparameter given as a schedule (a function ``count -> value``, such as
    ``fo.linear_schedule(...)``) is evaluated at ``state.count`` at each update, and
    the state holds the value it took. Pairs may mix both: ``betas=(schedule, 0.999)``.

    Args:
        inner_factory: a function returning a `GradientTransformation` (``fo.adamax``).
        static_args: names of arguments to pass as they are, never as tensors: callables
            that are not schedules, and ints the factory needs as Python ints. Bools,
            strings and None always pass as they are.
        hyperparam_dtype: the dtype of the float hyperparameters; by default the
            widest float dtype of the params.

    Python numbers become 0-d tensors on the params' device (an int becomes a float
    where the factory's default is a float).

    Example:
        >>> import torch, funcopt as fo
        >>> tx = fo.inject_hyperparams(fo.adamax)(lr=lambda count: 0.1 / (count + 1))
        >>> params = [torch.zeros(2)]
        >>> state = tx.init(params)
        >>> for _ in range(2):
        ...     updates, state = tx.update([torch.ones(2)], state, params)
        >>> state.hyperparams["lr"], updates[0]  # the lr of the second update
        (tensor(0.0500), tensor([-0.0500, -0.0500]))
    """
    static = {static_args} if isinstance(static_args, str) else set(static_args)
    name = getattr(inner_factory, "__name__", "the factory")
    try:
        signature = inspect.signature(inner_factory)
    except (TypeError, ValueError):
        raise TypeError(
            f"inject_hyperparams: expected a factory function, got {a_kind(inner_factory)}"
        ) from None
    if not static <= set(signature.parameters):
        raise ValueError(
            f"inject_hyperparams: static_args {sorted(static - set(signature.parameters))} are not arguments "
            f"of {name}, whose arguments are {list(signature.parameters)}"
        )

    return _InjectHyperparams(inner_factory, static_args, hyperparam_dtype, static, signature)


class _InjectHyperparams:
    """`inject_hyperparams`'s factory. It pickles as the call of `inject_hyperparams` that
    made it, and its transformations as its calls."""

    def __init__(
        self,
        inner_factory: Callable[..., GradientTransformation],
        static_args: str | Collection[str],
        hyperparam_dtype: torch.dtype | None,
        static: set[str],
        signature: inspect.Signature,
    ) -> None:
        self.given = (inner_factory, static_args, hyperparam_dtype)
        self.inner_factory, self.static, self.signature = inner_factory, static, signature
        functools.update_wrapper(self, inner_factory)

    def __reduce__(self) -> tuple[Any, ...]:
        return (inject_hyperparams, self.given)

    def __call__(self, *args: Any, **kwargs: Any) -> GradientTransformation:
        inner_factory, static, signature = self.inner_factory, self.static, self.signature
        name = getattr(inner_factory, "__name__", "the factory")
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError as e:
            raise TypeError(f"inject_hyperparams({name}): {e}") from None
        bound.apply_defaults()
        arguments: dict[str, Any] = {}
        for key, value in bound.arguments.items():
            kind = signature.parameters[key].kind
            if kind is inspect.Parameter.VAR_KEYWORD:
                arguments.update(value)
            elif kind is inspect.Parameter.VAR_POSITIONAL:
                if value:
                    raise TypeError(f"inject_hyperparams({name}): pass hyperparameters by name")
            else:
                arguments[key] = value
        fixed, templates = {}, {}
        for key, value in arguments.items():
            if key in static or isinstance(value, bool) or not _is_dynamic(value):
                fixed[key] = value
            else:
                templates[key] = tuple(value) if isinstance(value, list) else value
        floats = {
            key: _float_default(signature.parameters[key].default) if key in signature.parameters else False
            for key in templates
        }
        # the factory's own checks (ranges of Python numbers, names), once, before any tensor is made
        inner_factory(
            **fixed, **{k: _at(v, torch.zeros((), dtype=torch.int32)) for k, v in templates.items()}
        )
        hyperparam_dtype = self.given[2]
        tx = GradientTransformation(
            functools.partial(_inject_init, inner_factory, fixed, templates, floats, hyperparam_dtype),
            functools.partial(_inject_update, inner_factory, fixed, templates, floats, hyperparam_dtype),
        )
        return remember(tx, self, args, kwargs)


def _injected(
    templates: dict[str, Any],
    stored: Mapping[str, Any],
    count: Tensor,
    floats: dict[str, bool],
    dtype: torch.dtype,
    device: torch.device,
) -> dict[str, Any]:
    """The hyperparameters of the step at `count`: schedules evaluated there, the other
    values from `stored` (the state's, which a user may have replaced)."""

    def current(template: Any, value: Any) -> Any:
        if isinstance(template, tuple):
            if not isinstance(value, tuple) or len(value) != len(template):
                value = (value,) * len(template)  # only read where the template is a number
            return tuple(current(t, v) for t, v in zip(template, value))
        return template(count) if callable(template) else value

    hyperparams = {}
    for key, template in templates.items():
        if key not in stored and not callable(template):
            raise KeyError(
                f"inject_hyperparams update: the state's hyperparams have no {key!r}; replace values, "
                "keeping every key that init put there"
            )
        value = current(template, stored.get(key))
        hyperparams[key] = _as_hyperparam(value, dtype, device, floats[key])
    return hyperparams


def _inject_init(
    factory: Callable[..., GradientTransformation],
    fixed: dict[str, Any],
    templates: dict[str, Any],
    floats: dict[str, bool],
    hyperparam_dtype: torch.dtype | None,
    params: Params,
) -> InjectHyperparamsState:
    count = _counter(params)
    dtype = _highest_dtype(params) if hyperparam_dtype is None else hyperparam_dtype
    hyperparams = _injected(templates, templates, count, floats, dtype, count.device)
    return InjectHyperparamsState(count, hyperparams, factory(**fixed, **hyperparams).init(params))


def _inject_update(
    factory: Callable[..., GradientTransformation],
    fixed: dict[str, Any],
    templates: dict[str, Any],
    floats: dict[str, bool],
    hyperparam_dtype: torch.dtype | None,
    updates: Updates,
    state: InjectHyperparamsState,
    params: Params | None = None,
    **extra_args: Any,
) -> tuple[Updates, InjectHyperparamsState]:
    _check_state(state, InjectHyperparamsState, "inject_hyperparams update")
    dtype = (
        _highest_dtype(updates if params is None else params)
        if hyperparam_dtype is None
        else hyperparam_dtype
    )
    hyperparams = _injected(templates, state.hyperparams, state.count, floats, dtype, state.count.device)
    updates, inner_state = _update(
        factory(**fixed, **hyperparams), updates, state.inner_state, params, extra_args
    )
    return updates, InjectHyperparamsState(_increment(state.count), hyperparams, inner_state)


# ------------------------------------------------------------------------------ lookahead


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


# -------------------------------------------------------------------------- schedule_free


class ScheduleFreeState(NamedTuple):
    """The state of `schedule_free` (optax's fields).

    Attributes:
        b1: the interpolation weight ``b1``, for `schedule_free_eval_params`.
        weight_sum: the sum of the averaging weights ``max_lr ** weight_lr_power``.
        step_count: the step the next update takes (from 1).
        max_lr: the largest learning rate so far.
        base_optimizer_state: the base optimizer's state.
        z: the base optimizer's iterate.
    """

    b1: Tensor
    weight_sum: Tensor
    step_count: Tensor
    max_lr: Tensor
    base_optimizer_state: State
    z: Params


def schedule_free(
    base_optimizer: GradientTransformation,
    learning_rate: float | Tensor | Callable[[Tensor], Any],
    b1: float | Tensor = 0.9,
    weight_lr_power: float | Tensor = 2.0,
    state_dtype: torch.dtype | None = None,
    r: float | Tensor = 0.0,
) -> GradientTransformation:
    """Schedule-Free learning (Defazio et al., 2024), as its authors' ``schedulefree``
    package computes it (``optax.contrib.schedule_free``'s arguments).

    Replaces the momentum of `base_optimizer` by interpolation and averaging: the
    base optimizer steps a sequence ``z``; the params you hold (``y``, where gradients
    are computed) are ``b1 * x + (1 - b1) * z`` with ``x`` the running average of the
    ``z``, weighted at step ``t`` (from 1) by ``t ** r * max_lr ** weight_lr_power``.
    Evaluate at ``x``, which `schedule_free_eval_params` gives. No decaying schedule is
    needed; `learning_rate` (a number, or a schedule for the warmup) is the one
    `base_optimizer` uses. A schedule is read at the step count from 0, as the base
    optimizer reads its own, so that the averaging weight and the base step of a step
    see the same learning rate (optax reads it one step later here: docs/wrappers.md).
    Give `base_optimizer` no momentum of its own.

    Args:
        base_optimizer: the optimizer stepping ``z`` (SGD, or Adam with ``b1 = 0``).
        learning_rate: the base optimizer's learning rate, or its schedule.
        b1: the interpolation weight (> 0).
        weight_lr_power: the power of the learning rate in the averaging weights.
        state_dtype: dtype of ``z`` (default: the params').
        r: the power of the step in the averaging weights (the authors' polynomial
            weighting; 0: none).

    Example:
        >>> import torch, funcopt as fo
        >>> tx = fo.schedule_free(fo.sgd(lr=0.1), learning_rate=0.1)
        >>> params = [torch.tensor([4.0])]
        >>> state = tx.init(params)
        >>> for _ in range(3):  # minimize x ** 2
        ...     updates, state = tx.update([2 * params[0]], state, params)
        ...     params = fo.apply_updates(params, updates)
        >>> params[0], fo.schedule_free_eval_params(state, params)[0]  # y, where gradients are taken; x
        (tensor([2.5242]), tensor([2.5835]))
    """
    check_transformation(base_optimizer, "schedule_free")
    if not isinstance(b1, Tensor) and not b1 > 0:
        raise ValueError(f"schedule_free: b1 must be > 0, got {b1}")
    return GradientTransformation(
        functools.partial(_free_init, base_optimizer, b1, state_dtype),
        functools.partial(_free_update, base_optimizer, learning_rate, b1, weight_lr_power, r=r),
    )


def _free_init(
    base_optimizer: GradientTransformation,
    b1: float | Tensor,
    state_dtype: torch.dtype | None,
    params: Params,
) -> ScheduleFreeState:
    dtype = _lowest_dtype(params)  # no scalar of the state promotes a param
    device = _device(params)
    z = optree.tree_map(
        lambda p: MaskedNode() if p is None else p.to(state_dtype or p.dtype, copy=True),
        params,
        none_is_leaf=True,
    )
    return ScheduleFreeState(
        b1=b1.to(dtype) if isinstance(b1, Tensor) else torch.tensor(b1, dtype=dtype, device=device),
        weight_sum=torch.zeros((), dtype=dtype, device=device),
        step_count=_counter(params, 1),
        max_lr=torch.zeros((), dtype=dtype, device=device),
        base_optimizer_state=base_optimizer.init(params),
        z=z,
    )


def _free_update(
    base_optimizer: GradientTransformation,
    learning_rate: float | Tensor | Callable[[Tensor], Any],
    b1: float | Tensor,
    weight_lr_power: float | Tensor,
    grads: Updates,
    state: ScheduleFreeState,
    params: Params | None = None,
    *,
    r: float | Tensor = 0.0,  # by keyword: a transformation pickled before r existed still loads
    **extra_args: Any,
) -> tuple[Updates, ScheduleFreeState]:
    who = "schedule_free update"
    _check_state(state, ScheduleFreeState, who)
    if params is None:
        raise ValueError(
            f"{who}: pass the params (update(grads, state, params)); schedule-free steps from them"
        )
    # the schedule at the count from 0, where the base optimizer reads its own
    lr = learning_rate(state.step_count - 1) if callable(learning_rate) else learning_rate
    lr = lr.to(state.max_lr.dtype) if isinstance(lr, Tensor) else torch.full_like(state.max_lr, lr)
    max_lr = torch.maximum(state.max_lr, lr)
    weight = max_lr**weight_lr_power
    if isinstance(r, Tensor) or r != 0:
        weight = state.step_count.to(weight.dtype) ** r * weight
    total_weight = state.weight_sum + weight
    # 0 / 0 while the learning rate is 0 (a warmup's first step) counts as 0
    ck = torch.where(
        torch.isnan(weight) | torch.isnan(total_weight),
        torch.full_like(weight, float("nan")),
        torch.nan_to_num(weight / total_weight, nan=0.0, posinf=float("inf")),
    )
    base_updates, base_state = _update(base_optimizer, grads, state.base_optimizer_state, params, extra_args)

    def step(u: Tensor, z: Tensor, y: Tensor) -> Tensor:
        # x_new = (1 - ck) x + ck z_new and y = b1 x + (1 - b1) z, with x not formed: the
        # authors' form, y_new = y + ck (z - y) + (1 - b1 (1 - ck)) u (u: the base step)
        return (ck * (z - y) + (1.0 - b1 * (1.0 - ck)) * u).to(y.dtype)

    what = "the state's z and the params"
    new_z = _map_updates(lambda u, z: (z + u).to(z.dtype), base_updates, state.z, who=who, what=what)
    updates = _map_updates(step, base_updates, state.z, params, who=who, what=what)
    return updates, ScheduleFreeState(
        b1=state.b1,
        weight_sum=total_weight,
        step_count=_increment(state.step_count),
        max_lr=max_lr,
        base_optimizer_state=base_state,
        z=_fill_skipped(new_z, state.z),
    )


def schedule_free_eval_params(state: ScheduleFreeState, params: Params) -> Params:
    """The params to evaluate a `schedule_free` model at (the average ``x``), from its
    state and the params being trained (as ``optax.contrib.schedule_free_eval_params``).

    Example:
        >>> import torch, funcopt as fo
        >>> tx = fo.schedule_free(fo.adagrad(lr=0.1), learning_rate=0.1)
        >>> params = {"w": torch.ones(2)}
        >>> state = tx.init(params)
        >>> fo.schedule_free_eval_params(state, params)["w"]  # before any step: the params
        tensor([1., 1.])
    """
    if not isinstance(state, ScheduleFreeState):
        raise ValueError(
            f"schedule_free_eval_params needs the ScheduleFreeState of a schedule_free transformation, got "
            f"{a_kind(state)}"
        )
    b1 = state.b1
    return _map_updates(
        lambda y, z: ((y - (1.0 - b1) * z) / b1).to(y.dtype),
        params,
        state.z,
        who="schedule_free_eval_params",
        what="the state's z",
    )


def _warmup(learning_rate: float | Tensor, warmup_steps: int | None, who: str) -> Any:
    """The authors' warmup: ``learning_rate * (count + 1) / warmup_steps`` at the step
    count from 0 (so the first step's, not 0) up to `learning_rate` at step
    `warmup_steps`, then constant; 0 or None: no warmup."""
    from .schedules import linear_schedule  # (these import nothing from this module, but keep it light)

    if warmup_steps is None:
        return learning_rate
    if isinstance(warmup_steps, bool) or not isinstance(warmup_steps, int) or warmup_steps < 0:
        raise ValueError(f"{who}: warmup_steps must be an int >= 0 (0: no warmup), got {warmup_steps!r}")
    if warmup_steps == 0:
        return learning_rate
    return linear_schedule(learning_rate / warmup_steps, learning_rate, transition_steps=warmup_steps - 1)


def schedule_free_sgd(
    learning_rate: float | Tensor = 1.0,
    warmup_steps: int | None = 0,
    b1: float | Tensor = 0.9,
    weight_decay: float | Tensor | None = None,
    weight_lr_power: float | Tensor = 2.0,
    state_dtype: torch.dtype | None = None,
    r: float | Tensor = 0.0,
) -> GradientTransformation:
    """Schedule-Free SGD, as the authors' ``schedulefree.SGDScheduleFree`` computes it
    (``optax.contrib.schedule_free_sgd``'s arguments, and `r`): `schedule_free` around
    ``sgd(learning_rate)`` (with `weight_decay` added to the gradients first, if given),
    the learning rate warmed up linearly over `warmup_steps` (0 or None: no warmup), the
    first step at ``learning_rate / warmup_steps``.

    Example:
        >>> import torch, funcopt as fo
        >>> tx = fo.schedule_free_sgd(learning_rate=0.1, warmup_steps=2)
        >>> params = [torch.tensor([4.0])]
        >>> state = tx.init(params)
        >>> for _ in range(3):
        ...     updates, state = tx.update([2 * params[0]], state, params)
        ...     params = fo.apply_updates(params, updates)
        >>> fo.schedule_free_eval_params(state, params)[0]
        tensor([2.6925])
    """
    from .blocks import add_decayed_weights, scale_by_learning_rate

    lr = _warmup(learning_rate, warmup_steps, "schedule_free_sgd")
    optimizer = scale_by_learning_rate(lr)
    if weight_decay is not None:
        optimizer = chain(add_decayed_weights(weight_decay), optimizer)
    return schedule_free(optimizer, lr, b1=b1, weight_lr_power=weight_lr_power, state_dtype=state_dtype, r=r)


def schedule_free_adamw(
    learning_rate: float | Tensor = 0.0025,
    warmup_steps: int | None = 0,
    b1: float | Tensor = 0.9,
    b2: float | Tensor = 0.999,
    eps: float | Tensor = 1e-8,
    weight_decay: float | Tensor = 0.0,
    weight_lr_power: float | Tensor = 2.0,
    state_dtype: torch.dtype | None = None,
    r: float | Tensor = 0.0,
) -> GradientTransformation:
    """Schedule-Free AdamW, as the authors' ``schedulefree.AdamWScheduleFree`` computes it
    (``optax.contrib.schedule_free_adamw``'s arguments, and `r`): `schedule_free` around
    AdamW without its momentum (``scale_by_rms`` with Adam's bias correction and eps
    outside the root, decoupled weight decay, the learning rate), the learning rate
    warmed up linearly over `warmup_steps` (0 or None: no warmup), the first step at
    ``learning_rate / warmup_steps``.

    Example:
        >>> import torch, funcopt as fo
        >>> tx = fo.schedule_free_adamw(learning_rate=1.0)
        >>> params = [torch.tensor([1.0, 2.0, 3.0])]
        >>> state = tx.init(params)
        >>> for _ in range(5):  # minimize the sum of squares
        ...     updates, state = tx.update([2 * params[0]], state, params)
        ...     params = fo.apply_updates(params, updates)
        >>> round(float((fo.schedule_free_eval_params(state, params)[0] ** 2).sum()), 3)
        0.413
    """
    from .blocks import add_decayed_weights, scale_by_learning_rate, scale_by_rms

    lr = _warmup(learning_rate, warmup_steps, "schedule_free_adamw")
    optimizer = chain(
        scale_by_rms(decay=b2, eps=eps, eps_in_sqrt=False, bias_correction=True),
        add_decayed_weights(weight_decay),
        scale_by_learning_rate(lr),
    )
    return schedule_free(optimizer, lr, b1=b1, weight_lr_power=weight_lr_power, state_dtype=state_dtype, r=r)


torch.serialization.add_safe_globals(  # load with torch.load(weights_only=True)
    [
        ApplyIfFiniteState,
        InjectHyperparamsState,
        LookaheadParams,
        LookaheadState,
        MultiStepsState,
        ScheduleFreeState,
        ScheduledState,
    ]
)
