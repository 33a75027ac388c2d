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
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import optree
import torch
from torch import Tensor

from ..core.base import GradientTransformation, Params, a_kind, tracing
from ..core.hyperparams import has_schedule, with_schedules
from ..engine.algorithm import Bound, check_param
from .lbfgs_search import _Eager, _strong_wolfe, _Traced

_LR = Bound("lr", "Invalid learning rate: {}")
"""torch's range check of the learning rate."""


# -- the two ways to decide ---------------------------------------------------------


# -- the history of steps and gradient changes -------------------------------------


class _Lists:
    """torch's history: lists of tensors, oldest first, in a param's state dict (the
    class's) or made from a functional state's buffers."""

    def __init__(self, state: dict[str, Any], size: int) -> None:
        self.state = state
        self.size = size
        self.dirs: Any = state.get("old_dirs")  # None before the first iteration
        self.stps: Any = state.get("old_stps")
        self.ro: Any = state.get("ro")

    @property
    def slots(self) -> int:
        return len(self.dirs)

    def used(self, i: int) -> bool:
        return True

    @property
    def al(self) -> list[Any]:
        if "al" not in self.state:
            self.state["al"] = [None] * self.size
        return self.state["al"]

    def reset(self, S: Any, condition: Any) -> None:
        if condition:
            self.dirs, self.stps, self.ro = [], [], []

    def push(self, S: Any, y: Tensor, s: Tensor, ys: Tensor, condition: Any) -> None:
        if condition:
            if len(self.dirs) == self.size:  # shift the history by one (limited memory)
                self.dirs.pop(0)
                self.stps.pop(0)
                self.ro.pop(0)
            self.dirs.append(y)
            self.stps.append(s)
            self.ro.append(1.0 / ys)


class _Buffers:
    """The history in buffers of a fixed size (``size`` rows, oldest first), of which the
    first ``count`` are in use: a structure that no step changes, for tracing."""

    def __init__(self, dirs: Tensor, stps: Tensor, ro: Tensor, al: Tensor, count: Tensor) -> None:
        self.dirs, self.stps, self.ro, self.count = dirs, stps, ro, count
        self.al = list(al.unbind(0))
        self.size = self.slots = dirs.shape[0]

    def used(self, i: int) -> Tensor:
        return i < self.count

    def reset(self, S: Any, condition: Any) -> None:
        self.count = S.where(condition, 0, self.count)

    def push(self, S: Any, y: Tensor, s: Tensor, ys: Tensor, condition: Any) -> None:
        full = self.count >= self.size
        at = torch.arange(self.size, device=self.dirs.device) == S.where(full, self.size - 1, self.count)

        def put(buffer: Tensor, row: Tensor) -> Tensor:
            shifted = S.where(full, torch.cat([buffer[1:], buffer[:1]]), buffer)
            at_row = at.reshape(-1, *(1,) * row.dim())
            return S.where(condition, torch.where(at_row, row.unsqueeze(0), shifted), buffer)

        self.dirs = put(self.dirs, y)
        self.stps = put(self.stps, s)
        self.ro = put(self.ro, 1.0 / S.where(condition, ys, 1.0))
        self.count = S.where(condition, S.min(self.count + 1, self.size), self.count)


def _direction(S: Any, history: Any, flat_grad: Tensor, H_diag: Any, run: Any) -> Tensor:
    """torch's two-loop recursion: the gradient times the (negated) inverse-Hessian
    approximation that the history makes, with ``H_diag`` as its initial scale. The
    coefficients ``al`` are left in ``history.al``, as torch leaves them in its state,
    where `run` (traced: the members of a batch that take this iteration)."""
    al = history.al
    q = flat_grad.neg()
    for i in range(history.slots - 1, -1, -1):
        used = S.and_(run, history.used(i))
        al[i] = S.where(used, history.stps[i].dot(q) * history.ro[i], al[i])
        q = S.where(used, S.axpy(q, history.dirs[i], -al[i]), q)
    r = torch.mul(q, H_diag)
    for i in range(history.slots):
        used = S.and_(run, history.used(i))
        be_i = history.dirs[i].dot(r) * history.ro[i]
        r = S.where(used, S.axpy(r, history.stps[i], al[i] - be_i), r)
    return r


# -- the line search -----------------------------------------------------------------


# -- one step ------------------------------------------------------------------------


class _Step:
    """What a step reads and leaves: torch's state entries (``hist`` holds the history),
    as Python values (`_Eager`) or tensors (`_Traced`)."""

    def __init__(self, **entries: Any) -> None:
        self.func_evals: Any = None
        self.n_iter: Any = None
        self.d: Any = None
        self.t: Any = None
        self.hist: Any = None
        self.H_diag: Any = None
        self.prev_flat_grad: Any = None
        self.prev_loss: Any = None
        self.__dict__.update(entries)


