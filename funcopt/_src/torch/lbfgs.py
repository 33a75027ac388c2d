"""`LBFGS`, torch's closure-based class, on the math of `algorithms/lbfgs.py` (its state and
`state_dict` torch's: Python lists of history tensors, Python numbers)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor
from torch.optim.optimizer import ParamsT, _to_scalar

from ..algorithms.lbfgs import _hyperparams
from ..algorithms.lbfgs_loop import _flat_grad, _Lists, _run, _slices, _Step
from ..algorithms.lbfgs_search import _Eager
from .fused import refuse


class _Closure:
    """The class's params, moved in place, and its closure (torch's evaluation)."""

    def __init__(self, opt: LBFGS, closure: Callable[[], Any]) -> None:
        self.opt, self.closure = opt, closure

    def searcher(self, d: Tensor) -> Callable[[Any, Any, Any], tuple[Any, Tensor]]:
        x_init = self.opt._clone_param()

        def evaluate(t: Any, run: Any, old: tuple[Any, Tensor]) -> tuple[Any, Tensor]:
            return self.opt._directional_evaluate(self.closure, x_init, t, d) if run else old

        return evaluate

    def move(self, S: Any, t: Any, d: Tensor, live: Any) -> None:
        self.opt._add_grad(t, d)

    def evaluate(self, run: Any, old: Any) -> tuple[Any, Tensor]:
        if not run:
            return old
        with torch.enable_grad():
            loss = self.closure()
        return float(loss), self.opt._gather_flat_grad()


class LBFGS(torch.optim.Optimizer):
    """Drop-in ``torch.optim.LBFGS``: same arguments, closure-based ``step``, state
    (kept with the first param, as torch keeps it: ``func_evals``, ``n_iter``, ``d``,
    ``t``, ``old_dirs``, ``old_stps``, ``ro``, ``H_diag``, ``prev_flat_grad``,
    ``prev_loss``, ``al``) and ``state_dict`` format, so checkpoints load both ways.
    It runs the math of `lbfgs`, operation for operation as torch's step.

    Args:
        params: the params to optimize, in one group (as torch, no per-group options).
        lr: learning rate (the initial step length of each line search).
        max_iter: iterations per ``step``.
        max_eval: evaluations of the closure per ``step`` (default ``max_iter * 5 // 4``).
        tolerance_grad: stop where the largest gradient entry is this small.
        tolerance_change: stop where the loss or the params change less.
        history_size: the number of past steps the Hessian approximation keeps.
        line_search_fn: ``"strong_wolfe"``, or None for fixed steps of length ``lr``.
    """

    def __init__(
        self,
        params: ParamsT,
        lr: float | Tensor = 1,
        max_iter: int = 20,
        max_eval: int | None = None,
        tolerance_grad: float = 1e-7,
        tolerance_change: float = 1e-9,
        history_size: int = 100,
        line_search_fn: str | None = None,
        *,
        fused: bool | None = None,
    ) -> None:
        refuse(
            "LBFGS",
            "its step calls the closure again and again, and reduces over all params (dot products, "
            "a line search) between its updates, so there is no per-element kernel to fuse",
            fused,
        )
        defaults = _hyperparams(
            lr,
            max_iter,
            max_eval,
            tolerance_grad,
            tolerance_change,
            history_size,
            line_search_fn,
            tensors=True,
        )
        super().__init__(params, defaults)
        if len(self.param_groups) != 1:
            raise ValueError("LBFGS doesn't support per-parameter options (parameter groups)")
        self._params = self.param_groups[0]["params"]
        self._numel_cache: int | None = None

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        # unpickled or deep-copied (torch's pickles neither, and then fails to step)
        self._params = self.param_groups[0]["params"]
        self._numel_cache = None

    def _numel(self) -> int:
        if self._numel_cache is None:
            self._numel_cache = sum(2 * p.numel() if torch.is_complex(p) else p.numel() for p in self._params)
        return self._numel_cache

    def _gather_flat_grad(self) -> Tensor:
        return _flat_grad([p.grad for p in self._params], self._params)

    def _add_grad(self, step_size: Any, update: Tensor) -> None:
        for p, piece in zip(self._params, _slices(update, self._params)):
            (torch.view_as_real(p) if torch.is_complex(p) else p).add_(piece, alpha=step_size)

    def _clone_param(self) -> list[Tensor]:
        return [p.clone(memory_format=torch.contiguous_format) for p in self._params]

    def _set_param(self, params_data: list[Tensor]) -> None:
        for p, pdata in zip(self._params, params_data, strict=True):
            p.copy_(pdata)

    def _directional_evaluate(
        self, closure: Callable[[], Any], x: list[Tensor], t: Any, d: Tensor
    ) -> tuple[float, Tensor]:
        self._add_grad(t, d)
        loss = float(closure())
        flat_grad = self._gather_flat_grad()
        self._set_param(x)
        return loss, flat_grad

    @torch.no_grad()
    def step(self, closure: Callable[[], Any]) -> Any:  # type: ignore[override]
        """Perform a single optimization step (up to ``max_iter`` iterations).

        Args:
            closure: a closure that reevaluates the model and returns the loss.
        """
        if len(self.param_groups) != 1:
            raise AssertionError(f"Expected exactly one param_group, but got {len(self.param_groups)}")
        closure = torch.enable_grad()(closure)  # the closure always runs with grad enabled
        group = self.param_groups[0]
        # LBFGS's state is global, kept with the first param (load_state_dict casts it there)
        state = self.state[self._params[0]]
        state.setdefault("func_evals", 0)
        state.setdefault("n_iter", 0)
        orig_loss = closure()
        entries = {
            k: state.get(k)
            for k in ("func_evals", "n_iter", "d", "t", "H_diag", "prev_flat_grad", "prev_loss")
        }
        st = _Step(**entries, hist=_Lists(state, group["history_size"]))
        try:
            went_on = _run(
                _Eager,
                _Closure(self, closure),
                st,
                float(orig_loss),
                self._gather_flat_grad(),
                **{**group, "lr": _to_scalar(group["lr"])},
            )
        finally:  # torch counts as it goes, also where a closure raises
            state["func_evals"], state["n_iter"] = st.func_evals, st.n_iter
        if went_on:
            state["d"], state["t"] = st.d, st.t
            state["old_dirs"], state["old_stps"], state["ro"] = st.hist.dirs, st.hist.stps, st.hist.ro
            state["H_diag"], state["prev_flat_grad"], state["prev_loss"] = (
                st.H_diag,
                st.prev_flat_grad,
                st.prev_loss,
            )
        return orig_loss
