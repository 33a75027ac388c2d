"""`Optimizer`: any transformation as a `torch.optim.Optimizer`.

The state lives where torch keeps it, ``self.state[param]`` (a dict per param), so
``state_dict``, ``load_state_dict``, hooks, ``add_param_group``, ``zero_grad`` and the
lr schedulers are torch's own code. Hyperparameters are read from ``param_groups``
at every step, so schedulers (which rewrite ``lr``, or ``betas`` for OneCycleLR) work.

Two ways to step a param group:

- fast path, for the funcopt algorithms (`Algorithm`): in place, as torch's step.
  Per param the counters are read as Python floats, the algorithm's ``schedule``
  runs in double precision (tensor hyperparameters stay tensors in it, as in torch's
  step), and its ``elementwise`` math runs with `InPlace` ops (on the CPU) or
  `ForEach` ops (on GPUs), given Python numbers.
- pure path, for ``capturable``, ``differentiable`` or compiled steps of the funcopt
  algorithms: the algorithm's pure update runs on the group's lists of params, grads
  and state tensors (``Algorithm.update_leaves``, no pytree), then the new state is
  copied into the per-param dicts and the updates are added to the params.
- functional path, for anything else (chains, user transformations): the same, with
  the group's state assembled into the transformation's pytree for its ``update``.

A compiled step compiles once: the state is created in ``_init_group``, which
torch.compile runs eagerly while it traces (as it does for torch.optim's classes).
"""

from __future__ import annotations

import inspect
import os
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import optree
import torch
from torch import Tensor
from torch.optim.optimizer import ParamsT, _device_dtype_check_for_fused

from . import chain_inplace, fused, inplace
from .algorithm import Algorithm, Hyperparams, checking_tensors, normalize, rows, torch_counter
from .base import (
    DTYPE,
    IS_SPARSE,
    GradientTransformation,
    MaskedNode,
    StructureError,
    a_kind,
    as_complex,
    as_real,
    check_transformation,
    dtype_name,
)
from .wrappers import InjectHyperparamsState, LookaheadState

try:
    from torch.distributed.tensor import DTensor
except ImportError:  # a torch build without torch.distributed

    class DTensor:  # type: ignore[no-redef]
        """Stands in for torch.distributed.tensor.DTensor: nothing is an instance."""


IMPLEMENTATION_FLAGS = ("foreach", "fused", "capturable", "differentiable")
"""torch.optim's switches that choose an implementation, not the math."""

TransformFactory = Callable[..., GradientTransformation]


_KEYED_BY_POSITION = (
    "(fo.Optimizer gives the transformation a param group's params as a dict keyed by "
    "position, {'0': p0, '1': p1, ...}, and makes a new param's state from {'0': p}: "
    "give masked and partition a function of the tensors, for example by p.ndim.)"
)
"""The end of a structure error raised while a param's state is made."""


def _hyperparams(source: dict[str, Any], names: Iterable[str]) -> Hyperparams:
    """The values in `source` of the hyperparameters among `names` (not torch's switches)."""
    return {name: source[name] for name in names if name not in IMPLEMENTATION_FLAGS}


def _to_python(value: Any) -> Any:
    """Tensor hyperparameters as Python numbers, for the in-place fast path."""
    if isinstance(value, Tensor):
        return value.item()
    if isinstance(value, (tuple, list)):
        return type(value)(_to_python(v) for v in value)
    return value


def _check_transform(transform: Any, defaults: dict[str, Any]) -> None:
    """Raise torch's error for a bad hyperparameter, or a TypeError for a `transform`
    that is neither a transformation nor a factory of one."""
    hyperparams = _hyperparams(defaults, defaults)
    if isinstance(transform, Algorithm):
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


