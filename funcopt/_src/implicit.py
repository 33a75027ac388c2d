"""Implicit differentiation of a solver's solution (jaxopt's ``custom_root`` and
``custom_fixed_point``).

A solution ``x*(theta)`` defined by ``F(x*, theta) = 0`` has, by the implicit function
theorem, ``dx*/dtheta = -(dF/dx)^-1 dF/dtheta``. The backward pass of a vector ``g``
therefore solves the adjoint system ``(dF/dx)^T u = g`` with a linear solver (products
with ``(dF/dx)^T`` by ``torch.func.vjp``) and returns ``-u^T dF/dtheta``: the solver's
own iterations are never differentiated, so memory does not grow with them.

The solution is an ``autograd.Function`` with ``setup_context`` and
``generate_vmap_rule=True``, so it is differentiable by ``.backward()``,
``torch.autograd.grad`` and ``torch.func`` (``grad``, ``vjp``, ``jacrev``) alike, and
runs under ``vmap`` (the linear solvers of `funcopt.linear_solve` run a fixed number of
iterations, which ``vmap`` needs).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import optree
import torch
from torch import Tensor

from .linear_solve import LinearSolve, normal_cg

Solver = Callable[..., Any]


def _differentiable(x: Any) -> bool:
    return isinstance(x, Tensor) and (x.is_floating_point() or x.is_complex())


class _Solution(torch.autograd.Function):
    """Inputs: the problem (non-tensors), the init leaves, then theta's tensor leaves;
    outputs: the solution's leaves."""

    generate_vmap_rule = True

    @staticmethod
    def forward(problem: _Problem, n_init: int, *leaves: Tensor) -> tuple[Tensor, ...]:
        init, theta = problem.unflatten(leaves[:n_init], leaves[n_init:])
        solution = problem.solver(init, *theta)
        out, spec = optree.tree_flatten(solution)
        if not out or not all(isinstance(x, Tensor) for x in out):
            raise TypeError(
                "implicit: the solver must return a non-empty pytree of tensors (the solution alone)"
            )
        problem.solution_spec = spec
        inputs = {id(x) for x in leaves}
        return tuple(x.clone() if id(x) in inputs else x.detach() for x in out)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: tuple[Tensor, ...]) -> None:
        problem, n_init, *leaves = inputs
        ctx.problem, ctx.n_init, ctx.n_theta = problem, n_init, len(leaves) - n_init
        ctx.save_for_backward(*leaves[n_init:], *output)

    @staticmethod
    def backward(ctx: Any, *grads: Tensor) -> tuple[Tensor | None, ...]:
        problem: _Problem = ctx.problem
        saved = ctx.saved_tensors
        theta_leaves, solution = list(saved[: ctx.n_theta]), list(saved[ctx.n_theta :])
        wrt = [i for i, x in enumerate(theta_leaves) if _differentiable(x)]

        def residual(x_leaves: list[Tensor], diff_leaves: list[Tensor]) -> Any:
            leaves = list(theta_leaves)
            for i, x in zip(wrt, diff_leaves):
                leaves[i] = x
            _, theta = problem.unflatten([], leaves)
            return problem.optimality_fn(optree.tree_unflatten(problem.solution_spec, x_leaves), *theta)

        diff = [theta_leaves[i] for i in wrt]
        vjp_x = torch.func.vjp(lambda xs: residual(xs, diff), solution)[1]
        # residual's output tree has the solution's structure (F(x, theta) = 0 in x's space)
        as_output = lambda leaves: optree.tree_unflatten(problem.solution_spec, list(leaves))  # noqa: E731
        transpose = lambda u: as_output(vjp_x(u)[0])  # noqa: E731
        u = problem.solve(transpose, as_output(grads))
        vjp_theta = torch.func.vjp(lambda ts: residual(solution, ts), diff)[1]
        theta_grads = vjp_theta(optree.tree_map(torch.neg, u))[0] if diff else []
        out: list[Tensor | None] = [None] * ctx.n_theta
        for i, g in zip(wrt, theta_grads):
            out[i] = g
        return (None, None, *[None] * ctx.n_init, *out)


class _Problem:
    """What the Function needs besides tensors: the functions and the trees' shapes."""

    def __init__(
        self, solver: Solver, optimality_fn: Callable[..., Any], solve: LinearSolve, init: Any, theta: Any
    ):
        self.solver, self.optimality_fn, self.solve = solver, optimality_fn, solve
        init_leaves, self.init_spec = optree.tree_flatten(init)
        theta_leaves, self.theta_spec = optree.tree_flatten(theta, none_is_leaf=True)
        self.init_tensors = [i for i, x in enumerate(init_leaves) if isinstance(x, Tensor)]
        self.theta_tensors = [i for i, x in enumerate(theta_leaves) if isinstance(x, Tensor)]
        self.init_leaves, self.theta_leaves = init_leaves, theta_leaves
        self.solution_spec: Any = None

    def tensors(self) -> tuple[list[Tensor], list[Tensor]]:
        return [self.init_leaves[i] for i in self.init_tensors], [
            self.theta_leaves[i] for i in self.theta_tensors
        ]

    def unflatten(self, init_tensors: Any, theta_tensors: Any) -> tuple[Any, tuple[Any, ...]]:
        """`init` and `theta` with the given tensors in place of their tensor leaves
        (`init` None where none are given)."""
        init = None
        if init_tensors or not self.init_tensors:
            leaves = list(self.init_leaves)
            for i, x in zip(self.init_tensors, init_tensors):
                leaves[i] = x
            init = optree.tree_unflatten(self.init_spec, leaves)
        leaves = list(self.theta_leaves)
        for i, x in zip(self.theta_tensors, theta_tensors):
            leaves[i] = x
        return init, tuple(optree.tree_unflatten(self.theta_spec, leaves))


