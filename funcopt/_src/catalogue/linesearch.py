"""optax's backtracking line search (optax's names, arguments and math):
`scale_by_backtracking_linesearch`, with `value_and_grad_from_state`, and the helpers
that the zoom line search (`zoom_linesearch.py`) shares.

A line search scales the incoming updates (a direction ``u``) by a step size ``eta``
chosen by evaluating the objective at ``params + eta * u``. Its ``update`` takes optax's
keyword extra arguments: ``value`` (the loss at the params), ``grad`` (its gradient
there) and ``value_fn`` (the objective, ``value_fn(params, **data) -> loss``); any other
keyword argument that `value_fn` names (input data) is passed on to it. `chain` passes
them to every transformation, as optax's does.

optax's inner loop is a ``lax.while_loop``. Here it is a Python loop: in plain eager
mode it stops as soon as the search is done, reading its stopping condition (one host
sync per trial, as ``torch.optim.LBFGS``'s line search); under ``torch.func`` transforms
and ``torch.compile``, where no value can be read, it runs its largest number of rounds,
the rounds past the stopping point masked out (``torch.where``), for the same result at
the cost of the evaluations skipped otherwise."""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable
from typing import Any, NamedTuple

import optree
import torch
from torch import Tensor
from torch.func import grad as func_grad
from torch.func import grad_and_value, vjp

from ..core.base import GradientTransformation, MaskedNode, Params, State, Updates, tracing
from ..transforms.clipping import Scalar
from ._common import _check_state, check_params, device_of, pick, present, scalar, tree_sum

__all__ = [
    "BacktrackingLinesearchInfo",
    "ScaleByBacktrackingLinesearchState",
    "scale_by_backtracking_linesearch",
    "value_and_grad_from_state",
]

_INF = math.inf


# ------------------------------------------------------------------------ shared helpers


def value_dtype(params: Params) -> torch.dtype:
    """The real dtype of the first param (optax's ``val_dtype``): the dtype of a loss."""
    leaves = present(params)
    if not leaves:
        raise ValueError("a line search needs at least one param tensor")
    return leaves[0].real.dtype if leaves[0].is_complex() else leaves[0].dtype


def real_dot(a: Any, b: Any) -> Tensor:
    """The real inner product of two trees: ``sum(Re(conj(a) * b))`` over the present
    leaves (complex entries as pairs of reals; a None in either tree counts as zero).
    With torch's gradients this is the slope of ``eta -> f(w + eta * u)``."""
    pairs = optree.tree_flatten(a, none_is_leaf=True)[0], optree.tree_flatten(b, none_is_leaf=True)[0]
    terms = [
        (torch.view_as_real(x) * torch.view_as_real(y)).sum() if x.is_complex() else (x * y).sum()
        for x, y in zip(*pairs)
        if isinstance(x, Tensor) and isinstance(y, Tensor)
    ]
    return tree_sum(terms)


def add_scale(params: Params, eta: Tensor, updates: Updates) -> Params:
    """``params + eta * updates`` (optax's ``tree.add_scale``); a None update leaves its
    param as it is."""
    return optree.tree_map(
        lambda p, u: p if u is None else p + eta.to(p.real.dtype) * u, params, updates, none_is_leaf=True
    )


def scale_tree(eta: Tensor, updates: Updates) -> Updates:
    """``eta * updates`` (a None update stays None)."""
    return optree.tree_map(
        lambda u: None if u is None else eta.to(u.real.dtype) * u, updates, none_is_leaf=True
    )


