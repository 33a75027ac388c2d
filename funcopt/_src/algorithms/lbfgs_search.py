"""L-BFGS's two ways to decide (`_Eager` as torch's step, `_Traced` for tracers and torch.func
transforms; see lbfgs.py) and its strong-Wolfe line search, written once against them."""

from __future__ import annotations

import builtins
import itertools
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import Tensor


class _Eager:
    """torch's control flow: conditions read in Python, torch's types kept."""

    @staticmethod
    def stop(live: Any) -> bool:
        """Whether a loop ends here: nothing is left running."""
        return not live

    @staticmethod
    def rounds(most: int) -> Iterable[int]:
        """A loop's rounds: as many as it takes (it stops by itself)."""
        return itertools.count()

    @staticmethod
    def where(condition: Any, a: Any, b: Any) -> Any:
        return a if condition else b

    @staticmethod
    def cond(condition: Any, if_true: Callable[..., Any], if_false: Callable[..., Any], *args: Any) -> Any:
        """The branch that `condition` takes, and only that one, on `args`."""
        return if_true(*args) if condition else if_false(*args)

    @staticmethod
    def and_(a: Any, b: Any) -> Any:
        return a and b

    @staticmethod
    def or_(a: Any, b: Any) -> Any:
        return a or b

    @staticmethod
    def not_(a: Any) -> bool:
        return not a

    min = staticmethod(builtins.min)
    max = staticmethod(builtins.max)

    @staticmethod
    def number(x: Any) -> Any:
        """A loss as torch reads it: a Python float (no graph to keep: detached first,
        which spares the warning torch gives for a tensor that requires grad)."""
        return float(x.detach()) if isinstance(x, Tensor) else float(x)

    @staticmethod
    def count(condition: Any) -> int:
        return 1 if condition else 0

    @staticmethod
    def safe(x: Any) -> Any:
        """A divisor (never guarded: the branch that divides by it is the one taken)."""
        return x

    @staticmethod
    def sqrt(x: Tensor, real: Any) -> Tensor:
        return x.sqrt()

    @staticmethod
    def axpy(x: Tensor, y: Tensor, a: Any) -> Tensor:
        """``x + a * y`` as torch's ``x.add_(y, alpha=a)`` computes it (``a`` read as a
        number), or with ``a`` as a tensor where autograd records it."""
        if isinstance(a, Tensor) and a.requires_grad and torch.is_grad_enabled():
            return x + a.to(x.dtype) * y
        return torch.add(x, y, alpha=a)


def _bool(x: Any) -> Tensor:
    return x if isinstance(x, Tensor) else torch.tensor(bool(x))


class _Traced:
    """Branch-free: both sides computed, ``torch.where`` picks; loops run all rounds."""

    @staticmethod
    def stop(live: Any) -> bool:
        return False

    @staticmethod
    def rounds(most: int) -> Iterable[int]:
        return range(most)

    @staticmethod
    def where(condition: Any, a: Any, b: Any) -> Any:
        if isinstance(a, tuple):
            return tuple(_Traced.where(condition, x, y) for x, y in zip(a, b))
        return torch.where(_bool(condition), a, b)

    @staticmethod
    def cond(condition: Any, if_true: Callable[..., Any], if_false: Callable[..., Any], *args: Any) -> Any:
        return _Traced.where(condition, if_true(*args), if_false(*args))

    @staticmethod
    def and_(a: Any, b: Any) -> Tensor:
        return torch.logical_and(_bool(a), _bool(b))

    @staticmethod
    def or_(a: Any, b: Any) -> Tensor:
        return torch.logical_or(_bool(a), _bool(b))

    @staticmethod
    def not_(a: Any) -> Tensor:
        return torch.logical_not(_bool(a))

    @staticmethod
    def min(a: Any, b: Any) -> Any:
        return torch.where(_bool(b < a), b, a)  # Python's min(a, b), NaN included

    @staticmethod
    def max(a: Any, b: Any) -> Any:
        return torch.where(_bool(b > a), b, a)

    @staticmethod
    def number(x: Tensor) -> Tensor:
        return x.to(torch.float64)

    @staticmethod
    def count(condition: Any) -> Tensor:
        return _bool(condition).long()

    @staticmethod
    def safe(x: Any) -> Any:
        """A divisor, 1 where it is 0: a quotient computed for the branch not taken is
        then finite, and so is its (zero) share of a gradient through ``torch.where``."""
        return torch.where(_bool(x == 0), 1, x)

    @staticmethod
    def sqrt(x: Tensor, real: Any) -> Tensor:
        return torch.where(_bool(real), x, 1).sqrt()  # likewise for the negative side

    @staticmethod
    def axpy(x: Tensor, y: Tensor, a: Any) -> Tensor:
        if isinstance(a, Tensor):
            a = a.to(x.dtype)
        return x + a * y


