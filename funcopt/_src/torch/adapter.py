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
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
from torch import Tensor
from torch.optim.optimizer import ParamsT

from ..core.base import (
    GradientTransformation,
    StructureError,
)
from ..engine.algorithm import REGISTRY, Algorithm
from ..engine.bounds import Hyperparams, normalize
from ..engine.leaves import torch_counter
from . import chain_inplace, fused_lists
from .factory import (
    IMPLEMENTATION_FLAGS,
    TransformFactory,
    _build,
    _check_transform,
    _factory_args,
    _factory_defaults,
    _hyperparams,
    _ParamGroup,
)
from .knobs import counters_on_device, knobs
from .state import (
    _assign,
    _converted,
    _copyable,
    _distinct,
    _holds_injected,
    _injected_from_group,
    _keys,
    _missing_entry,
    _node,
    _slots,
    _stored,
    _what,
    torch_state,
)
from .step import _check_capturable, _check_fused, _copies_for_autograd, _listings, _step_in_place, _step_pure

_KEYED_BY_POSITION = (
    "(fo.Optimizer gives the transformation a param group's params as a dict keyed by "
    "position, {'0': p0, '1': p1, ...}, and makes a new param's state from {'0': p}: "
    "give masked and partition a function of the tensors, for example by p.ndim.)"
)
"""The end of a structure error raised while a param's state is made."""


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
        if isinstance(transform, Algorithm) and knobs(transform).eager_state:
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
        transform: Any = self._transform
        if isinstance(transform, Algorithm) and REGISTRY.get(transform.name) is transform:
            transform = transform.name  # a built-in algorithm pickles by its name, not its module
        state = super().__getstate__()
        groups = [dict(g) for g in state["param_groups"]]  # (__setstate__ makes _ParamGroups again)
        return {**state, "param_groups": groups, "_transform": transform}

    def __setstate__(self, state: dict[str, Any]) -> None:
        if "_transform" not in state:  # load_state_dict: check before anything changes
            self._check_loaded(state["param_groups"], state["state"])
        elif isinstance(state["_transform"], str):
            state = {**state, "_transform": REGISTRY[state["_transform"]]}
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
                            on_device=counters_on_device(algorithm, group),
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
        # the loss, for a transformation that reads it (``value=``: polyak_sgd, momo, ...)
        self._closure_value = loss.detach() if isinstance(loss, Tensor) else loss
        with torch.set_grad_enabled(bool(self.defaults.get("differentiable", False))):
            runs = self._unscale_for_amp()
            # eager steps take each param's state dict from `_init_group`, which looks it up
            # anyway: one lookup per param, as torch's step (a traced step takes no dicts)
            eager = not torch.compiler.is_compiling()
            for group in self.param_groups:
                params: list[Tensor] = []
                grads: list[Tensor] = []
                states: list[Any] | None = [] if eager else None
                listed_twice = self._init_group(group, params, grads, states)  # creates missing state
                if not runs:
                    continue
                if listed_twice:
                    for listing in _listings(params, grads):
                        self._step_group(group, *listing)
                elif params:
                    self._step_group(group, params, grads, states)
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

    def _init_group(
        self,
        group: dict[str, Any],
        params: list[Tensor],
        grads: list[Tensor],
        states: list[Any] | None = None,
    ) -> bool:
        """Collect a group's params that have a gradient, and their gradients, and
        create their state where it is missing; `states`, where given, receives each
        collected param's state dict (None where it has none: a stateless step). Returns
        whether a param is listed more than once (see `_listings`). torch.compile runs a
        method of this name eagerly while it traces a step (as for torch.optim's
        classes), so the first compiled step already sees the state and a second step
        does not recompile.

        It also records that step was called, for an LR scheduler (see `step`): here, not
        in step, because torch.compile drops a traced step's writes to the optimizer's
        attributes (torch 2.13), and runs this method eagerly.

        Each pass over the params is list-wise (hundreds of tiny params): the gradients,
        their checks (`_check_grads`), one state lookup per param, and state made only
        for the params without."""
        for p in group["params"]:
            g = p.grad
            if g is not None:
                params.append(p)
                grads.append(g)
        self._check_grads(group, grads)
        self._opt_called = True
        # torch keeps no entry for a param with no state (SGD without momentum, until the
        # step creates its buffer): nothing to make, at every step
        algorithm = self._transform
        stateless = isinstance(algorithm, Algorithm) and algorithm.stateless(self.defaults)
        if stateless and not self.state:
            found: list[Any] = [None] * len(params)
        else:
            found = list(map(self.state.get, params))
            if not stateless and not all(found):
                for i, p in enumerate(params):
                    if not found[i]:
                        found[i] = self._made_state(p, group)
        if states is not None:
            states.extend(found)
        return len(set(map(id, params))) != len(params)

    def _made_state(self, p: Tensor, group: dict[str, Any]) -> dict[str, Any] | None:
        """`p`'s state, made where it has none (or an empty one); None where the new
        state is empty (torch keeps no entry then)."""
        s = self.state.get(p)
        if not s:  # (looked up again: a param listed twice has it from its first listing)
            new = self._new_state(p, group)
            if new:
                s = self.state[p]
                s.update(new)
        return s

    def _check_grads(self, group: dict[str, Any], grads: list[Tensor]) -> None:
        """Raise where torch's class refuses a group's gradients (a subclass's checks),
        before any state is made."""

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
            if knobs(self._transform).initial_from_group:  # (a loaded group may lack some: the defaults')
                hyperparams = normalize(
                    {k: group.get(k, v) for k, v in hyperparams.items()}, self._transform.pairs
                )
            return torch_state(
                self._transform,
                p,
                hyperparams,
                on_device=counters_on_device(self._transform, group),
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

    def _step_group(
        self,
        group: dict[str, Any],
        params: list[Tensor],
        grads: list[Tensor],
        states: list[Any] | None = None,
    ) -> None:
        # a param with no state yet gets a dict of its own, kept if the step fills it (an
        # optimizer that keeps no state, SGD without momentum, looks up no param);
        # `states`: the params' state dicts, as `_init_group` found them
        if states is None:
            states = list(map(self.state.get, params)) if self.state else [None] * len(params)
        fresh = [i for i, s in enumerate(states) if s is None] if None in states else []
        for i in fresh:
            states[i] = {}
        if group.get("fused"):
            _check_fused(params, grads)
        if group.get("capturable") and not torch.compiler.is_compiling():
            _check_capturable(params, getattr(self._transform, "name", ""))
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
                (fused_lists.step if group.get("fused") else _step_in_place)(
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
        updates, new_state = _update_with_value(
            transform,
            dict(zip(keys, grads)),
            state,
            dict(zip(keys, read_params)),
            getattr(self, "_closure_value", None),
        )
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


def _update_with_value(
    transform: GradientTransformation, grads: Any, state: Any, params: Any, value: Any
) -> tuple[Any, Any]:
    """`transform`'s update, given the closure's loss as ``value=`` where there is one and
    the transformation takes it (one that takes no extra arguments raises TypeError
    before it computes anything: then without)."""
    if value is None:
        return transform.update(grads, state, params)
    try:
        return transform.update(grads, state, params, value=value)
    except TypeError as e:
        if "unexpected keyword argument 'value'" not in str(e):
            raise
        return transform.update(grads, state, params)


# -- a transformation state <-> per-param dicts --------------------------------
# The adapter calls a transformation with params as a dict {"0": p0, "1": p1, ...}.
# A subtree of the state that is a dict with exactly those keys mirrors the params
# (one value per param); any other leaf is shared by all params (stored in each).
