"""`Algorithm`: one optimizer's math, turned into a pure `GradientTransformation`.

An algorithm file (see ``nadam.py``) gives:

- ``state``: a NamedTuple whose fields are torch.optim's per-param state keys, in
  torch's order. Each field of a functional state mirrors the params pytree, so the
  buffer of ``params['w']`` is ``state.exp_avg['w']``, its step ``state.step['w']``.
- ``counters``: the fields holding 0-d per-param scalars (``step``, ``mu_product``).
  The other fields are buffers shaped like their param.
- ``schedule(*counters, **hyperparams) -> (new_counters, coefficients)``: the
  per-step scalar math (bias corrections, momentum schedule, products of
  hyperparameters such as NAdam's ``1 - lr * weight_decay``). It is plain arithmetic,
  run on Python floats (in double precision, as torch; tensor hyperparameters stay
  tensors, as in torch's step, and round in their dtype), or on float64 0-d tensors
  where the counters may not be read in Python (torch.compile or another tracer, a
  capturable step, or counters that a torch.func transform batches or differentiates;
  see `_schedule`).
  The keyword ``counter_dtypes`` gives the counters' dtypes where they were read (else
  Nones), for a counter that torch updates by more than a count (see
  ``ops.counter_product``).
- ``elementwise(o, out, p, g, *buffers, coefficients, **hyperparams) -> (out, buffers)``:
  the per-tensor math, written once against ``o`` (see ``ops.py``). It reads ``p`` for
  weight decay only: ``p`` is None in an update without params, which ``update`` allows
  only without weight decay.
- ``bounds``: torch's checks, in torch's order: range checks (`Bound`), and any other
  rule (`Check`).

``initial`` declares how each buffer starts: a number (or 0-d tensor) fills one like
its param (0.0: zeros), a function of the param makes one (Adafactor's factored
``row_var``, not shaped like its param), None leaves it absent, as torch.optim creates
some keys only for some options (Adam's ``max_exp_avg_sq`` with ``amsgrad``), and
`AtFirstStep` marks one that torch makes at the first step (SGD's ``momentum_buffer``, a
copy of the first gradient): absent for the torch classes, held from init by a
functional state, so that its structure never changes. The math gets None for an absent
buffer, and returns None for one it leaves absent, or a new tensor for one it creates.
A functional state holds an empty node (`MaskedNode`) for an absent buffer, a
torch.optim state no key.

Calling an `Algorithm` with hyperparameters gives the functional transformation;
the torch face's in-place driver (``torch/step.py``, on ``inplace.py``'s executors)
runs the same two functions in place for the torch.optim classes.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import torch
from torch import Tensor

from ..core.base import (
    DEVICE,
    DTYPE,
    GradientTransformation,
    MaskedNode,
    Params,
    State,
    Updates,
    as_complex,
    as_real,
    flatten_together,
    readable,
    real_dtype,
    records,
    tracer_active,
    untraced,
)
from ..core.hyperparams import has_schedule, with_schedules
from . import groups, inplace
from .bounds import Bound, Check, Hyperparams, Prepared, normalize
from .leaves import (
    check_param,
    device_error,
    functional_start,
    initial_buffer,
    scalar_dtype,
    torch_start,
)
from .ops import Pure, PureForEach, TensorList, nonzero

_check_tensors = False  # see `checking_tensors` (a global: torch.compile traces no ContextVar)


@contextlib.contextmanager
def checking_tensors() -> Iterator[None]:
    """Inside, the factories (``fo.adamw``, ...) range-check tensor hyperparameters too,
    as torch's classes do: for ``fo.Optimizer``'s construction from a factory. Outside,
    a tensor may be batched or traced, and is never read in Python."""
    global _check_tensors
    before, _check_tensors = _check_tensors, True
    try:
        yield
    finally:
        _check_tensors = before


def _nothing(**_: Any) -> tuple[str, ...]:
    """The default `creates` of algorithms pickled before they pickled by name (kept for those)."""
    return ()


def _valid(hyperparams: Hyperparams) -> None:
    """The default `validate` of algorithms pickled before they pickled by name (kept for those)."""
    return None


REGISTRY: dict[str, Algorithm] = {}
"""Every algorithm by its name, as registered when made (the torch face finds the algorithm
of a torch.optim class here, by the class's name)."""


def registered(name: str) -> Algorithm:
    """The algorithm registered under `name` (every `Algorithm` registers itself when made,
    the first of a name only): funcopt's own pickle as this lookup, so that a pickled
    transformation names no private module."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise KeyError(
            f"no algorithm named {name!r} is registered: import the module that makes it first "
            f"(registered: {', '.join(sorted(REGISTRY))})"
        ) from None


registered.__module__ = "funcopt.engine"  # its public home, which pickles record


@dataclass(frozen=True, eq=False)
class Algorithm:
    """An optimizer from its state, per-step scalars and per-tensor math, written once
    (see ``docs/adding-an-algorithm.md``). ``algorithm.transform(**hyperparams)`` is its
    pure transformation (range-checked; any hyperparameter may be a schedule), and
    ``fo.Optimizer(params, algorithm, **defaults)`` its in-place torch optimizer.

    The fields after ``bounds`` are optional declarations: see the guide's "More
    declarations"."""

    name: str
    state: Any  # a NamedTuple class
    counters: tuple[str, ...]
    initial: Callable[..., Sequence[Any]]
    schedule: Callable[..., tuple[tuple[Any, ...], tuple[Any, ...]]]
    elementwise: Callable[..., tuple[Any, Sequence[Any]]]
    bounds: tuple[Bound | Check, ...]
    sparse: bool = False  # accepts sparse gradients
    # Each element's update depends on that element alone (no per-tensor reductions),
    # so the adapters may concatenate small tensors and step them together.
    per_element: bool = True
    buffers_like_param: bool = True  # every buffer is shaped like its param (not Adafactor's)
    needs_params: bool = False  # the math reads the params beyond weight decay (ASGD's average)
    fields: tuple[str, ...] = field(init=False)
    # the hyperparameters that are pairs: those a bound indexes (betas) or a check reads
    pairs: tuple[str, ...] = field(init=False)
    # what `update`'s messages call its arguments (see `_names`)
    update_names: tuple[str, ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "fields", tuple(self.state._fields))
        object.__setattr__(self, "update_names", self._names())
        pairs = [
            *(b.key for b in self.bounds if isinstance(b, Bound) and b.index is not None),
            *(key for b in self.bounds if isinstance(b, Check) for key in b.pairs),
        ]
        object.__setattr__(self, "pairs", tuple(dict.fromkeys(pairs)))
        # a saved state loads with torch.load's default weights_only=True
        torch.serialization.add_safe_globals([self.state])
        REGISTRY.setdefault(self.name, self)

    def __reduce__(self) -> Any:
        """funcopt's own algorithms pickle by their registered name (`registered`); a
        user's, field by field (its functions by their module, as pickle finds them)."""
        if REGISTRY.get(self.name) is self and self.elementwise.__module__.startswith("funcopt."):
            return registered, (self.name,)
        return super().__reduce__()

    # -- checks ---------------------------------------------------------------

    def check(self, hyperparams: Hyperparams, tensors: bool = False) -> None:
        """Raise torch.optim's exception for a bad hyperparameter. Tensors are range-checked
        only if `tensors` (the adapters do, like torch; the functional factories do not)."""
        lr = hyperparams.get("lr")
        if isinstance(lr, Tensor) and lr.numel() != 1:
            raise ValueError("Tensor lr must be 1-element")
        for bound in self.bounds:
            bound.check(hyperparams, tensors)
        legacy = self.__dict__.get("validate")  # a user's algorithm pickled before `Check`
        if legacy is not None:
            legacy(hyperparams)

    def check_sparse_grad(self, hyperparams: Hyperparams) -> None:
        """torch's checks of a sparse gradient, run for every param before any changes."""
        if not self.sparse:
            raise RuntimeError(f"{self.name} does not support sparse gradients")
        if nonzero(hyperparams.get("weight_decay", 0)):
            raise RuntimeError("weight_decay option is not compatible with sparse gradients")

    # -- the functional transformation ----------------------------------------

    def __call__(self, **hyperparams: Any) -> GradientTransformation:
        """The pure transformation for these hyperparameters (not range-checked)."""
        hp = Prepared(normalize(hyperparams, self.pairs))
        return GradientTransformation(functools.partial(self.init, hp), functools.partial(self.update, hp))

    def transform(self, **hyperparams: Any) -> GradientTransformation:
        """Range-check Python-number hyperparameters (tensors too, inside
        `checking_tensors`), then build the transformation. A
        hyperparameter may be a schedule (a function of the step count, such as
        ``fo.cosine_decay_schedule(...)``): the state then carries the count, and each
        update evaluates the schedules there (see ``hyperparams.with_schedules``)."""
        self.check({k: v for k, v in hyperparams.items() if not has_schedule(v)}, _check_tensors)
        return with_schedules(self, hyperparams)

    def init(self, hyperparams: Hyperparams, params: Params) -> State:
        (leaves,), unflatten = flatten_together(params)
        # functional: a buffer that torch makes at the first step may start here, so that
        # the state keeps one structure from init on (SGD's momentum_buffer, as zeros)
        initial = [functional_start(v) for v in self.initial_values(hyperparams, functional=True)]
        k = len(self.counters)
        # One counter per device and dtype, shared by the leaves. Its dtype is torch's
        # (the default dtype, see `scalar_dtype`), or float64 for float64 params: a float64
        # run, checked by gradcheck or finite differences, then does not meet float32
        # rounding of a counter (NAdam's mu_product). The torch classes keep torch's.
        shared: dict[tuple[torch.device, torch.dtype], list[Tensor]] = {}
        columns: list[list[Any]] = [[] for _ in self.fields]
        for i, p in enumerate(leaves):
            if p is None:
                for column in columns:
                    column.append(None)
                continue
            check_param(self.name, i, p)
            where = (p.device, torch.promote_types(scalar_dtype(), real_dtype(p)))
            if where not in shared:
                shared[where] = [torch.as_tensor(v, dtype=where[1], device=p.device) for v in initial[:k]]
            values = shared[where] + [initial_buffer(p, v) for v in initial[k:]]
            for column, v in zip(columns, values):
                column.append(MaskedNode() if v is None else v)
        return self.state(*(unflatten(c) for c in columns))

    def update(
        self,
        hyperparams: Hyperparams,
        grads: Updates,
        state: State,
        params: Params | None = None,
        **extra_args: Any,
    ) -> tuple[Updates, State]:
        """The pure update; `extra_args` (a loss value, ...) are for other transformations
        in a chain, and unused here."""
        if not isinstance(state, self.state):
            raise TypeError(
                f"{self.name} update got a state of type {type(state).__name__}; "
                f"pass the {self.state.__name__} that init returned"
            )
        if params is None and self.needs_params:
            raise ValueError(
                f"{self.name} needs the params, which its update reads: call update(grads, state, params)"
            )
        if params is None and nonzero(hyperparams.get("weight_decay", 0)):
            raise ValueError(
                f"{self.name} with weight_decay needs the params: call update(grads, state, params)"
            )
        leaves, unflatten = flatten_together(
            grads,
            *state,
            *(() if params is None else (params,)),
            names=self._names(),
            hint="grads, params and each field of the state must have the structure of the params given to init.",
        )
        g_leaves, columns = leaves[0], leaves[1 : 1 + len(state)]
        p_leaves: list[Any] = [None] * len(g_leaves) if params is None else leaves[-1]
        try:
            updates, new_columns = self.update_leaves(hyperparams, p_leaves, g_leaves, columns)
        except RuntimeError as error:  # torch's device error names no tensor: name the leaf
            mixed = device_error(
                self.name, self.buffer_fields, p_leaves, g_leaves, columns[len(self.counters) :]
            )
            if mixed is None:
                raise
            raise mixed from error
        return unflatten(updates), self.state(*map(unflatten, new_columns))

    def update_leaves(
        self,
        hyperparams: Hyperparams,
        p_leaves: Sequence[Tensor | None],
        g_leaves: Sequence[Tensor | None],
        columns: Sequence[Sequence[Any]],
        traceable: bool = False,
        written_back: bool = False,
    ) -> tuple[list[Tensor | None], list[list[Any]]]:
        """`update` on flat lists: the leaves of params and grads, and one list per state
        field (``columns[j][i]`` is field j of leaf i). Returns the updates and the new
        columns. The adapters call it directly, with no pytree to flatten.

        `traceable` forces what any tracer (`tracer_active`: torch.compile, make_fx, ...)
        implies: the schedule stays in tensors and no value is read on the host (a
        capturable step, which a CUDA graph may record).
        `written_back` says that the caller writes the results into the params and the
        state in place (the adapters' pure step).

        Leaves whose coefficients are numbers, where nothing but autograd traces, run in
        groups the way `inplace.plan` says: in plain eager mode (`inplace.FRESH`) the new
        tensors are computed in place, in fresh memory, small ones with foreach ops; where
        autograd records (a MAML inner loop; `inplace.RECORDED`), small ones through
        `PureForEach` ops, the others through `Pure` ops one by one, and a step that is
        `written_back` takes no foreach op (`inplace.WRITTEN_BACK`). Any other leaf (traced,
        batched, with tensor coefficients, sparse, or whose math looks across elements)
        steps by itself with the `Pure` ops.
        """
        traceable = traceable or tracer_active()  # a property of the call, not of a tensor
        creating, tensor_hyperparams = self._derived(hyperparams)
        lists_ok = not traceable and not tensor_hyperparams and untraced({}, g_leaves, p_leaves, *columns)
        eager = lists_ok and not records(g_leaves, p_leaves, *columns)
        k = len(self.counters)
        n = len(g_leaves)
        buffer_columns: list[list[Any]] = [
            [None if type(b) is MaskedNode else b for b in column] for column in columns[k:]
        ]
        usual = (
            groups.usual(self, hyperparams, p_leaves, g_leaves, columns[:k], buffer_columns, creating)
            if eager
            else None
        )
        if usual is not None and inplace.all_lists(
            cast(Sequence[Tensor], p_leaves if p_leaves[0] is not None else g_leaves)
        ):
            # the usual small step, in fresh memory with foreach ops: no grouping to do
            new, coefficients = usual
            outs, new_buffers = inplace.fresh_lists(
                self, coefficients, hyperparams, (p_leaves, g_leaves, *buffer_columns)
            )
            return cast(list[Tensor | None], outs), [
                *([value] * n for value in new),
                *([MaskedNode() for _ in range(n)] if b is None else b for b in new_buffers),
            ]
        new_columns = [list(column) for column in columns]
        found: groups.Groups = []  # coefficients and leaves, by what they share
        updates: list[Tensor | None] = [None] * n
        if usual is not None:  # one group, checked column by column
            new, coefficients = usual
            for column, value in zip(new_columns, new):
                column[:] = [value] * n
            found.append((coefficients, list(range(n))))
        else:
            groups.group_leaves(self, hyperparams, p_leaves, g_leaves, columns, buffer_columns,
                                new_columns, updates, found, lists_ok, eager, traceable, creating)  # fmt: skip
        face = inplace.FRESH if eager else inplace.WRITTEN_BACK if written_back else inplace.RECORDED
        gs = cast(Sequence[Tensor], g_leaves)  # (a grouped leaf has a gradient)
        groups.run(self, hyperparams, found, p_leaves, gs, buffer_columns, updates, new_columns[k:], face)
        return updates, new_columns

    def creating(self, hyperparams: Hyperparams) -> Callable[[Sequence[Tensor | None]], bool]:
        """A test of a param's buffers: whether the math creates one of them at this step
        (absent, where a functional state holds it from init: `AtFirstStep`). A param
        with one to create steps by itself, off the fast paths."""
        k = len(self.counters)
        in_place = self.initial_values(hyperparams)[k:]
        if all(v is not None for v in in_place):
            return lambda buffers: False
        functional_values = self.initial_values(hyperparams, functional=True)[k:]
        creates = {
            name
            for name, a, b in zip(self.buffer_fields, in_place, functional_values)
            if a is None and functional_start(b) is not None
        }
        if not creates:
            return lambda buffers: False
        return lambda buffers: any(
            b is None and name in creates for name, b in zip(self.buffer_fields, buffers)
        )

    def initial_values(self, hyperparams: Hyperparams, functional: bool = False) -> list[Any]:
        """`initial`'s values for these hyperparameters, as the torch classes start (a
        buffer made `AtFirstStep` absent), or as given, for a functional state. (An
        ``initial`` written before `AtFirstStep` took a ``functional`` keyword, still
        passed for those.)"""
        values = self.initial(**hyperparams, functional=True) if functional else self.initial(**hyperparams)
        return list(values) if functional else [torch_start(v) for v in values]

    def _derived(self, hyperparams: Hyperparams) -> tuple[Callable[[Sequence[Tensor | None]], bool], bool]:
        """What an update derives from the hyperparameters alone: the `creating` test, and
        whether any is a tensor. A transformation's `Prepared` hyperparameters keep it."""
        if torch.compiler.is_compiling():  # (a kept value would be guarded on)
            return self.creating(hyperparams), _holds_tensor(hyperparams)
        derived = getattr(hyperparams, "derived", None)
        if derived is None:
            derived = (self.creating(hyperparams), _holds_tensor(hyperparams))
            if type(hyperparams) is Prepared:
                hyperparams.derived = derived
        return derived

    def _names(self) -> tuple[str, ...]:
        """What `update`'s messages call its arguments (kept at `__post_init__`; an
        algorithm pickled before that derives them here)."""
        names = self.__dict__.get("update_names")
        if names is None:
            names = (f"{self.name} update: grads", *(f"state.{f}" for f in self.fields), "params")
        return names

    def stateless(self, hyperparams: Hyperparams) -> bool:
        """Whether a param's state is empty at first (SGD's: no counters, its buffer absent)."""
        return not self.counters and all(v is None for v in self.initial_values(hyperparams))

    def optional(self, hyperparams: Hyperparams) -> tuple[str, ...]:
        """The buffers that a param's state may lack for these hyperparameters: absent at
        first (`initial` gives None, or a function of the param that may)."""
        initial = self.initial_values(hyperparams)[len(self.counters) :]
        return tuple(name for name, v in zip(self.buffer_fields, initial) if v is None or callable(v))

    @property
    def buffer_fields(self) -> tuple[str, ...]:
        """The state's fields that are per-param buffers (not counters)."""
        return self.fields[len(self.counters) :]

    def _schedule(
        self,
        counters: tuple[Tensor, ...],
        hyperparams: Hyperparams,
        traceable: bool,
        by_value: dict[Any, Any],
    ) -> tuple[tuple[Tensor, ...], tuple[Any, ...]]:
        """New counters (tensors of the old ones' dtype) and the step's coefficients,
        computed from the counters' values in Python doubles, as torch does, where they
        may be read (see `readable`: also under a torch.func transform that neither
        batches nor differentiates them); else (under a tracer such as torch.compile, or
        in a capturable step) from float64 0-d tensors, which stay traceable and batchable.

        Read values are looked up in `by_value` first: leaves whose counters are equal
        but not shared (a state moved with ``tree_map``) then get the same schedule,
        step in the same groups, and share their new counters."""
        if not traceable and all(map(readable, counters)):
            values = tuple(map(Tensor.item, counters))
            dtypes = tuple(map(DTYPE, counters))
            key = (values, dtypes, tuple(map(DEVICE, counters)))
            if key not in by_value:
                new, coefficients = self.schedule(*values, counter_dtypes=dtypes, **hyperparams)
                by_value[key] = tuple(map(_counter, new, counters)), coefficients
            return by_value[key]
        new, coefficients = self.schedule(
            *(c.to(torch.float64) for c in counters), counter_dtypes=(None,) * len(counters), **hyperparams
        )
        return tuple(n.to(c.dtype) for n, c in zip(new, counters)), coefficients

    def _pure_step(
        self,
        p: Tensor | None,
        g: Tensor,
        buffers: Sequence[Tensor],
        coefficients: tuple[Any, ...],
        hyperparams: Hyperparams,
    ) -> tuple[Tensor, list[Tensor]]:
        """One param's step with `Pure` ops; complex tensors run as pairs of reals."""
        is_complex = g.is_complex()  # then so are p and the buffers (checked)
        if is_complex:  # real tensors need no views (fewer for torch.compile to trace)
            p, g, buffers = as_real(p), as_real(g), [as_real(b) for b in buffers]
        out, new = self.elementwise(Pure, None, p, g, *buffers, coefficients, **hyperparams)
        if not is_complex:
            return out, list(new)
        return as_complex(out), [as_complex(b) for b in new]

    def _pure_lists(
        self, coefficients: tuple[Any, ...], hyperparams: Hyperparams, columns: Sequence[Sequence[Any]]
    ) -> tuple[list[Any], list[Any]]:
        """`_pure_step` for a group of params of one dtype, with `PureForEach` ops.
        `columns` holds the params (all None for an update without params), their
        gradients, then each buffer."""
        ps, gs, *buffers = columns
        real = lambda ts: None if ts[0] is None else TensorList(as_real(t) for t in ts)  # noqa: E731
        out, new = self.elementwise(
            PureForEach, None, real(ps), real(gs), *(real(b) for b in buffers), coefficients, **hyperparams
        )
        back = as_complex if gs[0].is_complex() else lambda t: t
        return [back(t) for t in out], [None if b is None else [back(t) for t in b] for b in new]


def _counter(value: Any, like: Tensor) -> Tensor:
    """A new counter of `value` like the counter `like`: from a Python number, or a tensor
    (computed from a tensor hyperparameter, which stays in its graph)."""
    if isinstance(value, Tensor):
        return value.to(like.dtype)
    try:
        return torch.scalar_tensor(value, dtype=like.dtype, device=like.device)  # (the faster)
    except RuntimeError:  # a float that overflows the dtype: torch.tensor makes it inf
        return torch.tensor(value, dtype=like.dtype, device=like.device)


def _holds_tensor(hyperparams: Hyperparams) -> bool:
    """Whether a hyperparameter is a tensor, or a tuple holding one."""
    return any(
        isinstance(v, Tensor) or (type(v) is tuple and any(isinstance(x, Tensor) for x in v))
        for v in hyperparams.values()
    )