def _cubic_interpolate(
    S: Any, x1: Any, f1: Any, g1: Any, x2: Any, f2: Any, g2: Any, bounds: tuple[Any, Any] | None = None
) -> Any:
    """The minimizer of the cubic through two points with their values and slopes, kept
    within `bounds` (default: between the points); their midpoint where it has none
    (torch's ``_cubic_interpolate``, from minFunc's polyinterp)."""
    if bounds is not None:
        xmin_bound, xmax_bound = bounds
    else:
        ordered = x1 <= x2
        xmin_bound, xmax_bound = S.where(ordered, x1, x2), S.where(ordered, x2, x1)
    d1 = g1 + g2 - 3 * (f1 - f2) / S.safe(x1 - x2)
    d2_square = d1**2 - g1 * g2
    real = d2_square >= 0

    def minimum() -> Any:
        d2 = S.sqrt(d2_square, real)
        min_pos = S.cond(
            x1 <= x2,
            lambda: x2 - (x2 - x1) * ((g2 + d2 - d1) / S.safe(g2 - g1 + 2 * d2)),
            lambda: x1 - (x1 - x2) * ((g1 + d2 - d1) / S.safe(g1 - g2 + 2 * d2)),
        )
        return S.min(S.max(min_pos, xmin_bound), xmax_bound)

    return S.cond(real, minimum, lambda: (xmin_bound + xmax_bound) / 2.0)


def _zoom_trial(
    S: Any, t: Any, insuf_progress: Any, b0: Any, bf0: Any, bgtd0: Any, b1: Any, bf1: Any, bgtd1: Any
) -> tuple[Any, Any]:
    """The zoom phase's next step length, and whether it made too little progress: the
    cubic's minimizer in the bracket, moved 0.1 of the bracket inside where it lies near
    an end and progress was too little (or it lies at or past an end)."""
    tz = _cubic_interpolate(S, b0, bf0, bgtd0, b1, bf1, bgtd1)
    high, low = S.max(b0, b1), S.min(b0, b1)
    eps = 0.1 * (high - low)
    near = S.min(high - tz, tz - low) < eps
    at_end = S.or_(insuf_progress, S.or_(tz >= high, tz <= low))
    inside = S.where(abs(tz - high) < abs(tz - low), high - eps, low + eps)
    return S.where(S.and_(near, at_end), inside, tz), S.and_(near, S.not_(at_end))


def _bracket_trial(S: Any, t: Any, t_prev: Any, f_prev: Any, gtd_prev: Any, f_new: Any, gtd_new: Any) -> Any:
    """The bracketing phase's next step length: the cubic's minimizer through the last
    two points, between 1.01 and 10 times the last step."""
    min_step = t + 0.01 * (t - t_prev)
    max_step = t * 10
    return _cubic_interpolate(S, t_prev, f_prev, gtd_prev, t, f_new, gtd_new, bounds=(min_step, max_step))


def _no_zoom(S: Any, t: Any, insuf_progress: Any, *bracket: Any) -> tuple[Any, Any]:
    """`_zoom_trial` where the zoom phase is not running: nothing changes."""
    return t, insuf_progress


def _no_bracketing(S: Any, t: Any, *points: Any) -> Any:
    """`_bracket_trial` where the bracketing phase is not running: nothing changes."""
    return t


def _take(
    S: Any, low1: Any, higher: Any, lower: Any, flip: Any, end0: Any, end1: Any, new: Any
) -> tuple[Any, Any]:
    """The zoom phase's bracket ends after a new point (`new`): it replaces the high end
    where its loss is not lower (`higher`), else the low end, the old low end becoming
    the high end where the slope says so (`flip`)."""
    low, high = S.where(low1, end1, end0), S.where(low1, end0, end1)
    high = S.where(higher, new, S.where(flip, low, high))
    low = S.where(lower, new, low)
    return S.where(low1, high, low), S.where(low1, low, high)


def _bracket_checks(
    S: Any,
    bracketing: Any,
    ls_iter: Any,
    max_ls: Any,
    t: Any,
    f: Any,
    gtd: Any,
    f_prev: Any,
    f_new: Any,
    gtd_new: Any,
    c1: float,
    c2: float,
) -> tuple[Any, Any, Any, Any]:
    """The bracketing phase's tests of its new point (at step length `t`), where it runs:
    whether it is out of evaluations, else (`checking`) whether the point and the one
    before make a bracket (`pair`: the loss is not lower enough, or the slope no longer
    descends), or the point alone meets the strong Wolfe conditions (`single`)."""
    out_of_evals = S.and_(bracketing, ls_iter >= max_ls)
    checking = S.and_(bracketing, S.not_(out_of_evals))
    not_lower = S.or_(f_new > (f + c1 * t * gtd), S.and_(ls_iter > 1, f_new >= f_prev))
    wolfe = abs(gtd_new) <= -c2 * gtd
    pair = S.and_(checking, S.or_(not_lower, S.and_(S.not_(wolfe), gtd_new >= 0)))
    single = S.and_(checking, S.and_(S.not_(not_lower), wolfe))  # [t]: done
    return out_of_evals, checking, pair, single


