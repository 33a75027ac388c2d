"""Linear solvers with a fixed number of iterations, for implicit differentiation
(`funcopt.implicit`): ``solve = cg(maxiter)``, then ``x = solve(matvec, b)``."""

from ._src.linear_solve import LinearSolve, cg, gmres, normal_cg

__all__ = ["LinearSolve", "cg", "gmres", "normal_cg"]
