"""L-BFGS with torch's optional strong-Wolfe line search (``torch.optim.LBFGS``).

One copy of the math serves both faces: `LBFGS`, torch's closure-based class (its state
and ``state_dict`` torch's: Python lists of history tensors, Python numbers), and
`lbfgs`, a pure transformation whose ``update`` takes the objective (``value_fn``) and
whose state holds the history in buffers of a fixed size.

The math (the two-loop recursion, the strong-Wolfe line search, the loop of a step) is
written once, in a branch-free style, against a namespace ``S`` of the few operations
that decide something:

- `_Eager` decides as torch does: a condition is read in Python, ``S.where`` picks one
  of two values, ``S.cond`` runs one of two branches, loops stop as soon as nothing is
  left to do, and the values keep torch's types (the loss a Python float, a step
  length a float or a tensor). The class and the functional update in plain eager mode
  run this way, operation for operation as torch's step.
- `_Traced` decides nothing in Python, for ``torch.func`` transforms and tracers
  (``vmap``, ``grad``, ``torch.compile``), where a value cannot be read: both branches
  run and ``torch.where`` picks, every loop runs its largest number of rounds, and
  what is finished is carried along unchanged (masked). Scalars are tensors (the loss
  in float64, where torch has a Python float).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import optree
import torch
from torch import Tensor

from ..core.base import GradientTransformation, Params, a_kind, tracing
from ..core.hyperparams import has_schedule, with_schedules
from ..engine.bounds import Bound
from ..engine.leaves import check_param
from .lbfgs_loop import _Buffers, _flat_grad, _Lists, _Position, _run, _Step
from .lbfgs_search import _Eager, _Traced

_LR = Bound("lr", "Invalid learning rate: {}")
"""torch's range check of the learning rate."""


# -- the functional transformation ------------------------------------------------------


class LBFGSState(NamedTuple):
    """torch's LBFGS state as tensors of a fixed structure: counters (``func_evals``,
    ``n_iter``; 0-d int64), the last direction ``d`` and gradient ``prev_flat_grad``
    (flat vectors of all params, complex ones as pairs of reals), the last step length
    ``t`` and loss ``prev_loss`` (0-d float64), ``H_diag``, and the history in buffers
    of ``history_size`` rows, oldest first: ``old_dirs``, ``old_stps`` (gradient
    changes and steps), ``ro`` and ``al``, of which the first ``num_old`` are in use
    (torch's lists, and their length)."""

    func_evals: Tensor
    n_iter: Tensor
    d: Tensor
    t: Tensor
    old_dirs: Tensor
    old_stps: Tensor
    ro: Tensor
    H_diag: Tensor
    prev_flat_grad: Tensor
    prev_loss: Tensor
    al: Tensor
    num_old: Tensor


torch.serialization.add_safe_globals([LBFGSState])


