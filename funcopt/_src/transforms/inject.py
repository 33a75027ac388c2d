"""`inject_hyperparams`: a factory whose hyperparameters live in the state (optax's), as tensors
that a step reads and a user may replace between steps; schedules evaluated at the count."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Collection, Mapping
from typing import Any, NamedTuple

import torch
from torch import Tensor

from ..core.base import (
    GradientTransformation,
    Params,
    State,
    Updates,
    a_kind,
)
from ..core.hyperparams import (
    _at,
    _check_state,
    _counter,
    _increment,
    _update,
)
from ..core.public import remember
from .wrappers import _highest_dtype

__all__ = ["InjectHyperparamsState", "inject_hyperparams"]


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


torch.serialization.add_safe_globals([InjectHyperparamsState])  # load with torch.load(weights_only=True)