def _decorate(
    optimality_fn: Callable[..., Any], solve: LinearSolve | None, name: str
) -> Callable[[Solver], Solver]:
    if not callable(optimality_fn):
        raise TypeError(f"{name}: expected a function of (params, *theta), got {optimality_fn!r}")
    if solve is None:
        solve = normal_cg(maxiter=100)

    def decorator(solver: Solver) -> Solver:
        @functools.wraps(solver)
        def wrapped(init_params: Any, *theta: Any) -> Any:
            problem = _Problem(solver, optimality_fn, solve, init_params, theta)
            init_tensors, theta_tensors = problem.tensors()
            out = _Solution.apply(problem, len(init_tensors), *init_tensors, *theta_tensors)
            return optree.tree_unflatten(problem.solution_spec, list(out))

        return wrapped

    return decorator


def custom_root(
    optimality_fn: Callable[..., Any], solve: LinearSolve | None = None
) -> Callable[[Solver], Solver]:
    """Decorate ``solver(init_params, *theta) -> params`` so that its solution is
    differentiated implicitly, from ``optimality_fn(params, *theta) == 0`` there.

    ``optimality_fn`` returns a pytree of params' structure: for a minimization, the
    gradient of the objective (``torch.func.grad(objective)``). The backward pass
    solves a linear system with ``(d optimality_fn / d params)^T`` by `solve`, and
    differentiates `optimality_fn` (never the solver) in theta.

    Args:
        optimality_fn: ``optimality_fn(params, *theta)``, zero at the solution.
        solve: a linear solver from `funcopt.linear_solve` (default
            ``normal_cg(maxiter=100)``, for any nonsingular Jacobian; ``cg`` is cheaper
            and better conditioned where the Jacobian is symmetric positive definite,
            such as a Hessian at a minimum). Its iteration count bounds the precision.

    Every tensor the solution depends on must be passed in `theta` (a tensor that
    `optimality_fn` reads from a closure is a constant to it). Tensors in `theta`
    may sit in pytrees; other values pass as they are. The gradient is exact only where
    the solver has converged.

    Example:
        >>> import torch, funcopt as fo
        >>> X, y = torch.randn(20, 3, dtype=torch.float64), torch.randn(20, dtype=torch.float64)
        >>> def objective(w, lam):
        ...     return 0.5 * (X @ w - y).pow(2).sum() + 0.5 * lam * w.pow(2).sum()
        >>> @fo.implicit.custom_root(torch.func.grad(objective), solve=fo.linear_solve.cg(maxiter=3))
        ... def ridge(init, lam):  # any solver: here the closed form
        ...     return torch.linalg.solve(X.T @ X + lam * torch.eye(3, dtype=X.dtype), X.T @ y)
        >>> lam = torch.tensor(2.0, dtype=torch.float64)
        >>> g = torch.func.grad(lambda lam: ridge(None, lam).sum())(lam)
        >>> A = X.T @ X + lam * torch.eye(3, dtype=X.dtype)  # d/dlam A^-1 X^T y = -A^-1 w
        >>> torch.allclose(g, -torch.linalg.solve(A, ridge(None, lam)).sum())
        True
    """
    return _decorate(optimality_fn, solve, "custom_root")


def custom_fixed_point(
    fixed_point_fn: Callable[..., Any], solve: LinearSolve | None = None
) -> Callable[[Solver], Solver]:
    """Decorate ``solver(init_params, *theta) -> params`` whose solution is a fixed
    point, ``fixed_point_fn(params, *theta) == params``, so that it is differentiated
    implicitly: `custom_root` with ``fixed_point_fn(params, *theta) - params``.

    Args:
        fixed_point_fn: ``fixed_point_fn(params, *theta) -> params``.
        solve: a linear solver from `funcopt.linear_solve` (default
            ``normal_cg(maxiter=100)``).
    """
    if not callable(fixed_point_fn):
        raise TypeError(
            f"custom_fixed_point: expected a function of (params, *theta), got {fixed_point_fn!r}"
        )

    def optimality_fn(params: Any, *theta: Any) -> Any:
        return optree.tree_map(torch.sub, fixed_point_fn(params, *theta), params)

    return _decorate(optimality_fn, solve, "custom_fixed_point")