def _factory_defaults(transform: Any) -> dict[str, Any]:
    """The arguments of a factory that have a default, at their defaults (none for a
    transformation already built or an `Algorithm`): a param group holds every one, as
    torch.optim's groups hold all of a class's arguments, so that a scheduler finds
    ``betas`` or ``momentum`` (OneCycleLR and CyclicLR cycle them) where the constructor
    was given only ``lr``."""
    if isinstance(transform, (GradientTransformation, Algorithm)) or not callable(transform):
        return {}
    try:
        parameters = inspect.signature(transform).parameters
    except (TypeError, ValueError):  # a callable with no signature to read
        return {}
    return {
        name: parameters[name].default
        for name in _factory_args(transform)
        if parameters[name].default is not inspect.Parameter.empty and name not in IMPLEMENTATION_FLAGS
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
    """The arguments a factory takes by name (none for a transformation already built, or
    an `Algorithm`, whose classes pass every one): a param group may set any of them,
    also one the constructor did not name, as torch.optim's groups may."""
    if isinstance(transform, (GradientTransformation, Algorithm)) or not callable(transform):
        return ()
    try:
        parameters = inspect.signature(transform).parameters.values()
    except (TypeError, ValueError):  # a callable with no signature to read
        return ()
    named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return tuple(p.name for p in parameters if p.kind in named and p.name not in ("params", "param_names"))


class Optimizer(torch.optim.Optimizer):
    """Run a funcopt transformation as a ``torch.optim.Optimizer``.

    Args:
        params: as for any torch optimizer: tensors, ``named_parameters()``, or
            param-group dicts.
        transform: a `GradientTransformation`, or a factory that builds one from
            hyperparameters (``fo.nadam``, or ``lambda lr: fo.chain(..., fo.nadam(lr))``).
        **defaults: the factory's hyperparameters. They become param-group entries, so
            groups may override them and lr schedulers can drive ``lr``; so does every
            other argument of the factory that has a default, at that default (as
            torch's classes list all theirs: OneCycleLR and CyclicLR find ``betas`` or
            ``momentum`` to cycle). A factory is called again at each step with each
            group's current values (and once at construction, so that a bad value fails
            there, as in torch). A transformation already built reads none: it takes only
            torch's switches (``differentiable``), and a scheduler on it raises an error
            that says how to make the lr schedulable.

    Example:
        >>> import torch, funcopt as fo
        >>> model = torch.nn.Linear(2, 1)
        >>> def clipped_nadam(lr):
        ...     return fo.chain(fo.clip_by_global_norm(1.0), fo.nadam(lr=lr))
        >>> opt = fo.Optimizer(model.parameters(), clipped_nadam, lr=1e-3)
        >>> scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=10)
        >>> model(torch.ones(1, 2)).sum().backward()
        >>> opt.step()
        >>> sorted(opt.state[model.weight])
        ['1.exp_avg', '1.exp_avg_sq', '1.mu_product', '1.step']

    A param's state is created by the transformation of its group's values (a group that
    sets ``amsgrad=True`` gets the state that needs), as torch.optim does. Each
    param group steps on its own, as in torch.optim: a transformation that looks across
    params, such as `clip_by_global_norm`, sees one group's params at a time. To clip by
    the norm of all params, keep them in one group and give parts their own
    hyperparameters with `partition`, or clip the gradients before ``step()``.

    The transformation sees a group's params that have a gradient as a dict
    ``{"0": p0, "1": p1, ...}`` in group order, and a new param's state is made from
    ``{"0": p}`` alone. So give `masked` and `partition` a function of the tensors (for
    example by ``p.ndim``) as mask or labels, not a fixed tree or one that goes by position.

    State kept for all params at once (a global count) is the group's, stored with each
    param: it advances at every step of the group, as in the functional API, while
    per-param state skips a param without a gradient, as in torch.
    """

    _transform: GradientTransformation | TransformFactory
    _factory_args: tuple[str, ...]

    def __init__(
        self,
        params: ParamsT,
        transform: GradientTransformation | TransformFactory,
        **defaults: Any,
    ) -> None:
        _check_transform(transform, defaults)
        defaults = {**_factory_defaults(transform), **defaults}
        super().__init__(params, defaults)
        # Set after torch's __init__: where torch.compile traces the construction, it breaks
        # the graph there and loses the attributes set before it.
        self._transform = transform
        self._factory_args = _factory_args(transform)
        if defaults.get("fused"):
            if defaults.get("differentiable"):
                raise RuntimeError("`fused` does not support `differentiable`")
            if defaults.get("foreach"):
                raise RuntimeError("`fused` and `foreach` cannot be `True` together.")
            # as torch's fused classes: a GradScaler hands the step its scale and inf flag
            # (see `_unscale_for_amp`) instead of unscaling the gradients itself
            self._step_supports_amp_scaling = True
        if isinstance(transform, Algorithm) and transform.eager_state:
            for group in self.param_groups:
                for p in group["params"]:
                    self.state[p] = self._new_state(p, group)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """torch's ``add_param_group``; without an ``lr`` among the hyperparameters, the
        group is a `_ParamGroup`, whose missing keys say how to make the lr schedulable."""
        if "lr" not in self.defaults and type(param_group) is dict:
            param_group = _ParamGroup(param_group)
        super().add_param_group(param_group)

    # -- pickling and old checkpoints -----------------------------------------

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load what ``state_dict()`` returned, as torch.optim does (for ``fo.NAdam`` and
        the other algorithm classes, ``torch.optim.NAdam``'s too); a wrong argument gets an
        error that says what to pass."""
        if not isinstance(state_dict, Mapping):  # torch fails on .copy(), naming no cause
            raise TypeError(
                f"load_state_dict takes the dict that state_dict() returns, but got {_what(state_dict)}"
            )
        try:
            super().load_state_dict(state_dict)
        except KeyError as e:
            key = e.args[0] if e.args else None
            if key not in ("param_groups", "state") or key in state_dict:
                raise
            raise KeyError(
                f"the dict given to load_state_dict has no {key!r} entry, which an optimizer's "
                f"state_dict() has (its keys: {', '.join(map(repr, state_dict)) or 'none'}): pass the "
                "optimizer's, not a model's state_dict or a whole checkpoint"
            ) from None

    def __getstate__(self) -> dict[str, Any]:
        return {**super().__getstate__(), "_transform": self._transform}

    def __setstate__(self, state: dict[str, Any]) -> None:
        if "_transform" not in state:  # load_state_dict: check before anything changes
            self._check_loaded(state["param_groups"], state["state"])
        super().__setstate__(state)
        if "lr" not in self.defaults:  # (load_state_dict makes new groups: plain dicts)
            self.param_groups = [_ParamGroup(g) if type(g) is dict else g for g in self.param_groups]
        if "_transform" in state:  # unpickled
            self._factory_args = _factory_args(self._transform)
        # Groups saved before a flag existed get the constructor's default for it, as
        # torch's classes do (a generic Optimizer's constructor has no defaults).
        defaults = {
            name: p.default
            for name, p in inspect.signature(type(self).__init__).parameters.items()
            if p.default is not inspect.Parameter.empty
            # a class whose torch twin has no fused step keeps no unset fused (fused.fused_flag)
            and (name != "fused" or name in self.defaults)
        }
        algorithm = self._transform if isinstance(self._transform, Algorithm) else None
        for group in self.param_groups:
            for key, value in defaults.items():
                group.setdefault(key, value)
            if algorithm is None:
                self._restore_loaded(group)
                continue
            for p in group["params"]:  # counters saved as Python numbers become tensors
                p_state = self.state.get(p, {})
                for key in algorithm.counters:
                    if key in p_state and not torch.is_tensor(p_state[key]):
                        p_state[key] = torch_counter(
                            p_state[key],
                            p,
                            on_device=self._on_device(group) or algorithm.counters_on_device,
                            fused=bool(group.get("fused")),
                        )

    def _check_loaded(self, groups: list[dict[str, Any]], states: dict[Tensor, dict[str, Any]]) -> None:
        """Raise if a loaded param state lacks an entry this optimizer creates, or has a
        buffer shaped unlike its param: it was saved by another optimizer, or for other
        params (load_state_dict matches params by their order)."""
        for group in groups:
            for p in group["params"]:
                saved = states.get(p)
                if not saved:
                    continue
                expected = self._new_state(torch.empty(p.shape, dtype=p.dtype, device="meta"), group)
                missing = [name for name in expected if name not in saved]
                if missing:
                    raise ValueError(
                        f"loaded state of a param of shape {tuple(p.shape)} has no entry "
                        f"{', '.join(map(repr, missing))} (it has {', '.join(map(repr, saved))}): "
                        "it was saved by another optimizer. Load a state_dict saved by this one."
                    )
                shapes = {n: v.shape for n, v in expected.items() if isinstance(v, Tensor) and v.dim() > 0}
                algorithm = self._transform
                if isinstance(algorithm, Algorithm) and algorithm.buffers_like_param and p.dim() > 0:
                    for name in algorithm.buffer_fields:  # one absent at first too (SGD's momentum_buffer)
                        if name in saved:
                            shapes.setdefault(name, p.shape)
                for name, expected_shape in shapes.items():
                    shape = getattr(saved[name], "shape", ())
                    if shape != expected_shape:
                        raise ValueError(
                            f"loaded state entry {name!r} has shape {tuple(shape)} but its param "
                            f"has shape {tuple(p.shape)}: it was saved for other params "
                            "(load_state_dict matches params by their order in param_groups)."
                        )

    # -- stepping ---------------------------------------------------------------

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Perform a single optimization step.

        Args:
            closure: a closure that reevaluates the model and returns the loss.
        """
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        with torch.set_grad_enabled(bool(self.defaults.get("differentiable", False))):
            runs = self._unscale_for_amp()
            for group in self.param_groups:
                params: list[Tensor] = []
                grads: list[Tensor] = []
                listed_twice = self._init_group(group, params, grads)  # creates missing state
                if not runs:
                    continue
                if listed_twice:
                    for listing in _listings(params, grads):
                        self._step_group(group, *listing)
                elif params:
                    self._step_group(group, params, grads)
        return loss

    # An LR scheduler replaces ``optimizer.step`` with a wrapper that records the call in
    # ``_opt_called`` (it warns if its own step comes first), unless step is marked as
    # already wrapped. Dynamo never traces into that wrapper (torch.optim.lr_scheduler is
    # on its skip list), so ``torch.compile(optimizer.step, fullgraph=True)`` would fail
    # once a scheduler is attached. step carries the mark; `_init_group` records the call.
    step._wrapped_by_lr_sched = True  # type: ignore[attr-defined]

    def _unscale_for_amp(self) -> bool:
        """A GradScaler sets ``found_inf`` and ``grad_scale`` on an optimizer whose step
        supports AMP scaling (``fused=True``, as torch's fused classes), around its step.
        As torch's fused step does, a step that found an inf or NaN changes no param
        (the scaler then lowers its scale); else the gradients are unscaled in place
        (each once, for every group), then step. Returns whether to step."""
        found_inf = getattr(self, "found_inf", None)
        if found_inf is not None and found_inf.item():
            return False
        grad_scale = getattr(self, "grad_scale", None)
        if grad_scale is not None:
            grads = {id(p.grad): p.grad for g in self.param_groups for p in g["params"] if p.grad is not None}
            for grad in grads.values():
                grad.div_(grad_scale.to(grad.device))
        return True

    def _init_group(self, group: dict[str, Any], params: list[Tensor], grads: list[Tensor]) -> bool:
        """Collect a group's params that have a gradient, and their gradients, and
        create their state where it is missing. Returns whether a param is listed more
        than once (see `_listings`). torch.compile runs a method of this name eagerly
        while it traces a step (as for torch.optim's classes), so the first compiled step
        already sees the state and a second step does not recompile.

        It also records that step was called, for an LR scheduler (see `step`): here, not
        in step, because torch.compile drops a traced step's writes to the optimizer's
        attributes (torch 2.13), and runs this method eagerly."""
        self._opt_called = True
        # torch keeps no entry for a param with no state (SGD without momentum, until the
        # step creates its buffer): nothing to make, at every step
        algorithm = self._transform
        stateless = isinstance(algorithm, Algorithm) and algorithm.stateless(self.defaults)
        for p in group["params"]:
            if p.grad is not None:
                params.append(p)
                grads.append(p.grad)
                if not stateless and not self.state.get(p):
                    new = self._new_state(p, group)
                    if new:
                        self.state[p].update(new)
        return len({id(p) for p in params}) != len(params)

    @staticmethod
    def _on_device(group: dict[str, Any]) -> bool:
        return bool(group.get("capturable") or group.get("fused"))

    def _make_transform(self, hyperparams: Hyperparams) -> GradientTransformation:
        if isinstance(self._transform, GradientTransformation):
            return self._transform
        return _build(self._transform, hyperparams)

    def _group_hyperparams(self, group: dict[str, Any]) -> Hyperparams:
        """A group's values of the hyperparameters: those the constructor set, and any
        other argument of the factory that the group sets. Another key of the group (a
        name, a tag) is kept in the group, as torch keeps it, and read by nothing. (A
        group loaded from an older checkpoint may lack one: the constructor's value.)"""
        hyperparams = {
            name: group.get(name, value) for name, value in _hyperparams(self.defaults, self.defaults).items()
        }
        for name in self._factory_args:
            if name in group and name not in hyperparams and name not in IMPLEMENTATION_FLAGS:
                hyperparams[name] = group[name]
        return hyperparams

    def _new_state(self, p: Tensor, group: dict[str, Any]) -> dict[str, Any]:
        hyperparams = _hyperparams(self.defaults, self.defaults)
        if isinstance(self._transform, Algorithm):
            if self._transform.initial_from_group:  # (a loaded group may lack some: the defaults')
                hyperparams = normalize(
                    {k: group.get(k, v) for k, v in hyperparams.items()}, self._transform.pairs
                )
            return self._transform.torch_state(
                p,
                hyperparams,
                on_device=self._on_device(group),
                fused=bool(group.get("fused")),
            )
        try:  # the transformation that steps the group makes its state
            slots, _ = _slots(self._make_transform(self._group_hyperparams(group)).init({"0": p}))
        except StructureError as e:  # a mask or labels tree by param names, most likely
            raise ValueError(f"{e} {_KEYED_BY_POSITION}").with_traceback(e.__traceback__) from None
        # state shared by all params (a global step count, say) is the group's: a param
        # that joins the group's steps late shares the tensor the others hold (so that
        # a step writes it once, see `_step_functional`)
        sibling: dict[str, Any] = next(
            (self.state[q] for q in group["params"] if q is not p and self.state.get(q)), {}
        )
        return {
            name: _stored(leaf["0"]) if per_param else sibling[name] if name in sibling else leaf
            for name, per_param, leaf in slots
        }

    def _layout(self, p: Tensor, group: dict[str, Any]) -> list[tuple[str, bool, Any]]:
        """The slots of a new state of a param like `p` (a meta tensor) in `group`, for
        a transformation that is no `Algorithm`."""
        transform = self._make_transform(self._group_hyperparams(group))
        return _slots(transform.init({"0": torch.empty(p.shape, dtype=p.dtype, device="meta")}))[0]

    def _restore_loaded(self, group: dict[str, Any]) -> None:
        """Undo what torch's ``load_state_dict`` does to a transformation's state that is
        not torch's: it casts every state tensor of a floating-point param but ``step``
        to the param's dtype, so an integer count (optax's ``count``) would come back a
        float, and a buffer kept in another dtype (``mu_dtype``) the param's. Each takes
        the dtype a new state has again. And each shared slot (the group's, such as a
        count) is one tensor for the group's params again, as stepping keeps it."""
        shared: dict[str, Any] = {}
        for p in group["params"]:
            saved = self.state.get(p)
            if not saved:
                continue
            for name, per_param, leaf in self._layout(p, group):
                value, expected = saved.get(name), leaf["0"] if per_param else leaf
                if (
                    isinstance(value, Tensor)
                    and isinstance(expected, Tensor)
                    and value.dtype != expected.dtype
                ):
                    saved[name] = value = value.to(expected.dtype)
                if not per_param and name in saved:
                    saved[name] = shared.setdefault(name, value)

    def _step_group(self, group: dict[str, Any], params: list[Tensor], grads: list[Tensor]) -> None:
        # a param with no state yet gets a dict of its own, kept if the step fills it (an
        # optimizer that keeps no state, SGD without momentum, looks up no param)
        states: list[Any] = list(map(self.state.get, params)) if self.state else [None] * len(params)
        fresh = [i for i, s in enumerate(states) if s is None] if None in states else []
        for i in fresh:
            states[i] = {}
        if group.get("fused"):
            _check_fused(params, grads)
        if group.get("capturable") and not torch.compiler.is_compiling():
            _check_capturable(params)
        hyperparams = self._group_hyperparams(group)
        algorithm = self._transform if isinstance(self._transform, Algorithm) else None
        if algorithm is None:
            skipped = [self.state[p] for p in group["params"] if p.grad is None and self.state.get(p)]
            transform = self._make_transform(hyperparams)
            # a chain of known building blocks steps in place; anything else, the pure update
            if not chain_inplace.step(
                transform, params, grads, states, skipped, bool(group.get("capturable"))
            ):
                self._step_functional(transform, params, grads, states, skipped)
            return
        hyperparams = normalize(hyperparams, algorithm.pairs)
        if (  # the fast path; else pure and traceable (capturable, differentiable, compiled)
            not group.get("capturable")
            and not self.defaults.get("differentiable")
            and not torch.compiler.is_compiling()
        ):
            try:  # fused=True: compiled kernels on the CPU (see fused.py)
                (fused.step if group.get("fused") else _step_in_place)(
                    algorithm, hyperparams, params, grads, states
                )
            except RuntimeError as error:  # torch's own error names no tensor and no cause
                converted = _converted(algorithm, params, states)
                if converted is None:
                    raise
                raise converted from error
        else:
            _step_pure(algorithm, hyperparams, params, grads, states, bool(group.get("capturable")))
        for i in fresh:
            if states[i]:  # created by the step (SGD's momentum_buffer)
                self.state[params[i]] = states[i]

    def _step_functional(
        self,
        transform: GradientTransformation,
        params: list[Tensor],
        grads: list[Tensor],
        states: list[dict[str, Any]],
        skipped: list[dict[str, Any]],
    ) -> None:
        """One step of a transformation on a group's params that have a gradient. State
        shared by all params (not per param) is the group's: it advances at every step,
        in the state of the params without a gradient (`skipped`) too, as in the
        functional API, where a None gradient leaf does not hold back a global count.
        The hyperparameters that an `inject_hyperparams` state holds are the group's
        (see `_injected_from_group`)."""
        keys = _keys(len(params))
        # The state's layout, from an init on one meta tensor (allocates nothing).
        layout = transform.init({"0": torch.empty_like(params[0], device="meta")})
        slots, treedef = _slots(layout)
        try:
            leaves = [
                dict(zip(keys, [_node(s[name]) for s in states])) if per_param else states[0][name]
                for name, per_param, _ in slots
            ]
        except KeyError as e:
            raise _missing_entry(e) from None
        read_params, leaves = _copies_for_autograd((params, leaves))
        state = treedef.unflatten(leaves)
        if _holds_injected(layout):
            p = params[0]
            state = _injected_from_group(state, transform.init({"0": p.new_empty((0,) * p.dim())}))
        updates, new_state = transform.update(dict(zip(keys, grads)), state, dict(zip(keys, read_params)))
        olds: list[Tensor] = []  # eager: the state tensors to overwrite, and their new values
        news: list[Tensor] = []
        # one _foreach_copy_ in eager steps; `_assign` where autograd records (it has no
        # derivative of _foreach_copy_) or torch.compile traces
        by_one = torch.compiler.is_compiling() or torch.is_grad_enabled()
        for (name, per_param, _), leaf in zip(slots, treedef.flatten_up_to(new_state)):
            if per_param:
                pairs: Iterable[tuple[dict[str, Any], Any]] = zip(states, [_stored(leaf[k]) for k in keys])
            else:  # the group's: written once into each distinct tensor that holds it
                pairs = ((s, leaf) for s in _distinct(states + skipped, name))
            for s, value in pairs:
                old: Any = s.get(name)
                if value is old:
                    continue
                if by_one or not _copyable(old, value):
                    _assign(s, name, value)
                else:
                    olds.append(old)
                    news.append(value)
        written = {id(old) for old in olds}
        if any(id(new) in written for new in news):  # a new value is an old tensor: in order
            for old, new in zip(olds, news):
                old.copy_(new)
        elif olds:
            torch._foreach_copy_(olds, news)
        for p, key in zip(params, keys):
            u = updates[key]
            if u is not None:  # None: a param the step skipped
                p.add_(u)


def _listings(params: list[Tensor], grads: list[Tensor]) -> list[tuple[list[Tensor], list[Tensor]]]:
    """A group that lists a param more than once (torch warns that this is deprecated)
    steps as torch's default step does: that param once per listing, one after another.
    Its k-th listing steps in the k-th of these lists of (params, grads), which step in
    turn. An algorithm steps each param by itself, so the order of the others does not
    matter (a transformation that reads all params, such as a global-norm clip, sees
    each list apart)."""
    listings: list[tuple[list[Tensor], list[Tensor]]] = []
    seen: dict[int, int] = {}
    for p, g in zip(params, grads):
        k = seen[id(p)] = seen.get(id(p), -1) + 1
        if k == len(listings):
            listings.append(([], []))
        listings[k][0].append(p)
        listings[k][1].append(g)
    return listings


def _step_in_place(
    algorithm: Algorithm,
    hyperparams: Hyperparams,
    params: list[Tensor],
    grads: list[Tensor],
    states: list[dict[str, Any]],
    tried: bool = False,
    dense: Callable[..., None] = inplace.step_dense,
) -> None:
    """torch.optim's step, in place. The counters are read as Python floats and the
    schedule runs in double precision, once per group of params with the same counter
    values; the elementwise math runs on segments on the CPU, and with foreach ops over
    each group of params elsewhere (see ``inplace.py``). The schedule gets the
    hyperparameters as given: torch's default step computes its coefficients from a
    tensor ``lr`` (or betas) in tensor arithmetic, which rounds in the tensor's dtype,
    and so does the schedule; the coefficients, then the hyperparameters, reach the ops
    as Python numbers.

    The state is read column by column (one list per key), and the params are grouped
    by what their math shares before any runs: each per-param read costs about as much
    as a small op, which counts with hundreds of tiny params. The dense params of a
    group step by `dense` (``inplace.step_dense``, or fused.py's compiled kernels)."""
    k = len(algorithm.counters)
    given, hyperparams = hyperparams, {name: _to_python(v) for name, v in hyperparams.items()}
    try:
        columns: list[list[Any]] = [
            [s[name] for s in states] if required else [s.get(name) for s in states]
            for name, required in _fields(algorithm, hyperparams)
        ]
    except KeyError as e:
        raise _missing_entry(e) from None
    counters, buffer_columns = columns[:k], columns[k:]
    # every check comes before any param changes
    sparse = any(map(IS_SPARSE, grads))
    if sparse:
        algorithm.check_sparse_grad(hyperparams)
    # which buffers are absent, per buffer: all of them (SGD's without momentum), none, or some
    absent = [[b is None for b in column] for column in buffer_columns]
    present = [column for column, nones in zip(buffer_columns, absent) if not all(nones)]
    _check_all_shapes(algorithm, params, grads, buffer_columns, present)
    dtypes = list(map(DTYPE, params))
    if not tried and not all(
        [d if b is None else b.dtype for b, d in zip(column, dtypes)] == dtypes for column in present
    ):
        # the model was converted after its state was made: where the math then fails
        # (torch's Adamax does; its Adagrad steps on), it fails on copies first, changing nothing
        copies = [{name: _clone(value) for name, value in s.items()} for s in states]
        _step_in_place(algorithm, given, [p.clone() for p in params], grads, copies, tried=True, dense=dense)
    # what a group shares: the counters' values and dtypes (torch updates a counter in its
    # dtype), the param's dtype, and which buffers are absent
    shared = [_counter_values(column) for column in counters]
    shared += [[c.dtype for c in column] for column in counters]
    n = len(params)
    groups: dict[Any, list[int]] = {}
    if all(column.count(column[0]) == n for column in (*shared, dtypes, *absent)):  # one group, as usual
        key = (tuple(column[0] for column in shared), dtypes[0], tuple(nones[0] for nones in absent))
        groups[key] = list(range(n))
    else:
        for i, key in enumerate(zip(rows(shared, n), dtypes, rows(absent, n))):
            groups.setdefault(key, []).append(i)
    creating = algorithm.creating(hyperparams)
    sharded = any(issubclass(t, DTensor) for t in set(map(type, params)))
    written: list[tuple[list[list[Tensor]], tuple[Any, ...]]] = []  # counters, their new values
    for key, indices in groups.items():
        new_values, coefficients = _to_python(
            algorithm.schedule(*key[0][:k], counter_dtypes=key[0][k:], **given)
        )
        written.append(([[column[i] for i in indices] for column in counters], new_values))
        # a param whose math looks across elements, or that has a buffer to create, steps
        # by itself; so does a DTensor whose buffers are not all sharded as it is
        alone = not algorithm.per_element or creating([column[indices[0]] for column in buffer_columns])
        if not (alone or sparse or sharded or key[1].is_complex):  # as usual
            ps, gs, *columns_picked = inplace.pick((params, grads, *buffer_columns), indices)
            dense(algorithm, coefficients, hyperparams, ps, gs, columns_picked)
            continue
        # (a group with DTensors, complex or sparse gradients: no fused kernels)
        plain: tuple[list[Any], list[Any], list[Any]] = ([], [], [])  # params, grads, buffers
        for i in indices:
            p, g, buffers = params[i], grads[i], [column[i] for column in buffer_columns]
            if isinstance(p, DTensor) and not alone:  # its local shards, if sharded alike
                p, g, buffers = _local_shards(p, g, buffers) or (p, g, buffers)
            is_complex = p.is_complex()
            if is_complex:
                p, g, buffers = as_real(p), as_real(g), [as_real(b) for b in buffers]
            if alone or g.is_sparse or isinstance(p, DTensor):  # by itself (sparse or DTensor ops)
                new = inplace.run(algorithm, coefficients, hyperparams, p, p, g, buffers)
                for name, old, value in zip(algorithm.buffer_fields, buffers, new):
                    if old is None and value is not None:  # created (SGD's momentum_buffer)
                        states[i][name] = as_complex(value) if is_complex else value
                continue
            for column, value in zip(plain, (p, g, buffers)):
                column.append(value)
        if plain[0]:
            by_buffer = [list(column) for column in zip(*plain[2])]
            inplace.step_dense(algorithm, coefficients, hyperparams, plain[0], plain[1], by_buffer)
    for tensors, new_values in written:
        for column, value in zip(tensors, new_values):
            # made where the counters live (a group's are alike in dtype): no copy from the host
            source = torch.full((), value, dtype=column[0].dtype, device=column[0].device)
            torch._foreach_copy_(column, [source] * len(column))


def _counter_values(column: list[Tensor]) -> list[Any]:
    """The counters' values as Python numbers. Counters on a GPU (``fused``, ASGD's) are
    read in one transfer: each ``.item()`` waits for the device (160 params: 3 ms)."""
    first = column[0]
    if first.is_cpu or any([c.device != first.device or c.dtype != first.dtype for c in column]):
        return [c.item() for c in column]
    return torch.stack(column).tolist()


def _check_all_shapes(
    algorithm: Algorithm,
    params: list[Tensor],
    grads: list[Tensor],
    buffer_columns: list[list[Any]],
    present: list[list[Any]],
) -> None:
    """`_check_shapes` for every param: compared as lists first (per-param calls cost
    more, with hundreds of tiny params), then param by param for the error. `present`
    holds the columns of the buffers that some param has (SGD without momentum: none)."""
    shapes = [p.shape for p in params]
    same = [g.shape for g in grads] == shapes
    if same and algorithm.buffers_like_param:
        same = all(
            [s if b is None else b.shape for b, s in zip(column, shapes)] == shapes for column in present
        )
    if not same:
        for i, (p, g) in enumerate(zip(params, grads)):
            _check_shapes(algorithm, p, g, [column[i] for column in buffer_columns])


def _step_pure(
    algorithm: Algorithm,
    hyperparams: Hyperparams,
    params: list[Tensor],
    grads: list[Tensor],
    states: list[dict[str, Any]],
    capturable: bool,
) -> None:
    """The algorithm's pure update on the group's lists (traceable: for capturable,
    differentiable and compiled steps), its results then written into the state and
    the params. A capturable step reads no value on the host, so a CUDA graph can
    record it."""
    try:
        columns = [
            [state[name] if required else state.get(name, MaskedNode()) for state in states]
            for name, required in _fields(algorithm, hyperparams)
        ]
    except KeyError as e:
        raise _missing_entry(e) from None
    for p, g, state in zip(params, grads, states):
        _check_shapes(algorithm, p, g, [state.get(name) for name in algorithm.buffer_fields])
    converted = _converted(algorithm, params, states)  # the pure math takes one dtype
    if converted is not None:
        raise converted
    read_params, read_columns = _copies_for_autograd((params, columns))
    updates, new_columns = algorithm.update_leaves(
        hyperparams, read_params, grads, read_columns, capturable, written_back=True
    )
    # the new values are written into the state's own tensors (shaped as they are), in place
    _write_back(params, states, zip(algorithm.fields, new_columns), updates)


def _fields(algorithm: Algorithm, hyperparams: Hyperparams) -> list[tuple[str, bool]]:
    """The algorithm's state keys, each with whether a param's state must have it: the
    counters and buffers must, but for those absent at first (see `Algorithm.optional`)."""
    optional = algorithm.optional(hyperparams)
    return [(name, name not in optional) for name in algorithm.fields]


def _clone(value: Any) -> Any:
    return value.clone() if isinstance(value, Tensor) else value


def _copies_for_autograd(tree: Any) -> Any:
    """What a pure step reads: the params and the state's tensors themselves, or copies
    where autograd records (a differentiable step). Autograd may save what the update
    reads (a weight_decay or betas that requires grad multiplies the params or the
    state), and the step then writes new values into the params and the state: a saved
    tensor written in place would fail the backward pass. torch's differentiable steps
    clone the param for a tensor weight_decay likewise."""
    if not torch.is_grad_enabled():
        return tree
    return optree.tree_map(_clone, tree, none_is_leaf=True)


def _write_back(
    params: list[Tensor],
    states: list[dict[str, Any]],
    columns: Iterable[tuple[str, Sequence[Any]]],
    updates: Sequence[Tensor | None],
) -> None:
    """A pure step's results, written where torch keeps them: each (name, values) column
    gives that entry of every param's state dict; the updates are added to the params."""
    for name, values in columns:
        for state, value in zip(states, values):
            if not isinstance(value, MaskedNode):  # absent: torch has no such key
                _assign(state, name, value)
    for p, u in zip(params, updates):
        if u is not None:  # None: a param the step skipped
            p.add_(u)


def _local_shards(
    p: Tensor, g: Tensor, buffers: list[Tensor | None]
) -> tuple[Tensor, Tensor, list[Tensor | None]] | None:
    """The local shards of a sharded (DTensor) param, its gradient and its buffers (an
    absent one stays None), when all are sharded alike (as FSDP2 shards them): for
    per-element math, each rank steps its own shard, with no communication."""
    spec = (p.device_mesh, p.placements)  # type: ignore[attr-defined]
    tensors = [g, *(b for b in buffers if b is not None)]
    if not all(isinstance(t, DTensor) and (t.device_mesh, t.placements) == spec for t in tensors):
        return None
    p_local, g_local = p.to_local(), g.to_local()  # type: ignore[attr-defined]
    return p_local, g_local, [None if b is None else b.to_local() for b in buffers]  # type: ignore[attr-defined]


def _check_fused(params: list[Tensor], grads: list[Tensor]) -> None:
    # torch's own check and message (its list of devices), once per device and dtype (it
    # costs microseconds: with hundreds of params, as much as a GPU's step)
    for p in {(p.device.type, p.dtype): p for p in params}.values():
        _device_dtype_check_for_fused(p)
    if any(map(IS_SPARSE, grads)):
        raise RuntimeError("`fused` does not support sparse grad or complex param")


def _check_capturable(params: list[Tensor]) -> None:
    devices = ["cuda", "xpu", "hpu", torch._C._get_privateuse1_backend_name(), "xla"]
    if any(p.device.type not in devices for p in params):
        raise AssertionError(
            f"If capturable=True, params and state_steps must be on supported devices: {devices}."
        )


# -- a transformation state <-> per-param dicts --------------------------------
# The adapter calls a transformation with params as a dict {"0": p0, "1": p1, ...}.
# A subtree of the state that is a dict with exactly those keys mirrors the params
# (one value per param); any other leaf is shared by all params (stored in each).


def _is_per_param(x: Any) -> bool:
    return isinstance(x, dict) and len(x) > 0 and all(isinstance(k, str) and k.isdigit() for k in x)


def _slots(state: Any) -> tuple[list[tuple[str, bool, Any]], optree.PyTreeSpec]:
    """(name, per_param, leaf) for each slot of a state, and the state's structure with
    the slots as leaves. Names join the path's field names, indices and keys with '.',
    so a lone algorithm's slots are torch's state keys.

    Paths, not optree's accessors: torch 2.10's compiler cannot trace the accessors
    (a graph break in a compiled step)."""
    paths, leaves, treedef = optree.tree_flatten_with_path(state, is_leaf=_is_per_param, none_is_leaf=True)
    out = []
    for path, leaf in zip(paths, leaves):
        parts, node = [], state
        for entry in path:
            # a NamedTuple's (or a torch.return_types') path holds indices: name the fields
            fields = getattr(type(node), "__match_args__", None) if isinstance(node, tuple) else None
            parts.append(str(fields[entry] if fields else entry))
            node = node[entry] if isinstance(node, (tuple, list, dict)) else None
        out.append((".".join(parts), _is_per_param(leaf), leaf))
    return out, treedef


def _keys(n: int) -> list[str]:
    """The keys of a group's first `n` params, as the transformation sees them. (Not
    cached: dynamo warns where a compiled step calls an ``lru_cache``-wrapped function.)"""
    return [str(i) for i in range(n)]


def _distinct(states: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    """The states whose tensor at `name` no earlier state holds: a shared slot's tensor
    is written once (the params of a group share it, see `Optimizer._new_state`)."""
    seen: set[int] = set()
    out = []
    for s in states:
        value = s.get(name)
        if isinstance(value, Tensor):
            if id(value) in seen:
                continue
            seen.add(id(value))
        out.append(s)
    return out


def _copyable(old: Any, new: Any) -> bool:
    """Whether a step's new value may be copied into the state's tensor with one
    ``_foreach_copy_`` over all of them (as `_assign` would copy it): plain dense tensors
    (not a DTensor) of one shape. (Type checks first: cheap, per param and slot.)"""
    return type(old) is Tensor and type(new) is Tensor and old.shape == new.shape and not new.is_sparse


def _holds_injected(state: Any) -> bool:
    """Whether a state holds an `inject_hyperparams` state (a walk that torch.compile
    traces, which optree's with `is_leaf` is not)."""
    if isinstance(state, InjectHyperparamsState):
        return True
    if isinstance(state, (tuple, list)):
        return any(_holds_injected(x) for x in state)
    if isinstance(state, dict):
        return any(_holds_injected(x) for x in state.values())
    return False


def _injected_from_group(state: Any, fresh: Any) -> Any:
    """`state` with the hyperparams of each `inject_hyperparams` state in it replaced by
    those of `fresh`, the state that the group's transformation initializes (on an empty
    tensor): the adapter builds the transformation from the group's values at every
    step, so a scheduler or a param group that sets ``lr`` sets the injected ``lr``, and
    the state records it. Values keep the stored tensors' dtypes and devices; a
    schedule's value is evaluated at the state's count by the update itself."""
    if isinstance(state, InjectHyperparamsState) and isinstance(fresh, InjectHyperparamsState):
        hyperparams = {
            key: optree.tree_map(_cast_like, fresh.hyperparams[key], value)
            if key in fresh.hyperparams
            else value
            for key, value in state.hyperparams.items()
        }
        inner = _injected_from_group(state.inner_state, fresh.inner_state)
        return state._replace(hyperparams=hyperparams, inner_state=inner)
    if isinstance(state, (tuple, list)) and type(state) is type(fresh) and len(state) == len(fresh):
        items = [_injected_from_group(s, f) for s, f in zip(state, fresh)]
        return state._make(items) if hasattr(state, "_make") else type(state)(items)
    if isinstance(state, dict) and isinstance(fresh, dict) and state.keys() == fresh.keys():
        return {k: _injected_from_group(v, fresh[k]) for k, v in state.items()}
    return state


def _cast_like(new: Any, old: Any) -> Any:
    if isinstance(new, Tensor) and isinstance(old, Tensor):
        return new.to(dtype=old.dtype, device=old.device)
    return new


def _stored(value: Any) -> Any:
    """A per-param value as a param's state dict holds it: None where the state holds
    `MaskedNode()` (a param outside a `masked` transformation's mask), which torch's
    ``load_state_dict`` cannot rebuild (it calls ``type(value)(...)`` on a tuple) and
    checkpoints saved before `MaskedNode` hold."""
    return None if isinstance(value, MaskedNode) else value


def _node(value: Any) -> Any:
    """A param's stored value as the transformation's state holds it (see `_stored`)."""
    return MaskedNode() if value is None else value


def _what(value: Any) -> str:
    """What load_state_dict got instead of a dict, and what to do."""
    if isinstance(value, (str, os.PathLike)):
        return f"the path {os.fspath(value)!r}: pass the dict saved there, torch.load(path)"
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a functional state
        return (
            f"{a_kind(value)}: write a functional state into the optimizer with "
            "fo.load_functional_state(optimizer, state, params) (see 'The functional state' in "
            "docs/checkpoints.md)"
        )
    return a_kind(value)


def _missing_entry(error: KeyError) -> KeyError:
    """The error for a param's state that lacks an entry the step reads (loads are
    checked, so the state was edited)."""
    return KeyError(
        f"optimizer state has no entry {error}, which this optimizer's step reads: the "
        "state was edited or made for another optimizer. Restore the entry, or clear "
        "`optimizer.state[param]` to start that param afresh."
    )


def _check_shapes(algorithm: Algorithm, p: Tensor, g: Tensor, buffers: Sequence[Tensor | None]) -> None:
    """Raise if a param's gradient or state buffers are shaped unlike the param: the
    param was replaced or resized after they were made (``p.data = ...``). torch's step
    fails there on broadcasting, after changing some state; a step on segments would
    run where only the shape differs, not the size (a (3, 4) state for a (4, 3) param)."""
    shape = p.shape
    if not algorithm.buffers_like_param:
        buffers = []
    if g.shape == shape:  # a loop: any() over a generator costs more, per param
        for b in buffers:
            if b is not None and b.shape != shape:
                break
        else:
            return
    named = [("a gradient", g), *zip(algorithm.buffer_fields, buffers)]
    wrong = ", ".join(
        f"{name} of shape {tuple(t.shape)}" for name, t in named if t is not None and t.shape != shape
    )
    what = []
    if g.shape != shape:
        what.append("compute its gradient anew")
    if any(b is not None and b.shape != shape for b in buffers):
        what.append("clear its state (`del optimizer.state[param]`) to start it afresh")
    raise ValueError(
        f"{algorithm.name} step: a param of shape {tuple(shape)} has {wrong}: the param was "
        f"replaced or resized after they were made (`param.data = ...`). {' and '.join(what).capitalize()}."
    )


def _converted(
    algorithm: Algorithm, params: list[Tensor], states: list[dict[str, Any]]
) -> RuntimeError | None:
    """The error for a step where a param's dtype differs from its state's: the model was
    converted after the state was made (``model.double()``). None if no such param. The
    in-place step raises it where its math fails, as torch's Adamax and NAdam do (torch's
    Adadelta and Adagrad step on), the pure step always."""
    for p, state in zip(params, states):
        buffers = {name: state.get(name) for name in algorithm.fields[len(algorithm.counters) :]}
        wrong = [name for name, b in buffers.items() if isinstance(b, Tensor) and b.dtype != p.dtype]
        if wrong:
            return RuntimeError(
                f"{algorithm.name} step: a param of dtype {dtype_name(p)} has {', '.join(wrong)} of dtype "
                f"{dtype_name(state[wrong[0]])}: the model was converted after the optimizer's state was made "
                "(model.double(), model.half(), ...). Cast the state to the params' dtypes with "
                "optimizer.load_state_dict(optimizer.state_dict()), or convert the model before making "
                "the optimizer."
            )
    return None


def _assign(state: dict[str, Any], name: str, value: Any) -> None:
    """Write a new value into a param's state, in place when shapes allow (as torch
    mutates its state tensors), so references to the state stay valid."""
    old = state.get(name)
    if value is old:
        return
    if (
        isinstance(old, Tensor)
        and isinstance(value, Tensor)
        and old.shape == value.shape
        and not value.is_sparse
    ):
        _copy_into(old, value)
    elif isinstance(value, Tensor) and value.requires_grad and torch.is_grad_enabled():
        # a new entry (SGD's momentum_buffer) of a differentiable step: a copy, which the
        # next step may write in place, where autograd may have saved the value itself
        state[name] = value.clone()
    else:
        state[name] = value


def _copy_into(old: Tensor, new: Tensor) -> None:
    """``old.copy_(new)``, also where torch.compile would drop it."""
    if old.dim() == 0:
        # torch 2.13's compiler can drop an in-place write to a 0-d float64 CPU input
        # (counters, the buffers of 0-d params), but not one through a view. The same
        # tensor must be written: a compiled step guards on its identity.
        old, new = old.view(1), new.view(1)
    old.copy_(new)
