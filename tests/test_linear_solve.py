"""funcopt.linear_solve against torch.linalg.solve (float64): pytrees, ridge, vmap,
converged systems (no division by zero), and compile."""

from __future__ import annotations

import pytest
import torch

import funcopt as fo

D = torch.float64
N = 7
torch.manual_seed(0)
_M = torch.randn(N, N, dtype=D)
SPD = _M @ _M.T + N * torch.eye(N, dtype=D)
NONSYM = torch.randn(N, N, dtype=D) + N * torch.eye(N, dtype=D)


def to_tree(v):
    return {"a": v[..., :3], "b": v[..., 3:].reshape(*v.shape[:-1], 2, 2)}


def from_tree(t):
    return torch.cat([t["a"], t["b"].flatten(-2)], -1)


def matvec_of(A):
    return lambda x: to_tree(A @ from_tree(x))


SOLVERS = {
    "cg": (fo.linear_solve.cg, {"maxiter": N + 3}, [SPD]),
    "normal_cg": (fo.linear_solve.normal_cg, {"maxiter": 3 * N}, [SPD, NONSYM]),
    "gmres": (fo.linear_solve.gmres, {"maxiter": 1, "restart": N}, [SPD, NONSYM]),
    "gmres_restarted": (fo.linear_solve.gmres, {"maxiter": 16, "restart": 3}, [SPD, NONSYM]),
    "gmres_past_breakdown": (fo.linear_solve.gmres, {"maxiter": 2, "restart": 3 * N}, [SPD, NONSYM]),
}


@pytest.mark.parametrize("name", SOLVERS)
@pytest.mark.parametrize("ridge", [0.0, 0.5])
def test_against_linalg_solve(name, ridge):
    factory, kwargs, matrices = SOLVERS[name]
    b = torch.randn(N, dtype=D)
    for A in matrices:
        op = A.T @ A if name == "normal_cg" else A
        want = torch.linalg.solve(op + ridge * torch.eye(N, dtype=D), (A.T @ b if name == "normal_cg" else b))
        x = factory(ridge=ridge, **kwargs)(matvec_of(A), to_tree(b))
        assert x["b"].shape == (2, 2)
        torch.testing.assert_close(from_tree(x), want, rtol=1e-9, atol=0)


@pytest.mark.parametrize("name", SOLVERS)
def test_vmap_and_zero_rhs(name):
    factory, kwargs, matrices = SOLVERS[name]
    A = matrices[-1]
    B = torch.randn(4, N, dtype=D)
    B[1] = 0  # already solved: every step is a step of zero, never 0/0
    solve = factory(**kwargs)
    got = torch.vmap(lambda b: solve(lambda x: A @ x, b))(B)
    want = torch.linalg.solve(A.T @ A, (A.T @ B.T)).T if name == "normal_cg" else torch.linalg.solve(A, B.T).T
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12)
    assert torch.isfinite(got).all() and (got[1] == 0).all()


def test_init_and_mixed_dtypes():
    b = {"x": torch.ones(3, dtype=torch.float32), "y": torch.ones(2, dtype=D)}
    A = torch.diag(torch.arange(1.0, 6.0, dtype=D))
    mv = lambda t: {"x": (A[:3, :3] @ t["x"].to(D)).float(), "y": A[3:, 3:] @ t["y"]}
    x = fo.linear_solve.cg(5)(mv, b, init={"x": torch.zeros(3), "y": torch.zeros(2, dtype=D)})
    assert x["x"].dtype == torch.float32 and x["y"].dtype == D
    torch.testing.assert_close(x["y"], 1 / torch.arange(4.0, 6.0, dtype=D))


def test_normal_cg_rectangular():
    A = torch.randn(9, 4, dtype=D)
    b = torch.randn(9, dtype=D)
    x = fo.linear_solve.normal_cg(maxiter=8)(lambda x: A @ x, b, init=torch.zeros(4, dtype=D))
    torch.testing.assert_close(x, torch.linalg.lstsq(A, b).solution, rtol=1e-9, atol=0)


@pytest.mark.slow
def test_compiles_without_graph_breaks():
    solve = fo.linear_solve.gmres(maxiter=1, restart=N)
    f = torch.compile(lambda A, b: solve(lambda x: A @ x, b), fullgraph=True)
    b = torch.randn(N, dtype=D)
    torch.testing.assert_close(f(NONSYM, b), torch.linalg.solve(NONSYM, b), rtol=1e-9, atol=0)


def test_bad_arguments():
    for bad in (0, 2.5, True):
        with pytest.raises(ValueError, match="maxiter"):
            fo.linear_solve.cg(bad)
    with pytest.raises(ValueError, match="ridge"):
        fo.linear_solve.gmres(3, ridge=-1.0)
    with pytest.raises(ValueError, match="restart"):
        fo.linear_solve.gmres(3, restart=0)
    with pytest.raises(ValueError, match="init"):
        fo.linear_solve.cg(3)(lambda x: x, torch.ones(3), init=torch.ones(2))
    with pytest.raises(TypeError, match="pytree of tensors"):
        fo.linear_solve.cg(3)(lambda x: x, [1.0])
