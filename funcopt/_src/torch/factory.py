"""What `fo.Optimizer` takes as its transformation: an `Algorithm`, a transformation, or a
factory of one with its hyperparameters; the checks of each, the factory's arguments that a
param group holds, and the param group that says what to do when a scheduler reads a
hyperparameter no transformation reads."""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable, Iterable
from typing import Any

import torch

from ..core.base import (
    GradientTransformation,
    check_transformation,
)
from ..engine.algorithm import Algorithm, checking_tensors
from ..engine.bounds import Hyperparams
from ..transforms.lookahead import LookaheadState

IMPLEMENTATION_FLAGS = ("foreach", "fused", "capturable", "differentiable")
"""torch.optim's switches that choose an implementation, not the math."""


TransformFactory = Callable[..., GradientTransformation]


def _hyperparams(source: dict[str, Any], names: Iterable[str]) -> Hyperparams:
    """The values in `source` of the hyperparameters among `names` (not torch's switches)."""
    return {name: source[name] for name in names if name not in IMPLEMENTATION_FLAGS}


def _check_transform(transform: Any, defaults: dict[str, Any]) -> None:
    """Raise torch's error for a bad hyperparameter, or a TypeError for a `transform`
    that is neither a transformation nor a factory of one."""
    hyperparams = _hyperparams(defaults, defaults)
    if isinstance(transform, Algorithm):
        missing = [name for name in _required(transform) if name not in defaults]
        if missing:
            raise TypeError(
                f"fo.Optimizer(params, {transform.name} algorithm) needs the hyperparameters "
                f"{', '.join(missing)}, which its math reads: pass each as a keyword argument "
                "(fo.Optimizer(params, algorithm, lr=..., ...))"
            )
        transform.check(defaults, tensors=True)
    elif isinstance(transform, type):
        raise TypeError(
            "transform must be a GradientTransformation or a function returning one, but got "
            f"the class {transform.__name__}: pass a factory such as fo.adamax (with the "
            "hyperparameters as keyword arguments), or use an optimizer class directly"
        )
    elif isinstance(transform, GradientTransformation):
        check_transformation(transform, "fo.Optimizer")
        if hyperparams:  # a scheduler would then change an lr that no step reads
            raise TypeError(
                f"fo.Optimizer got hyperparameters ({', '.join(hyperparams)}) with a transformation "
                "already built, which never reads them: pass a function that builds it from "
                "them instead, such as fo.nadam or lambda lr: fo.chain(..., fo.nadam(lr=lr)), "
                "so that param groups and lr schedulers set them"
            )
        _refuse_lookahead(transform)
    elif not callable(transform):
        raise TypeError(
            "transform must be a GradientTransformation or a function returning one, "
            f"but got {type(transform).__name__}"
        )
    else:  # built once now, so that a bad or unknown hyperparameter fails here, as in torch
        with checking_tensors():  # a tensor's value too, as torch's classes check it
            built = _build(transform, hyperparams)
        _refuse_lookahead(built)


def _required(algorithm: Algorithm) -> list[str]:
    """The hyperparameters that an algorithm's functions take with no default."""
    names: dict[str, None] = {}
    for function in (algorithm.initial, algorithm.schedule, algorithm.elementwise):
        for p in inspect.signature(function).parameters.values():
            if p.kind is inspect.Parameter.KEYWORD_ONLY and p.default is inspect.Parameter.empty:
                names[p.name] = None
    names.pop("counter_dtypes", None)  # (the engine's own)
    return list(names)


def _refuse_lookahead(transform: GradientTransformation) -> None:
    """Raise where the transformation is `lookahead`, whose params are fast and slow
    params together (`LookaheadParams`): a torch optimizer's params are the model's."""
    with warnings.catch_warnings():  # lookahead's init warns of params that are no LookaheadParams
        warnings.simplefilter("ignore")
        try:
            state = transform.init({"0": torch.empty(1, device="meta")})
        except Exception:  # one that cannot init on a meta tensor: its first step will say what fails
            return
    if isinstance(state, LookaheadState):
        raise TypeError(
            "fo.Optimizer cannot run fo.lookahead: its update takes and returns LookaheadParams "
            "(fast and slow params together), and a torch optimizer's params are the model's "
            "alone. Run lookahead with the functional API (fo.LookaheadParams.init_synced(params), "
            "then tx.update and fo.apply_updates), or keep slow weights beside the optimizer."
        )


def _build(factory: TransformFactory, hyperparams: Hyperparams) -> GradientTransformation:
    transform = factory(**hyperparams)
    check_transformation(transform, "fo.Optimizer, from the transform function")
    return transform


def _factory_parameters(transform: Any) -> list[inspect.Parameter]:
    """The arguments a factory takes by name (none for a transformation already built, or
    an `Algorithm`, whose classes pass every one; nor for a callable with no signature)."""
    if isinstance(transform, (GradientTransformation, Algorithm)) or not callable(transform):
        return []
    try:
        parameters = inspect.signature(transform).parameters.values()
    except (TypeError, ValueError):  # a callable with no signature to read
        return []
    named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return [p for p in parameters if p.kind in named and p.name not in ("params", "param_names")]


def _factory_defaults(transform: Any) -> dict[str, Any]:
    """The arguments of a factory that have a default, at their defaults: a param group
    holds every one, as torch.optim's groups hold all of a class's arguments, so that a
    scheduler finds ``betas`` or ``momentum`` (OneCycleLR and CyclicLR cycle them) where
    the constructor was given only ``lr``."""
    return {
        p.name: p.default
        for p in _factory_parameters(transform)
        if p.default is not inspect.Parameter.empty and p.name not in IMPLEMENTATION_FLAGS
    }


class MissingHyperparameterError(KeyError):
    """A key that an lr scheduler (or other code) reads from a param group of an
    `Optimizer` whose transformation reads no such hyperparameter. A KeyError, as torch
    raises for a missing key, that says how to make it one."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class _ParamGroup(dict[str, Any]):
    """The param group of an `Optimizer` that has no ``lr`` (a transformation passed
    already built, or a factory that takes none): a missing key, which an lr scheduler
    reads, raises a `MissingHyperparameterError` that says what to do, not a bare
    KeyError deep in torch."""

    def __missing__(self, key: Any) -> Any:
        raise MissingHyperparameterError(
            f"fo.Optimizer: the param groups have no {key!r}, which an lr scheduler reads and "
            "sets: the transformation reads no hyperparameters from the groups (one passed "
            "already built keeps those it was built with). To make the lr schedulable, pass a "
            "factory and its hyperparameters, which each step builds the transformation from "
            "(the group's current values): fo.Optimizer(params, fo.adamw, lr=1e-3), or for a "
            "chain fo.Optimizer(params, lambda lr: fo.chain(fo.clip_by_global_norm(1.0), "
            "fo.adamw(lr=lr)), lr=1e-3). fo.inject_hyperparams(fo.adamw) serves as such a "
            "factory too, and records the lr in the state. Or give the lr a schedule inside "
            "the transformation: fo.adamw(lr=fo.cosine_decay_schedule(1e-3, 1000))."
        )


def _factory_args(transform: Any) -> tuple[str, ...]:
    """The names of a factory's arguments: a param group may set any of them, also one
    the constructor did not name, as torch.optim's groups may."""
    return tuple(p.name for p in _factory_parameters(transform))