def _zoom_take(
    S: Any,
    zooming: Any,
    done: Any,
    low1: Any,
    ends: tuple[Any, ...],
    t: Any,
    f_new: Any,
    g_new: Tensor,
    gtd_new: Any,
    f: Any,
    gtd: Any,
    c1: float,
    c2: float,
) -> tuple[Any, Any, tuple[Any, ...]]:
    """The zoom phase's bracket after its new point (at step length `t`), where it runs:
    the point replaces the high end where its loss is not lower enough, else the low end
    (`_take`). `ends` and the result are the bracket's ends ``(b0, bf0, bg0, bgtd0, b1,
    bf1, bg1, bgtd1)``: step length, loss, gradient and slope of each. Returns whether the
    search is done (the point meets the strong Wolfe conditions), the new `low1`, and the
    ends."""
    b0, bf0, bg0, bgtd0, b1, bf1, bg1, bgtd1 = ends
    f_low = S.where(low1, bf1, bf0)
    higher = S.and_(zooming, S.or_(f_new > (f + c1 * t * gtd), f_new >= f_low))
    lower = S.and_(zooming, S.not_(higher))
    wolfe = abs(gtd_new) <= -c2 * gtd
    done = S.or_(done, S.and_(lower, wolfe))
    b_high, b_low = S.where(low1, b0, b1), S.where(low1, b1, b0)
    # the old low end becomes the high end
    flip = S.and_(lower, S.and_(S.not_(wolfe), gtd_new * (b_high - b_low) >= 0))

    moves = (S, low1, higher, lower, flip)
    b0, b1 = _take(*moves, b0, b1, t)
    bf0, bf1 = _take(*moves, bf0, bf1, f_new)
    bg0, bg1 = _take(*moves, bg0, bg1, g_new)
    bgtd0, bgtd1 = _take(*moves, bgtd0, bgtd1, gtd_new)
    low1 = S.where(higher, S.not_(bf0 <= bf1), low1)
    return done, low1, (b0, bf0, bg0, bgtd0, b1, bf1, bg1, bgtd1)


def _bracket_made(S: Any, why: tuple[Any, Any, Any], start: tuple[Any, Any, Tensor],
                  prev: tuple[Any, ...], new: tuple[Any, ...], ends: tuple[Any, ...]) -> tuple[Any, ...]:  # fmt: skip
    """The bracket's ends where the bracketing phase makes it this round (torch's
    ``bracket = [...]``): from the start and the newest point where out of evaluations,
    the previous and the newest point where a pair holds the step (`pair`), the newest
    alone where it meets the strong Wolfe conditions (`single`); else as they were."""
    out_of_evals, pair, single = why
    b0, bf0, bg0, bgtd0, b1, bf1, bg1, bgtd1 = ends
    entering = S.or_(out_of_evals, S.or_(pair, single))
    ends0 = [
        S.where(out_of_evals, s0, S.where(pair, p0, S.where(single, n0, e0)))
        for s0, p0, n0, e0 in zip(start, prev, new, (b0, bf0, bg0))
    ]
    bgtd0 = S.where(pair, prev[3], S.where(single, new[3], bgtd0))
    t, f_new, g_new, gtd_new = new
    b1, bf1, bg1 = S.where(entering, t, b1), S.where(entering, f_new, bf1), S.where(entering, g_new, bg1)
    bgtd1 = S.where(S.or_(pair, single), gtd_new, bgtd1)
    return (*ends0, bgtd0, b1, bf1, bg1, bgtd1)