def lbfgs(
    lr: float | Tensor = 1,
    max_iter: int = 20,
    max_eval: int | None = None,
    tolerance_grad: float | Tensor = 1e-7,
    tolerance_change: float | Tensor = 1e-9,
    history_size: int = 100,
    line_search_fn: str | None = None,
) -> GradientTransformation:
    """L-BFGS as a pure transformation, with ``torch.optim.LBFGS``'s arguments: one
    ``update`` is one ``torch.optim.LBFGS.step`` (up to `max_iter` iterations, the line
    search included).

    Args:
        lr: learning rate (the initial step length of each line search).
        max_iter: iterations per update (an int under torch.func and torch.compile).
        max_eval: evaluations of the objective per update (default ``max_iter * 5 // 4``;
            likewise an int there).
        tolerance_grad: stop where the largest gradient entry is this small.
        tolerance_change: stop where the loss or the params change less.
        history_size: the number of past steps the Hessian approximation keeps (the
            state's buffers have this many rows).
        line_search_fn: ``"strong_wolfe"``, or None for fixed steps of length ``lr``.

    ``update(grads, state, params, value_fn=..., value=None)`` needs the params and the
    objective: ``value_fn(params)`` returns the loss (a 0-d tensor) of params of the
    structure given, and the update evaluates it, with its gradient
    (``torch.func.grad_and_value``), at the points it tries. `grads` are the gradients
    at `params` (None for a param without one: zeros, as torch), `value` the loss
    there (evaluated if not given). The updates take the params to where the step ends.

    In plain eager mode the update decides as torch does, evaluation for evaluation.
    Under ``torch.func`` transforms and ``torch.compile`` it can read no value, so it
    runs every loop to its bound: `max_iter` iterations of at most ``max_eval - 1``
    line-search evaluations each (with the line search), those past torch's stopping
    point masked out. That gives torch's result (up to rounding: scalars are tensors
    there, the loss in float64) at the cost of the evaluations torch would skip, and
    makes a batch (``vmap``) of problems, or a differentiable fit (``grad``), possible.

    A float hyperparameter may be a schedule (a function of the update count, such as
    ``fo.linear_schedule(...)``): the state is then a ``ScheduledState`` that carries the
    count (see ``docs/schedules.md``).

    Example:
        >>> import torch, funcopt as fo
        >>> A, b = torch.tensor([[3.0, 1.0], [1.0, 2.0]]), torch.tensor([1.0, -1.0])
        >>> def value_fn(params):  # a least-squares problem
        ...     return 0.5 * (A @ params["x"] - b).pow(2).sum()
        >>> params = {"x": torch.zeros(2)}
        >>> tx = fo.lbfgs(line_search_fn="strong_wolfe")
        >>> state = tx.init(params)
        >>> grads = torch.func.grad(value_fn)(params)
        >>> updates, state = tx.update(grads, state, params, value_fn=value_fn)
        >>> fo.apply_updates(params, updates)["x"], int(state.func_evals)
        (tensor([ 0.6000, -0.8000]), 8)
    """
    hyperparams = _hyperparams(
        lr, max_iter, max_eval, tolerance_grad, tolerance_change, history_size, line_search_fn, tensors=False
    )
    return with_schedules(_lbfgs, hyperparams)


def _hyperparams(
    lr: Any,
    max_iter: int,
    max_eval: int | None,
    tolerance_grad: float | Tensor,
    tolerance_change: float | Tensor,
    history_size: int,
    line_search_fn: str | None,
    *,
    tensors: bool,
) -> dict[str, Any]:
    """The hyperparameters of `lbfgs` and `LBFGS`, after torch's checks at construction
    (of lr only: the others are used as they are; a tensor lr only if `tensors`, a
    schedule never), with torch's default max_eval."""
    if isinstance(lr, Tensor) and lr.numel() != 1:
        raise ValueError("Tensor lr must be 1-element")
    if not has_schedule(lr):
        _LR.check({"lr": lr}, tensors=tensors)
    return {
        "lr": lr,
        "max_iter": max_iter,
        "max_eval": max_iter * 5 // 4 if max_eval is None else max_eval,
        "tolerance_grad": tolerance_grad,
        "tolerance_change": tolerance_change,
        "history_size": history_size,
        "line_search_fn": line_search_fn,
    }


def _lbfgs(**hyperparams: Any) -> GradientTransformation:
    """`lbfgs` for hyperparameters that are values (no schedules)."""
    if isinstance(hyperparams["lr"], Tensor):
        hyperparams["lr"] = hyperparams["lr"].reshape(())
    return GradientTransformation(
        functools.partial(_init, hyperparams), functools.partial(_update, hyperparams)
    )


