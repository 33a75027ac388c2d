"""L-BFGS's loop, written once for the class and the functional update: the history of steps
and gradient changes (`_Lists` as torch keeps it, `_Buffers` of a fixed size), the two-loop
recursion, and one step (`_run`: directions, step lengths, the line search of
lbfgs_search.py). See lbfgs.py for the two ways it decides (`_Eager`, `_Traced`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from .lbfgs_search import _strong_wolfe


class _Lists:
    """torch's history: lists of tensors, oldest first, in a param's state dict (the
    class's) or made from a functional state's buffers."""

    def __init__(self, state: dict[str, Any], size: int) -> None:
        self.state = state
        self.size = size
        self.dirs: Any = state.get("old_dirs")  # None before the first iteration
        self.stps: Any = state.get("old_stps")
        self.ro: Any = state.get("ro")

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
        self.size = dirs.shape[0]

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


def _two_loop(
    q: Any,
    s: Any,
    y: Any,
    rho: Any,
    scale: Any,
    al: list[Any],
    *,
    dot: Callable[[Any, Any], Any],
    axpy: Callable[[Any, Any, Any], Any],
    mul: Callable[[Any, Any], Any],
    where: Callable[[Any, Any, Any], Any],
    used: Callable[[int], Any],
) -> Any:
    """The two-loop recursion (Nocedal and Wright, Algorithm 7.4), written once for
    torch's direction (`_direction`) and optax's (``scale_by_lbfgs``,
    catalogue/lbfgs_scaling.py): `q` times the inverse-Hessian approximation that the
    pairs ``s[i]``, ``y[i]``, ``rho[i] = 1 / <y[i], s[i]>`` (lists or stacked rows,
    oldest first) make from `scale` times the identity. The vector ops: ``dot(a, b)``,
    ``axpy(x, b, a)`` (``x + a * b``), ``mul(x, scale)``; a pair takes part where
    ``used(i)`` (``where`` picks). The coefficients are left in `al` (the old entry
    where a pair takes no part)."""
    for i in range(len(rho) - 1, -1, -1):
        use = used(i)
        al[i] = where(use, dot(s[i], q) * rho[i], al[i])
        q = where(use, axpy(q, y[i], -al[i]), q)
    r = mul(q, scale)
    for i in range(len(rho)):
        be_i = dot(y[i], r) * rho[i]
        r = where(used(i), axpy(r, s[i], al[i] - be_i), r)
    return r


def _direction(S: Any, history: Any, flat_grad: Tensor, H_diag: Any, run: Any) -> Tensor:
    """torch's two-loop recursion (`_two_loop` on the flat vectors): the gradient times
    the (negated) inverse-Hessian approximation that the history makes, with ``H_diag``
    as its initial scale. The coefficients ``al`` are left in ``history.al``, as torch
    leaves them in its state, where `run` (traced: the members of a batch that take
    this iteration)."""
    return _two_loop(
        flat_grad.neg(), history.stps, history.dirs, history.ro, H_diag, history.al,
        dot=torch.dot, axpy=S.axpy, mul=torch.mul, where=S.where,
        used=lambda i: S.and_(run, history.used(i)),
    )  # fmt: skip


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


def _new_direction(
    S: Any,
    hist: Any,
    flat_grad: Tensor,
    prev_flat_grad: Tensor,
    d: Tensor,
    t: Any,
    H_diag: Any,
    live: Any,
    first: Any,
    lr: Any,
) -> tuple[Tensor, Any, Any]:
    """One iteration's direction and step length, where `live`: the gradient's and a
    scaled lr at the first iteration (the history reset), the L-BFGS direction from the
    updated history and the lr after. Returns the direction, step length and Hessian scale."""
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
    t_new = S.cond(first, _first_step_length, _step_length, S, flat_grad, lr)
    return S.where(live, d_new, d), S.where(live, t_new, t), H_diag


def _move(
    S: Any,
    point: Any,
    line_search_fn: str | None,
    d: Tensor,
    t: Any,
    loss: Any,
    flat_grad: Tensor,
    gtd: Any,
    live: Any,
    opt_cond: Any,
    not_last: Any,
    *,
    max_ls: Any,
    rounds: int,
    tolerance_grad: Any,
) -> tuple[Any, Tensor, Any, Any, Any]:
    """One iteration's move of `point` along `d`, where `live`: by the strong-Wolfe line
    search (`_strong_wolfe`) from step length `t`, or by `t` itself, then the loss there
    unless it is the last iteration (`not_last` false). Returns the loss, flat gradient,
    step length and optimality condition there, and the number of evaluations."""
    if line_search_fn is not None:
        if line_search_fn != "strong_wolfe":
            raise RuntimeError("only 'strong_wolfe' is supported")
        loss_new, grad_new, t_new, ls_func_evals = _strong_wolfe(
            S, point.searcher(d), t, d, loss, flat_grad, gtd, max_ls=max_ls, rounds=rounds, live=live
        )
        loss, flat_grad, t = (
            S.where(live, loss_new, loss),
            S.where(live, grad_new, flat_grad),
            S.where(live, t_new, t),
        )
        point.move(S, t, d, live)
        return loss, flat_grad, t, flat_grad.abs().max() <= tolerance_grad, ls_func_evals
    point.move(S, t, d, live)
    again = S.and_(live, not_last)
    loss, flat_grad = point.evaluate(again, (loss, flat_grad))
    opt_cond = S.where(again, flat_grad.abs().max() <= tolerance_grad, opt_cond)
    return loss, flat_grad, t, opt_cond, S.count(again)


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
        d, t, H_diag = _new_direction(S, hist, flat_grad, prev_flat_grad, d, t, H_diag, live, first, lr)
        prev_flat_grad = S.where(live, flat_grad, prev_flat_grad)
        prev_loss = S.where(live, loss, prev_loss)
        gtd = flat_grad.dot(d)  # the directional derivative
        live = S.and_(live, S.not_(gtd > -tolerance_change))
        if S.stop(live):
            break
        loss, flat_grad, t, opt_cond, ls_func_evals = _move(
            S, point, line_search_fn, d, t, loss, flat_grad, gtd, live, opt_cond, n_iter != max_iter,
            max_ls=max_eval - current_evals, rounds=max_eval - 1, tolerance_grad=tolerance_grad,
        )  # fmt: skip
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