def objective(
    who: str, value: Any, grad: Any, value_fn: Any, extra_args: dict[str, Any]
) -> Callable[..., Any]:
    """`value_fn` with the extra arguments that it names bound (optax's
    ``_extract_fns_kwargs``; one that takes ``**kwargs`` gets them all), after checking
    that the three extra arguments are there and that no other one goes unused."""
    missing = [name for name, x in (("value", value), ("grad", grad), ("value_fn", value_fn)) if x is None]
    if missing:
        raise ValueError(
            f"{who} needs the extra arguments {', '.join(missing)}: call update(updates, state, params, "
            "value=loss, grad=grads, value_fn=fn), where fn(params, **data) returns the loss and value, grads "
            "are its value and gradient at params (fo.value_and_grad_from_state(fn) reuses those that the "
            "search computed). fo.Optimizer's step(closure) passes only value=: use the functional API, or "
            "fo.LBFGS(line_search_fn='strong_wolfe') for torch's line search"
        )
    if not callable(value_fn):
        raise TypeError(
            f"{who}: value_fn must be a function of the params returning the loss, got {value_fn!r}"
        )
    try:
        parameters = inspect.signature(value_fn).parameters
    except (TypeError, ValueError):  # no signature to read (a builtin): pass everything on
        return functools.partial(value_fn, **extra_args)
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    fn_kwargs = {k: v for k, v in extra_args.items() if takes_any or k in parameters}
    unused = sorted(set(extra_args) - set(fn_kwargs))
    if unused:
        raise TypeError(
            f"{who}: unexpected keyword arguments {unused}, which value_fn does not take; pass only the "
            "extra arguments (data) that value_fn accepts"
        )
    return functools.partial(value_fn, **fn_kwargs) if fn_kwargs else value_fn


def loss_of(fn: Callable[..., Any], params: Params, dtype: torch.dtype, device: torch.device) -> Tensor:
    """``fn(params)`` as a 0-d tensor of `dtype`."""
    return scalar(fn(params), dtype, device).reshape(())


def search(
    cond: Callable[[Any], Tensor], body: Callable[[Any], Any], state: Any, rounds: int, who: str, bound: str
) -> Any:
    """optax's ``lax.while_loop(cond, body, state)``: a Python loop that reads `cond` in
    eager mode, `rounds` masked rounds where nothing may be read (see the module's doc)."""
    if not tracing():
        while bool(cond(state)):
            state = body(state)
        return state
    if isinstance(rounds, bool) or not isinstance(rounds, int):
        raise TypeError(
            f"{who}: under torch.func transforms and torch.compile, {bound} must be an int (the search "
            f"runs that many rounds); got {rounds!r}"
        )
    for _ in range(rounds):
        state = pick(cond(state), body(state), state)
    return state


def zeros_like_tree(params: Params) -> Params:
    return optree.tree_map(lambda p: torch.zeros_like(p), params)


def as_grad(grad: Any, params: Params) -> Any:
    """The `grad` extra argument with zeros for a None leaf (a param without gradient)."""
    return optree.tree_map(
        lambda g, p: torch.zeros_like(p) if g is None else g, grad, params, none_is_leaf=True
    )


# ------------------------------------------------------------------------ backtracking


class BacktrackingLinesearchInfo(NamedTuple):
    """The number of trials of the last search, and its final decrease error (0 where
    the sufficient decrease was met)."""

    num_linesearch_steps: Tensor
    decrease_error: Tensor


class ScaleByBacktrackingLinesearchState(NamedTuple):
    """The step size found last, the loss there, its gradient there (with
    ``store_grad=True``; else `MaskedNode`, optax's None) and `info`."""

    learning_rate: Tensor
    value: Tensor
    grad: Any
    info: BacktrackingLinesearchInfo


torch.serialization.add_safe_globals(
    [BacktrackingLinesearchInfo, ScaleByBacktrackingLinesearchState]
)  # loads with torch.load(weights_only=True)


class _Trial(NamedTuple):
    learning_rate: Tensor
    new_value: Tensor
    decrease_error: Tensor
    iter_num: Tensor


def _backtracking_init(store_grad: bool, params: Params) -> ScaleByBacktrackingLinesearchState:
    dtype, device = value_dtype(params), device_of(params)
    number = functools.partial(torch.tensor, dtype=dtype, device=device)
    return ScaleByBacktrackingLinesearchState(
        learning_rate=number(1.0),
        value=number(_INF),
        grad=zeros_like_tree(params) if store_grad else MaskedNode(),
        info=BacktrackingLinesearchInfo(torch.zeros((), dtype=torch.int32, device=device), number(_INF)),
    )