def _strong_wolfe(
    S: Any,
    evaluate: Callable[[Any, Any, tuple[Any, Tensor]], tuple[Any, Tensor]],
    t: Any,
    d: Tensor,
    f: Any,
    g: Tensor,
    gtd: Any,
    *,
    max_ls: Any,
    rounds: int,
    live: Any,
    c1: float = 1e-4,
    c2: float = 0.9,
    tolerance_change: float = 1e-9,
) -> tuple[Any, Tensor, Any, Any]:
    """torch's ``_strong_wolfe`` (from minFunc's lswolfe): a step length along `d` that
    meets the strong Wolfe conditions, from the loss `f`, gradient `g` and slope `gtd`
    at the start. ``evaluate(t, run, old)`` gives the loss and flat gradient at step
    length ``t`` (``old`` where ``run`` is false). A bracketing phase looks for an
    interval that holds such a step, a zoom phase narrows it, with at most `max_ls`
    evaluations after the first. Each round here is one evaluation: a round of the
    bracketing phase, or of the zoom (which may begin in the round the bracketing phase
    ends); `rounds` bounds them where no loop may stop early (`_Traced`). Returns the
    loss, gradient and step length found, and the number of evaluations."""
    d_norm = d.abs().max()
    f_new, g_new = evaluate(t, live, (f, g))
    ls_func_evals = S.count(live)
    gtd_new = g_new.dot(d)
    t_prev, f_prev, g_prev, gtd_prev = 0, f, g, gtd
    ls_iter = 0
    # the bracket's two ends (b0 and b1, their losses, gradients and slopes), set as the
    # bracketing phase ends; low1: whether end 1 has the lower loss (torch's low_pos)
    b0, b1, bf0, bf1, bg0, bg1, bgtd0, bgtd1 = t, t, f_new, f_new, g_new, g_new, gtd_new, gtd_new
    bracketing, zooming, done, insuf_progress, low1 = live, S.and_(live, False), False, False, False
    for _ in S.rounds(rounds):
        if S.stop(S.or_(bracketing, zooming)):
            break
        # -- the bracketing phase: its loop ran out, or a condition makes the bracket
        out_of_evals, checking, pair, single = _bracket_checks(
            S, bracketing, ls_iter, max_ls, t, f, gtd, f_prev, f_new, gtd_new, c1, c2
        )
        entering = S.or_(out_of_evals, S.or_(pair, single))
        b0, bf0, bg0, bgtd0, b1, bf1, bg1, bgtd1 = _bracket_made(
            S, (out_of_evals, pair, single), (0, f, g), (t_prev, f_prev, g_prev, gtd_prev),
            (t, f_new, g_new, gtd_new), (b0, bf0, bg0, bgtd0, b1, bf1, bg1, bgtd1),
        )  # fmt: skip
        done = S.or_(done, single)
        bracketing = S.and_(checking, S.not_(S.or_(pair, single)))
        zooming = S.or_(zooming, entering)
        insuf_progress = S.where(entering, False, insuf_progress)
        low1 = S.where(entering, S.not_(bf0 <= bf1), low1)
        # -- the zoom phase: it stops when done, out of evaluations, or the bracket is tiny
        small = abs(b1 - b0) * d_norm < tolerance_change
        zooming = S.and_(zooming, S.not_(S.or_(S.or_(done, ls_iter >= max_ls), small)))

        bracket = (b0, bf0, bgtd0, b1, bf1, bgtd1)
        tz, insuf_progress = S.cond(zooming, _zoom_trial, _no_zoom, S, t, insuf_progress, *bracket)
        tb = S.cond(
            bracketing, _bracket_trial, _no_bracketing, S, t, t_prev, f_prev, gtd_prev, f_new, gtd_new
        )
        t_prev, f_prev = S.where(bracketing, t, t_prev), S.where(bracketing, f_new, f_prev)
        g_prev, gtd_prev = S.where(bracketing, g_new, g_prev), S.where(bracketing, gtd_new, gtd_prev)
        run = S.or_(bracketing, zooming)
        t = S.where(bracketing, tb, tz)
        f_new, g_new = evaluate(t, run, (f_new, g_new))
        ls_func_evals = ls_func_evals + S.count(run)
        gtd_new = S.where(run, g_new.dot(d), gtd_new)
        ls_iter = ls_iter + S.count(run)
        # -- the zoom phase takes the new point into its bracket
        done, low1, (b0, bf0, bg0, bgtd0, b1, bf1, bg1, bgtd1) = _zoom_take(
            S, zooming, done, low1, (b0, bf0, bg0, bgtd0, b1, bf1, bg1, bgtd1), t, f_new, g_new, gtd_new,
            f, gtd, c1, c2,
        )  # fmt: skip
    # out of rounds still bracketing (`_Traced` only): out of evaluations, as torch's loop
    b0, bf0, bg0, bgtd0, b1, bf1, bg1, bgtd1 = _bracket_made(
        S, (bracketing, False, False), (0, f, g), (t_prev, f_prev, g_prev, gtd_prev),
        (t, f_new, g_new, gtd_new), (b0, bf0, bg0, bgtd0, b1, bf1, bg1, bgtd1),
    )  # fmt: skip
    low1 = S.where(bracketing, S.not_(bf0 <= bf1), low1)
    return S.where(low1, bf1, bf0), S.where(low1, bg1, bg0), S.where(low1, b1, b0), ls_func_evals
