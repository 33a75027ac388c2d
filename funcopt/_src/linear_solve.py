"""Linear solvers with a fixed number of iterations (jaxopt's ``linear_solve``).

Each factory returns ``solve(matvec, b, init=None) -> x``, which solves
``(A + ridge * I) x = b`` for the linear map ``matvec(x) = A x`` over pytrees of
tensors. The solvers never read a value in Python: every loop runs all its
iterations, and a step that would divide by zero (the residual is already zero)
takes a step of zero instead. So they run under ``torch.func.vmap`` (a batch of
systems), ``grad`` and ``torch.compile``, and in the backward pass of
`funcopt.implicit`'s solutions, at the cost of the iterations a converged solve
would have skipped.

The pytree is solved as one flat vector (its leaves raveled and concatenated in a
common dtype), so the leaves may have any shapes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import optree
import torch
from torch import Tensor

Matvec = Callable[[Any], Any]


class LinearSolve(Protocol):
    def __call__(self, matvec: Matvec, b: Any, init: Any = None) -> Any: ...


def _check(maxiter: int, ridge: float, name: str) -> None:
    if not isinstance(maxiter, int) or isinstance(maxiter, bool) or maxiter < 1:
        raise ValueError(f"{name}: maxiter must be a positive int (a fixed iteration count), got {maxiter!r}")
    if isinstance(ridge, Tensor) or not ridge >= 0:
        raise ValueError(f"{name}: ridge must be a float >= 0, got {ridge!r}")


def _flat(tree: Any) -> tuple[Tensor, Callable[[Tensor], Any]]:
    """`tree` as one vector, and the inverse map (a vector back to `tree`'s leaves,
    shapes and dtypes)."""
    leaves, spec = optree.tree_flatten(tree)
    if not leaves or not all(isinstance(x, Tensor) for x in leaves):
        raise TypeError("linear_solve: b must be a non-empty pytree of tensors")
    shapes, dtypes, sizes = [x.shape for x in leaves], [x.dtype for x in leaves], [x.numel() for x in leaves]
    dtype = leaves[0].dtype
    for x in leaves[1:]:
        dtype = torch.promote_types(dtype, x.dtype)
    vector = torch.cat([x.reshape(-1).to(dtype) for x in leaves])

    def unflat(v: Tensor) -> Any:
        parts = torch.split(v, sizes)
        return optree.tree_unflatten(spec, [p.reshape(s).to(d) for p, s, d in zip(parts, shapes, dtypes)])

    return vector, unflat


def _operator(matvec: Matvec, b: Any, ridge: float) -> tuple[Callable[[Tensor], Tensor], Tensor, Callable]:
    """``matvec`` on flat vectors (with the ridge added), the flat `b`, and unflat."""
    vector, unflat = _flat(b)

    def op(v: Tensor) -> Tensor:
        out, _ = _flat(matvec(unflat(v)))
        return out + ridge * v if ridge else out

    return op, vector, unflat


def _start(b: Tensor, init: Any) -> Tensor:
    if init is None:
        return torch.zeros_like(b)
    x0, _ = _flat(init)
    if x0.shape != b.shape:
        raise ValueError(f"linear_solve: init has {x0.numel()} entries, but b has {b.numel()}")
    return x0.to(b.dtype)


def _divide(num: Tensor, den: Tensor) -> Tensor:
    """``num / den``, and 0 where `den` is 0 (a converged solve stays put)."""
    zero = den == 0
    return torch.where(zero, torch.zeros_like(num), num / torch.where(zero, torch.ones_like(den), den))


def _cg(op: Callable[[Tensor], Tensor], b: Tensor, x: Tensor, maxiter: int) -> Tensor:
    r = b - op(x)
    p, rs = r, torch.dot(r, r)
    for _ in range(maxiter):
        ap = op(p)
        alpha = _divide(rs, torch.dot(p, ap))
        x, r = x + alpha * p, r - alpha * ap
        rs_new = torch.dot(r, r)
        p, rs = r + _divide(rs_new, rs) * p, rs_new
    return x


def cg(maxiter: int, ridge: float = 0.0) -> LinearSolve:
    """Conjugate gradient, for a symmetric positive (semi-)definite ``A``, such as a
    Hessian at a minimum.

    Args:
        maxiter: the number of iterations (all of them always run). For an ``n``-entry
            system, ``n`` iterations solve it exactly up to round-off.
        ridge: add ``ridge * x`` to ``matvec(x)`` (regularizes a singular ``A``).

    Example:
        >>> import torch, funcopt as fo
        >>> A = torch.tensor([[4.0, 1.0], [1.0, 3.0]])
        >>> solve = fo.linear_solve.cg(maxiter=2)
        >>> solve(lambda x: {"v": A @ x["v"]}, {"v": torch.tensor([1.0, 2.0])})["v"]
        tensor([0.0909, 0.6364])
    """
    _check(maxiter, ridge, "cg")

    def solve(matvec: Matvec, b: Any, init: Any = None) -> Any:
        op, vector, unflat = _operator(matvec, b, ridge)
        return unflat(_cg(op, vector, _start(vector, init), maxiter))

    return solve


def normal_cg(maxiter: int, ridge: float = 0.0) -> LinearSolve:
    """Conjugate gradient on the normal equations ``(A^T A + ridge * I) x = A^T b``,
    for any ``A`` (not symmetric, or not square). ``A^T`` comes from
    ``torch.func.vjp`` of `matvec`, which must therefore be a function torch can
    differentiate. It converges as CG on ``A^T A``, whose condition number is the
    square of ``A``'s.

    Args:
        maxiter: the number of CG iterations.
        ridge: the ridge added to ``A^T A``.

    ``solve(matvec, b, init=None)``: for a non-square ``A``, `init` gives the structure
    of ``x`` (by default `b`'s).
    """
    _check(maxiter, ridge, "normal_cg")

    def solve(matvec: Matvec, b: Any, init: Any = None) -> Any:
        example = b if init is None else init
        x_flat, x_unflat = _flat(example)
        b_flat, _ = _flat(b)
        transpose = torch.func.vjp(lambda x: _flat(matvec(x_unflat(x)))[0], torch.zeros_like(x_flat))[1]

        def normal(v: Tensor) -> Tensor:
            out = transpose(_flat(matvec(x_unflat(v)))[0])[0]
            return out + ridge * v if ridge else out

        rhs = transpose(b_flat)[0]
        return x_unflat(_cg(normal, rhs, torch.zeros_like(x_flat) if init is None else x_flat, maxiter))

    return solve


def _cycle(op: Callable[[Tensor], Tensor], r: Tensor, size: int) -> Tensor:
    """One GMRES cycle from the residual `r`: the correction in the Krylov subspace of
    `size` dimensions that minimizes the new residual.

    Arnoldi (modified Gram-Schmidt) builds the basis; after a breakdown (the subspace
    is invariant, so the solve is exact in it) the later basis vectors are zero and
    their Hessenberg columns unit columns, so that the small least-squares problem
    keeps full rank and gives them coefficient 0."""
    beta = torch.linalg.vector_norm(r)
    one = torch.ones_like(beta)
    tiny = torch.finfo(r.dtype).eps ** 0.75
    live = beta > 0
    basis, columns = [r * _divide(one, beta)], []
    for j in range(size):
        w = op(basis[j])
        norm_w = torch.linalg.vector_norm(w)
        h = []
        for v in basis:
            h.append(torch.dot(v, w))
            w = w - h[-1] * v
        h_next = torch.linalg.vector_norm(w)
        column = torch.stack([*h, h_next, *[torch.zeros_like(beta)] * (size - j - 1)])
        unit = torch.zeros(size + 1, dtype=r.dtype, device=r.device)
        unit[j] = 1
        columns.append(torch.where(live, column, unit))
        live = live & (h_next > tiny * norm_w)
        basis.append(torch.where(live, w * _divide(one, h_next), torch.zeros_like(w)))
    hessenberg = torch.stack(columns, dim=1)
    q, upper = torch.linalg.qr(hessenberg)
    y = torch.linalg.solve_triangular(upper, (q[0] * beta).unsqueeze(-1), upper=True).squeeze(-1)
    return torch.stack(basis[:size], dim=1) @ y


def gmres(maxiter: int, ridge: float = 0.0, restart: int = 20) -> LinearSolve:
    """Restarted GMRES, for any square nonsingular ``A``.

    Args:
        maxiter: the number of restart cycles (all run).
        ridge: add ``ridge * x`` to ``matvec(x)``.
        restart: the size of the Krylov subspace each cycle builds (``restart``
            products with ``A`` per cycle).

    Example:
        >>> import torch, funcopt as fo
        >>> A = torch.tensor([[2.0, 1.0], [-1.0, 3.0]], dtype=torch.float64)
        >>> x = fo.linear_solve.gmres(maxiter=1, restart=2)(lambda x: A @ x, torch.ones(2, dtype=torch.float64))
        >>> torch.allclose(A @ x, torch.ones(2, dtype=torch.float64))
        True
    """
    _check(maxiter, ridge, "gmres")
    if not isinstance(restart, int) or isinstance(restart, bool) or restart < 1:
        raise ValueError(f"gmres: restart must be a positive int, got {restart!r}")

    def solve(matvec: Matvec, b: Any, init: Any = None) -> Any:
        op, vector, unflat = _operator(matvec, b, ridge)
        x = _start(vector, init)
        for _ in range(maxiter):
            x = x + _cycle(op, vector - op(x), restart)
        return unflat(x)

    return solve