def _init(hyperparams: dict[str, Any], params: Params) -> LBFGSState:
    """`lbfgs`'s init: zero vectors and buffers, made from the params."""
    history_size = hyperparams["history_size"]
    leaves, _ = _flatten(params)
    for i, p in enumerate(leaves):
        if p is not None:
            check_param("LBFGS", i, p)
    leaves = [p for p in leaves if p is not None]
    if isinstance(history_size, bool) or not isinstance(history_size, int) or history_size < 1:
        raise ValueError(
            f"lbfgs: history_size must be an int of at least 1 (the rows of the state's buffers); "
            f"got {history_size!r}"
        )
    flat = _flat_grad([None] * len(leaves), leaves)
    # tensors of their own (no two entries one tensor: torch.compile would guard on it)
    count = lambda: torch.zeros((), dtype=torch.int64, device=flat.device)  # noqa: E731
    number = lambda: torch.zeros((), dtype=torch.float64, device=flat.device)  # noqa: E731
    return LBFGSState(
        func_evals=count(),
        n_iter=count(),
        d=torch.zeros_like(flat),
        t=number(),
        old_dirs=flat.new_zeros((history_size, flat.numel())),
        old_stps=flat.new_zeros((history_size, flat.numel())),
        ro=flat.new_zeros(history_size),
        H_diag=flat.new_ones(()),
        prev_flat_grad=torch.zeros_like(flat),
        prev_loss=number(),
        al=flat.new_zeros(history_size),
        num_old=count(),
    )


def _update(
    hyperparams: dict[str, Any],
    updates: Params,
    state: LBFGSState,
    params: Params | None = None,
    **extra_args: Any,
) -> tuple[Params, LBFGSState]:
    """`lbfgs`'s update: one torch.optim.LBFGS step (see `lbfgs`)."""
    grads = updates  # the gradients at the params
    value_fn: Callable[[Params], Tensor] | None = extra_args.get("value_fn")
    value = extra_args.get("value")  # the loss at the params, where the caller has it
    if value_fn is None or params is None:
        raise ValueError(
            "lbfgs update needs the params and the objective: "
            "update(grads, state, params, value_fn=lambda params: loss) (it evaluates the loss "
            "and its gradient at the points it tries)"
        )
    if not isinstance(state, LBFGSState):
        raise TypeError(f"LBFGS update: state must be an LBFGSState (from init); got {a_kind(state)}")
    p_all, rebuild, present, p_leaves, flat_grad = _leaves(params, grads, state)
    S: Any = _Traced if tracing() else _Eager
    if S is _Traced:
        _check_rounds(hyperparams)

    def put_back(leaves: list[Any]) -> Any:
        full: list[Any] = [None] * len(p_all)
        for i, leaf in zip(present, leaves):
            full[i] = leaf
        return rebuild(full)

    point = _Position(S, p_leaves, put_back, value_fn)
    loss = value_fn(params) if value is None else value
    if S is _Eager:
        st = _eager_entries(state)
    else:
        hist = _Buffers(state.old_dirs, state.old_stps, state.ro, state.al, state.num_old)
        st = _Step(**{k: getattr(state, k) for k in _ENTRIES}, hist=hist)
    _run(S, point, st, S.number(loss), flat_grad, **hyperparams)
    # every param moves (along the direction, which mixes in what the history holds)
    return put_back([new - p for p, new in zip(p_leaves, point.params)]), _state_from(st, state)


def _leaves(
    params: Params, grads: Params, state: LBFGSState
) -> tuple[list[Any], Any, list[int], list[Tensor], Tensor]:
    """The params' leaves (None where a param is absent), the function that rebuilds a
    tree from them, the indices of the present ones, those params, and their gradients as
    one flat vector; checked against the grads' structure and the state's size."""
    p_all, treedef = _flatten(params)
    try:
        g_all = treedef.flatten_up_to(grads)
    except ValueError as e:
        raise ValueError(
            f"LBFGS update: grads does not have the structure of params ({e}). Pass the gradients "
            "of these params."
        ) from None
    present = [i for i, p in enumerate(p_all) if p is not None]  # None: no param there
    p_leaves, g_leaves = [p_all[i] for i in present], [g_all[i] for i in present]
    for i, g in zip(present, g_leaves):
        if g is not None and not isinstance(g, Tensor):
            raise TypeError(
                f"LBFGS update: the gradient of leaf {i} is {a_kind(g)}; grads must be a pytree of "
                "tensors (None for a param without one)"
            )
    flat_grad = _flat_grad(g_leaves, p_leaves)
    if flat_grad.shape != state.d.shape:
        raise ValueError(
            f"LBFGS update: the params have {flat_grad.numel()} real entries, the state "
            f"{state.d.numel()}: pass a state that init made from these params"
        )
    return p_all, treedef.unflatten, present, p_leaves, flat_grad