def _lbfgs_direction(
    S: Any,
    hist: Any,
    flat_grad: Tensor,
    prev_flat_grad: Tensor,
    d: Tensor,
    t: Any,
    H_diag: Any,
    live: Any,
    first: Any,
) -> tuple[Any, Tensor]:
    """After the first iteration: the history takes the last step and gradient change
    (where their product is positive), and makes the direction (`_direction`)."""
    y = flat_grad.sub(prev_flat_grad)
    s = d.mul(t)
    ys = y.dot(s)
    stored = S.and_(S.and_(live, S.not_(first)), ys > 1e-10)  # (traced: also run at the first)
    hist.push(S, y, s, ys, stored)
    H_diag = S.where(stored, ys / S.safe(y.dot(y)), H_diag)  # the initial Hessian's scale
    return H_diag, _direction(S, hist, flat_grad, H_diag, S.and_(live, S.not_(first)))


def _first_direction(
    S: Any,
    hist: Any,
    flat_grad: Tensor,
    prev_flat_grad: Tensor,
    d: Tensor,
    t: Any,
    H_diag: Any,
    live: Any,
    first: Any,
) -> tuple[Any, Tensor]:
    """At the first iteration: the gradient's direction, and a unit Hessian scale."""
    return S.where(live, 1, H_diag), flat_grad.neg()


def _first_step_length(S: Any, flat_grad: Tensor, lr: Any) -> Any:
    return S.min(1.0, 1.0 / S.safe(flat_grad.abs().sum())) * lr


def _step_length(S: Any, flat_grad: Tensor, lr: Any) -> Any:
    return lr


def _run(
    S: Any,
    point: Any,
    st: _Step,
    loss: Any,
    flat_grad: Tensor,
    *,
    lr: Any,
    max_iter: int,
    max_eval: int,
    tolerance_grad: Any,
    tolerance_change: Any,
    line_search_fn: str | None,
    **_: Any,
) -> bool:
    """torch's ``LBFGS.step`` after its first evaluation (`loss`, `flat_grad`), on the
    entries of `st`, moving `point` (see `_Closure` and `_Position`). Returns whether it
    went past the first check (torch returns there, its state otherwise untouched)."""
    current_evals = 1
    st.func_evals = st.func_evals + 1
    opt_cond = flat_grad.abs().max() <= tolerance_grad
    live = S.not_(opt_cond)  # the step goes on (traced: per member of a batch)
    if S.stop(live):
        return False
    d, t, hist, H_diag = st.d, st.t, st.hist, st.H_diag
    prev_flat_grad, prev_loss = st.prev_flat_grad, st.prev_loss
    n_iter = 0
    for _ in S.rounds(max_iter):  # torch's `while n_iter < max_iter` (max_iter may be a float)
        live = S.and_(live, n_iter < max_iter)
        if S.stop(live):
            break
        n_iter = n_iter + S.count(live)
        st.n_iter = st.n_iter + S.count(live)
        first = st.n_iter == 1
        # -- the direction: the gradient's, or the L-BFGS one from the updated history
        hist.reset(S, S.and_(live, first))

        H_diag, d_new = S.cond(
            S.not_(first),
            _lbfgs_direction,
            _first_direction,
            S,
            hist,
            flat_grad,
            prev_flat_grad,
            d,
            t,
            H_diag,
            live,
            first,
        )
        d = S.where(live, d_new, d)
        prev_flat_grad = S.where(live, flat_grad, prev_flat_grad)
        prev_loss = S.where(live, loss, prev_loss)
        # -- the step length
        t_new = S.cond(first, _first_step_length, _step_length, S, flat_grad, lr)
        t = S.where(live, t_new, t)
        gtd = flat_grad.dot(d)  # the directional derivative
        live = S.and_(live, S.not_(gtd > -tolerance_change))
        if S.stop(live):
            break
        if line_search_fn is not None:
            if line_search_fn != "strong_wolfe":
                raise RuntimeError("only 'strong_wolfe' is supported")
            loss_new, grad_new, t_new, ls_func_evals = _strong_wolfe(
                S,
                point.searcher(d),
                t,
                d,
                loss,
                flat_grad,
                gtd,
                max_ls=max_eval - current_evals,
                rounds=max_eval - 1,
                live=live,
            )
            loss, flat_grad, t = (
                S.where(live, loss_new, loss),
                S.where(live, grad_new, flat_grad),
                S.where(live, t_new, t),
            )
            point.move(S, t, d, live)
            opt_cond = flat_grad.abs().max() <= tolerance_grad
        else:  # a fixed step, then the loss there, but in the last iteration
            point.move(S, t, d, live)
            again = S.and_(live, n_iter != max_iter)
            loss, flat_grad = point.evaluate(again, (loss, flat_grad))
            opt_cond = S.where(again, flat_grad.abs().max() <= tolerance_grad, opt_cond)
            ls_func_evals = S.count(again)
        current_evals = current_evals + ls_func_evals
        st.func_evals = st.func_evals + ls_func_evals
        # -- the conditions that end the step
        ended = S.or_(S.or_(n_iter == max_iter, current_evals >= max_eval), opt_cond)
        ended = S.or_(
            ended, S.or_(d.mul(t).abs().max() <= tolerance_change, abs(loss - prev_loss) < tolerance_change)
        )
        live = S.and_(live, S.not_(ended))
    st.d, st.t, st.hist, st.H_diag = d, t, hist, H_diag
    st.prev_flat_grad, st.prev_loss = prev_flat_grad, prev_loss
    return True