def _backtracking_update(
    hp: dict[str, Any],
    updates: Updates, state: State, params: Params | None = None,
    *, value: Any = None, grad: Any = None, value_fn: Any = None, **extra_args: Any,
) -> tuple[Updates, State]:  # fmt: skip
    who = "scale_by_backtracking_linesearch update"
    _check_state(state, ScaleByBacktrackingLinesearchState, who)
    check_params(who, params)
    fn = objective(who, value, grad, value_fn, extra_args)
    dtype, device = state.learning_rate.dtype, state.learning_rate.device
    value = scalar(value, dtype, device).reshape(())  # the loss at the params
    slope = real_dot(updates, grad).to(dtype)  # of eta -> f(params + eta * updates) at 0
    max_steps, atol = hp["max_backtracking_steps"], hp["atol"]

    def decrease_error(eta: Tensor, new_value: Tensor) -> Tensor:
        error = new_value - (1.0 + hp["rtol"]) * value - eta * hp["slope_rtol"] * slope
        return torch.clamp_min(torch.where(torch.isnan(error), _INF, error), 0.0)

    def cond(t: _Trial) -> Tensor:
        return ~(t.decrease_error <= atol) & (t.iter_num <= max_steps)

    pullback: list[Any] = []  # eager, store_grad: the last trial's vjp (optax's linearize)

    def body(t: _Trial) -> _Trial:
        # the first trial takes the guess, each later one decreases it
        eta = torch.where(t.iter_num > 0, hp["decrease_factor"] * t.learning_rate, t.learning_rate)
        new_params = add_scale(params, eta, updates)
        if hp["store_grad"] and not tracing():
            new_value, back = vjp(lambda p: loss_of(fn, p, dtype, device), new_params)[:2]
            pullback[:] = [back]
        else:
            new_value = loss_of(fn, new_params, dtype, device)
        return _Trial(eta, new_value, decrease_error(eta, new_value), t.iter_num + 1)

    guess = torch.minimum(
        hp["increase_factor"] * state.learning_rate, scalar(hp["max_learning_rate"], dtype, device)
    )
    start = _Trial(
        guess, value, torch.tensor(_INF, dtype=dtype, device=device), torch.zeros_like(state.info[0])
    )
    last = search(cond, body, start, max_steps + 1, who, "max_backtracking_steps")
    new_grad: Any = state.grad
    if pullback:  # the gradient at the last point tried, for the next round (value_and_grad_from_state)
        new_grad = pullback[0](torch.ones((), dtype=dtype, device=device))[0]
    elif hp["store_grad"]:  # traced: the gradient there, computed anew
        new_grad = func_grad(lambda p: loss_of(fn, p, dtype, device))(
            add_scale(params, last.learning_rate, updates)
        )
    new_grad = optree.tree_map(lambda g, old: g.to(old.dtype), new_grad, state.grad)
    # no step at all where every trial gave inf or nan
    eta = torch.where(torch.isinf(last.decrease_error), 0.0, last.learning_rate)
    info = BacktrackingLinesearchInfo(last.iter_num.to(torch.int32), last.decrease_error)
    return scale_tree(eta, updates), ScaleByBacktrackingLinesearchState(eta, last.new_value, new_grad, info)