def _check_rounds(hyperparams: dict[str, Any]) -> None:
    """Under a tracer the update runs a fixed number of rounds: the bounds must be ints."""
    for name in ("max_iter", "max_eval"):
        bound = hyperparams[name]
        if isinstance(bound, bool) or not isinstance(bound, int):
            raise TypeError(
                f"LBFGS update: under torch.func transforms and torch.compile, {name} must be an "
                f"int (the update runs that many rounds); got {bound!r}"
            )


def _flatten(params: Params) -> tuple[list[Any], Any]:
    """The leaves of `params` in optree's order (dict keys sorted), also under
    torch.compile, whose fast ``tree_map`` visits dicts in insertion order: the flat
    vectors of a state must lay the params out alike in eager and compiled updates."""
    leaves, treedef = optree.tree_flatten(params, none_is_leaf=True)
    return leaves, treedef


_ENTRIES = ("func_evals", "n_iter", "d", "t", "H_diag", "prev_flat_grad", "prev_loss")


def _eager_entries(state: LBFGSState) -> _Step:
    """A functional state as torch's entries: Python counters, lists of history rows."""
    num_old = int(state.num_old)
    entries: dict[str, Any] = {
        "old_dirs": list(state.old_dirs[:num_old].unbind(0)),
        "old_stps": list(state.old_stps[:num_old].unbind(0)),
        "ro": list(state.ro[:num_old].unbind(0)),
        "al": list(state.al.unbind(0)),
    }
    values = {k: getattr(state, k) for k in _ENTRIES}
    values.update(func_evals=int(state.func_evals), n_iter=int(state.n_iter))
    return _Step(**values, hist=_Lists(entries, state.al.shape[0]))


def _state_from(st: _Step, old: LBFGSState) -> LBFGSState:
    """A functional state of `old`'s structure and dtypes from what a step left."""
    hist = st.hist

    def like(value: Any, template: Tensor) -> Tensor:
        return torch.as_tensor(value, dtype=template.dtype, device=template.device).expand_as(template)

    if isinstance(hist, _Lists):
        size, n = old.old_dirs.shape
        count = len(hist.dirs)

        def rows(values: list[Tensor], template: Tensor) -> Tensor:
            if not values:
                return torch.zeros_like(template)
            stacked = torch.stack([like(v, template[0]) for v in values])
            return torch.cat([stacked, template.new_zeros((size - count, *template.shape[1:]))])

        dirs, stps, ro = rows(hist.dirs, old.old_dirs), rows(hist.stps, old.old_stps), rows(hist.ro, old.ro)
        al = torch.stack([old.al[i] if a is None else like(a, old.al[i]) for i, a in enumerate(hist.al)])
        num_old: Any = count
    else:
        dirs, stps, ro, num_old = hist.dirs, hist.stps, hist.ro, hist.count
        al = torch.stack([like(a, old.al[0]) for a in hist.al])
    return LBFGSState(
        func_evals=like(st.func_evals, old.func_evals),
        n_iter=like(st.n_iter, old.n_iter),
        d=like(st.d, old.d),
        t=like(st.t, old.t),
        old_dirs=like(dirs, old.old_dirs),
        old_stps=like(stps, old.old_stps),
        ro=like(ro, old.ro),
        H_diag=like(st.H_diag, old.H_diag),
        prev_flat_grad=like(st.prev_flat_grad, old.prev_flat_grad),
        prev_loss=like(st.prev_loss, old.prev_loss),
        al=al,
        num_old=like(num_old, old.num_old),
    )
