"""funcopt.implicit: the implicit hypergradient of ridge regression against its closed
form (float64), through every way of differentiating, under vmap, with funcopt solvers
inside (inner_loop, lbfgs)."""

from __future__ import annotations

import pytest
import torch

import funcopt as fo

D = torch.float64
torch.manual_seed(0)
X, Y = torch.randn(40, 5, dtype=D), torch.randn(40, dtype=D)
XV, YV = torch.randn(30, 5, dtype=D), torch.randn(30, dtype=D)
LAMS = torch.linspace(0.1, 3.0, 8, dtype=D)


def objective(w, lam):
    return 0.5 * (X @ w - Y).pow(2).sum() + 0.5 * (lam * w.pow(2)).sum()


def closed_form(lam):
    return torch.linalg.solve(X.T @ X + torch.diag(lam.expand(5)), X.T @ Y)


def outer(w):
    return 0.5 * (XV @ w - YV).pow(2).sum()


def hypergradient(lam):
    """d outer(w*(lam)) / d lam: dw*/dlam = -A^-1 diag(w*) (per-feature lam)."""
    A = X.T @ X + torch.diag(lam.expand(5))
    w = torch.linalg.solve(A, X.T @ Y)
    g = torch.linalg.solve(A, XV.T @ (XV @ w - YV))  # A is symmetric
    return -(g * w) if lam.dim() else -(g * w).sum()


@fo.implicit.custom_root(torch.func.grad(objective), solve=fo.linear_solve.cg(maxiter=10))
def exact(init, lam):
    return closed_form(lam)


def rel(a, b):
    return float((a - b).norm() / b.norm())


def test_every_way_of_differentiating():
    lam = torch.tensor(0.7, dtype=D)
    want = hypergradient(lam)
    assert rel(torch.func.grad(lambda lam: outer(exact(None, lam)))(lam), want) <= 1e-10
    _, vjp = torch.func.vjp(lambda lam: exact(None, lam), lam)
    g_w = torch.func.grad(outer)(closed_form(lam))
    assert rel(vjp(g_w)[0], want) <= 1e-10
    leaf = lam.clone().requires_grad_()
    outer(exact(None, leaf)).backward()
    assert rel(leaf.grad, want) <= 1e-10
    (g,) = torch.autograd.grad(outer(exact(torch.zeros(5, dtype=D), leaf)), leaf)
    assert rel(g, want) <= 1e-10
    # a vector of strengths: the Jacobian -A^-1 diag(w)
    lams = torch.rand(5, dtype=D) + 0.5
    jac = torch.func.jacrev(lambda lam: exact(None, lam))(lams)
    A = X.T @ X + torch.diag(lams)
    assert rel(jac, -torch.linalg.solve(A, torch.diag(closed_form(lams)))) <= 1e-10
    assert rel(torch.func.grad(lambda lam: outer(exact(None, lam)))(lams), hypergradient(lams)) <= 1e-10


def test_vmap_over_eight_strengths():
    got = torch.vmap(torch.func.grad(lambda lam: outer(exact(None, lam))))(LAMS)
    want = torch.stack([hypergradient(lam) for lam in LAMS])
    assert rel(got, want) <= 1e-8


def test_pytree_theta_and_solution():
    @fo.implicit.custom_root(
        lambda p, theta, scale: {"w": torch.func.grad(objective)(p["w"], theta["lam"] * scale)},
        solve=fo.linear_solve.gmres(maxiter=2, restart=5),
    )
    def solver(init, theta, scale):
        return {"w": closed_form(theta["lam"] * scale)}

    lam = torch.tensor(0.35, dtype=D)
    g = torch.func.grad(lambda lam: outer(solver(None, {"lam": lam}, 2.0)["w"]))(lam)
    assert rel(g, 2.0 * hypergradient(2 * lam)) <= 1e-10


def gd_step(w, lam):
    return w - 0.01 * torch.func.grad(objective)(w, lam)


@fo.implicit.custom_fixed_point(gd_step, solve=fo.linear_solve.normal_cg(maxiter=20))
def by_fixed_point(init, lam):
    return closed_form(lam)


def test_custom_fixed_point():
    g = torch.vmap(torch.func.grad(lambda lam: outer(by_fixed_point(None, lam))))(LAMS)
    assert rel(g, torch.stack([hypergradient(lam) for lam in LAMS])) <= 1e-8


def test_inner_loop_solver_inside():
    """A funcopt solver: 200 steps of gradient descent by fo.inner_loop, to convergence
    (the iterations are not differentiated: the backward is one linear solve)."""
    eta = 1.0 / float(torch.linalg.eigvalsh(X.T @ X)[-1] + 3.0)

    @fo.implicit.custom_root(torch.func.grad(objective), solve=fo.linear_solve.cg(maxiter=10))
    def solver(init, lam):
        w, _, _ = fo.inner_loop(objective, init, fo.sgd(lr=eta), [(lam,)] * 200)
        return w

    init = torch.zeros(5, dtype=D)
    assert rel(solver(init, LAMS[0]), closed_form(LAMS[0])) <= 1e-12  # converged
    got = torch.vmap(torch.func.grad(lambda lam: outer(solver(init, lam))))(LAMS)
    assert rel(got, torch.stack([hypergradient(lam) for lam in LAMS])) <= 1e-8
    leaf = LAMS[3].clone().requires_grad_()
    outer(solver(init, leaf)).backward()
    assert rel(leaf.grad, hypergradient(LAMS[3])) <= 1e-8


@pytest.mark.parametrize("batched", [False, True])
def test_lbfgs_solver_inside(batched):
    tx = fo.lbfgs(max_iter=10, line_search_fn="strong_wolfe", tolerance_grad=1e-14, tolerance_change=1e-16)

    @fo.implicit.custom_root(torch.func.grad(objective), solve=fo.linear_solve.cg(maxiter=10))
    def solver(init, lam):
        value_fn = lambda w: objective(w, lam)
        updates, _ = tx.update(torch.func.grad(value_fn)(init), tx.init(init), init, value_fn=value_fn)
        return fo.apply_updates(init, updates)

    init = torch.zeros(5, dtype=D)
    hypergrad = torch.func.grad(lambda lam: outer(solver(init, lam)))
    lams = LAMS if batched else LAMS[:2]
    got = torch.vmap(hypergrad)(lams) if batched else torch.stack([hypergrad(lam) for lam in lams])
    assert rel(got, torch.stack([hypergradient(lam) for lam in lams])) <= 1e-8


def test_errors():
    with pytest.raises(TypeError, match="pytree of tensors"):
        fo.implicit.custom_root(torch.func.grad(objective))(lambda init, lam: 1.0)(None, LAMS[0])
    with pytest.raises(TypeError, match="function"):
        fo.implicit.custom_root(3)