def scale_by_backtracking_linesearch(
    max_backtracking_steps: int,
    slope_rtol: Scalar = 1e-4,
    decrease_factor: Scalar = 0.8,
    increase_factor: Scalar = 1.5,
    max_learning_rate: Scalar = 1.0,
    atol: Scalar = 0.0,
    rtol: Scalar = 0.0,
    store_grad: bool = False,
    verbose: bool = False,
) -> GradientTransformation:
    """Backtracking line search for a sufficient decrease (Armijo), optax's
    ``scale_by_backtracking_linesearch``: scales the updates ``u`` by the first step size
    ``eta`` of ``g, g * decrease_factor, g * decrease_factor**2, ...`` (at most
    `max_backtracking_steps` decreases; the guess ``g`` is the last step size times
    `increase_factor`, at most `max_learning_rate`) for which
    ``f(w + eta u) <= (1 + rtol) f(w) + eta * slope_rtol * <u, grad f(w)> + atol``.
    Where no trial gives a finite loss, the step size is 0.

    ``update(updates, state, params, value=loss, grad=grads, value_fn=fn, **data)``:
    `fn(params, **data)` returns the loss (a 0-d tensor); `value` and `grad` are its value
    and gradient at `params`. With ``store_grad=True`` the state also keeps the gradient
    at the point accepted, which `value_and_grad_from_state` hands to the next step. The
    updates must be a descent direction (``<u, grad> < 0``: plain ``sgd``, not Adam).
    `verbose` (optax's debug printing) is accepted and prints nothing.

    Example:
        >>> import torch, funcopt as fo
        >>> fn = lambda p: (p["x"] ** 2).sum()
        >>> tx = fo.chain(fo.sgd(lr=1.0), fo.scale_by_backtracking_linesearch(15, store_grad=True))
        >>> params = {"x": torch.tensor([1.0, 2.0, 3.0])}
        >>> state = tx.init(params)
        >>> value_and_grad = fo.value_and_grad_from_state(fn)
        >>> for _ in range(3):
        ...     value, grad = value_and_grad(params, state=state)
        ...     updates, state = tx.update(grad, state, params, value=value, grad=grad, value_fn=fn)
        ...     params = fo.apply_updates(params, updates)
        >>> round(float(fn(params)), 4)
        0.6532
    """
    if isinstance(max_backtracking_steps, bool) or not isinstance(max_backtracking_steps, int):
        raise TypeError(
            f"scale_by_backtracking_linesearch: max_backtracking_steps must be an int, got {max_backtracking_steps!r}"
        )
    if max_backtracking_steps < 0:
        raise ValueError(
            f"scale_by_backtracking_linesearch: max_backtracking_steps must be >= 0, got {max_backtracking_steps}"
        )
    hp: dict[str, Any] = dict(
        max_backtracking_steps=max_backtracking_steps, slope_rtol=slope_rtol, decrease_factor=decrease_factor,
        increase_factor=increase_factor, max_learning_rate=max_learning_rate, atol=atol, rtol=rtol,
        store_grad=bool(store_grad),
    )  # fmt: skip
    return GradientTransformation(
        functools.partial(_backtracking_init, hp["store_grad"]), functools.partial(_backtracking_update, hp)
    )


# ------------------------------------------------------------------------ reusing the search's value and grad


def _find(tree: Any, key: str, found: list[Any]) -> None:
    """The values of the NamedTuple fields and dict entries named `key` in `tree`."""
    if isinstance(tree, tuple) and hasattr(tree, "_fields"):
        items: Any = zip(tree._fields, tree)
    elif isinstance(tree, dict):
        items = tree.items()
    elif isinstance(tree, (tuple, list)):
        items = ((None, x) for x in tree)
    else:
        return
    for name, x in items:
        if name == key:
            found.append(x)
        else:
            _find(x, key, found)


def _one(state: Any, key: str) -> Any:
    found: list[Any] = []
    _find(state, key, found)
    if len(found) > 1:
        raise KeyError(
            f"value_and_grad_from_state: the state holds {len(found)} entries named {key!r}; expected one"
        )
    if not found or not optree.tree_leaves(found[0]):  # none, or a MaskedNode (store_grad=False)
        raise ValueError(
            f"value_and_grad_from_state: no {key!r} found in the state. Chain a line search that keeps it "
            "(scale_by_zoom_linesearch, or scale_by_backtracking_linesearch with store_grad=True)"
        )
    return found[0]


def value_and_grad_from_state(value_fn: Callable[..., Any]) -> Callable[..., tuple[Any, Any]]:
    """optax's ``value_and_grad_from_state``: a function ``(params, *args, state,
    **kwargs) -> (value, grad)`` that returns the loss and gradient which the line search
    in `state` computed at its accepted point (the params of the next step), and computes
    them with ``torch.func.grad_and_value(value_fn)`` where the state holds none yet (an
    infinite or nan value: the first step). For a deterministic objective it saves one
    evaluation per step. In eager mode it reads whether the value is finite; under
    ``torch.func`` transforms and ``torch.compile`` it computes both and picks."""

    def value_and_grad(params: Params, *fn_args: Any, state: State, **fn_kwargs: Any) -> tuple[Any, Any]:
        value, grad = _one(state, "value"), _one(state, "grad")
        stored = torch.isfinite(value)

        def fresh() -> tuple[Tensor, Any]:
            g, v = grad_and_value(lambda p: value_fn(p, *fn_args, **fn_kwargs))(params)
            return v, g

        if not tracing():
            return (value, grad) if bool(stored) else fresh()
        return pick(stored, (value, grad), fresh())

    return value_and_grad