# -- flat vectors of params and gradients -----------------------------------------


def _flat_grad(grads: Sequence[Tensor | None], params: Sequence[Tensor]) -> Tensor:
    """The gradients as one flat vector, as torch's ``_gather_flat_grad``: a missing one
    as zeros, a sparse one densified, a complex one as pairs of reals."""
    views = []
    for p, g in zip(params, grads):
        if g is None:
            view = torch.zeros(p.numel(), dtype=p.dtype, device=p.device)
        elif g.is_sparse:
            view = g.to_dense().reshape(-1)
        else:
            view = g.reshape(-1)
        if torch.is_complex(view):
            view = torch.view_as_real(view).reshape(-1)
        views.append(view)
    return torch.cat(views, 0)


def _slices(flat: Tensor, params: Sequence[Tensor]) -> list[Tensor]:
    """`flat` cut into one piece per param, each shaped like the param (like its real
    view where it is complex)."""
    pieces, offset = [], 0
    for p in params:
        real = torch.view_as_real(p) if torch.is_complex(p) else p
        pieces.append(flat[offset : offset + real.numel()].view_as(real))
        offset += real.numel()
    if offset != flat.numel():
        raise AssertionError(f"Expected offset {offset} to equal {flat.numel()}")
    return pieces


# -- the class -------------------------------------------------------------------------


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
    p_all, treedef = _flatten(params)
    try:
        g_all = treedef.flatten_up_to(grads)
    except ValueError as e:
        raise ValueError(
            f"LBFGS update: grads does not have the structure of params ({e}). Pass the gradients "
            "of these params."
        ) from None
    rebuild = treedef.unflatten
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
    S: Any = _Traced if tracing() else _Eager
    if S is _Traced:
        for name in ("max_iter", "max_eval"):
            bound = hyperparams[name]
            if isinstance(bound, bool) or not isinstance(bound, int):
                raise TypeError(
                    f"LBFGS update: under torch.func transforms and torch.compile, {name} must be an "
                    f"int (the update runs that many rounds); got {bound!r}"
                )

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


class _Position:
    """The functional update's params, as new tensors, and its ``value_fn``."""

    def __init__(
        self, S: Any, params: list[Tensor], rebuild: Callable[[list[Tensor]], Any], value_fn: Any
    ) -> None:
        self.S, self.params, self.rebuild, self.value_fn = S, params, rebuild, value_fn

    def at(self, t: Any, d: Tensor) -> list[Tensor]:
        """The params moved by ``t * d``, each in its own dtype (torch's ``p.add_``)."""
        moved = []
        for p, piece in zip(self.params, _slices(d, self.params)):
            real = torch.view_as_real(p) if torch.is_complex(p) else p
            new = self.S.axpy(real, piece, t).to(real.dtype)
            moved.append(torch.view_as_complex(new) if torch.is_complex(p) else new)
        return moved

    def value_and_grad(self, params: list[Tensor]) -> tuple[Any, Tensor]:
        grads, value = torch.func.grad_and_value(lambda ps: self.value_fn(self.rebuild(ps)))(params)
        return self.S.number(value), _flat_grad(grads, params)

    def searcher(self, d: Tensor) -> Callable[[Any, Any, Any], tuple[Any, Tensor]]:
        return lambda t, run, old: self.S.cond(run, lambda: self.value_and_grad(self.at(t, d)), lambda: old)

    def move(self, S: Any, t: Any, d: Tensor, live: Any) -> None:
        moved = self.at(t, d)
        self.params = [S.where(live, new, p) for new, p in zip(moved, self.params)]

    def evaluate(self, run: Any, old: Any) -> tuple[Any, Tensor]:
        return self.S.cond(run, lambda: self.value_and_grad(self.params), lambda: old)
