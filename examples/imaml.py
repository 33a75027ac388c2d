# %% [markdown]
# # iMAML: meta-learning with implicit gradients
#
# Implicit MAML (Rajeswaran et al., 2019, [arXiv:1909.04630](https://arxiv.org/abs/1909.04630))
# learns an initialization `theta` from which a task is solved well, as MAML does, but
# without differentiating through the inner optimizer. Each task is solved to
# (near) convergence on a proximal objective that keeps the adapted weights close to
# `theta`,
#
# $$w^*(\theta) = \arg\min_w \; L_\text{task}(w) + \tfrac{\lambda}{2}\lVert w - \theta\rVert^2,$$
#
# and the meta-gradient of the query loss comes from the implicit function theorem at
# `w*`: `dL_query/dtheta = lambda (lambda I + H)^-1 grad L_query(w*)`, with `H` the
# task loss's Hessian, one linear solve by conjugate gradients. Memory and time do not
# depend on how many inner steps were taken, and the inner optimizer can be anything.
#
# Here `fo.implicit.custom_root` turns a funcopt inner loop into such a solver, and
# `fo.linear_solve.cg` solves the linear system. The tasks are the sinusoids of the
# [MAML tutorial](maml_sinusoid.ipynb). Run it as a script with
# `python examples/imaml.py` (it writes `imaml.png`); install funcopt from a clone of
# its repository with `pip install torch==2.13.0 -e ".[demo]"`.

# %%
import math
import os

import matplotlib.pyplot as plt
import torch
from tqdm.auto import tqdm

import funcopt as fo

torch.manual_seed(0)
generator = torch.Generator().manual_seed(0)


def sample_tasks(n, points):
    """n sinusoids, `points` samples each: x, y of shape (n, points, 1)."""
    amplitude = torch.rand(n, 1, 1, generator=generator) * 4.9 + 0.1
    phase = torch.rand(n, 1, 1, generator=generator) * math.pi
    x = torch.rand(n, points, 1, generator=generator) * 10 - 5
    return x, amplitude * torch.sin(x + phase)


def init_params(hidden=40):
    """A 1-40-40-1 tanh network's weights, initialized as torch.nn.Linear's."""
    params = {}
    for i, (n_in, n_out) in enumerate([(1, hidden), (hidden, hidden), (hidden, 1)]):
        bound = 1 / math.sqrt(n_in)
        params[f"w{i}"] = (torch.rand(n_in, n_out, generator=generator) * 2 - 1) * bound
        params[f"b{i}"] = (torch.rand(n_out, generator=generator) * 2 - 1) * bound
    return params


def net(params, x):
    h = torch.tanh(x @ params["w0"] + params["b0"])
    h = torch.tanh(h @ params["w1"] + params["b1"])
    return h @ params["w2"] + params["b2"]


def loss_fn(params, x, y):
    return (net(params, x) - y).pow(2).mean()


# %% [markdown]
# ## The inner problem and its implicit solver
# The inner objective is the task loss plus the proximal term. The solver runs 30 steps of
# funcopt's SGD with heavy-ball momentum from `theta` (its steps are never
# differentiated). `custom_root` is told that the solution zeroes the gradient of the
# inner objective: the backward pass solves `(lambda I + H) u = g` with 10 iterations of
# conjugate gradients, on Hessian-vector products of the inner objective. Every tensor the
# solution depends on (`theta` and the task's data) is an argument after the initial point.
#
# The network is smooth (tanh, where the MAML tutorial uses ReLU): the implicit gradient
# is exact only at a solution, and on a ReLU network's kinks a gradient method stalls
# short of one (here its gradient norm stayed at about a tenth of its start, whatever the
# number of steps).

# %%
LAM = 2.0  # the proximal strength: larger keeps w* closer to theta and the solve easier
inner = fo.sgd(lr=0.025, momentum=0.6)


def inner_objective(w, theta, x, y):
    proximal = sum((w[k] - theta[k]).pow(2).sum() for k in w)
    return loss_fn(w, x, y) + 0.5 * LAM * proximal


def make_adapt(steps, cg_iterations):
    @fo.implicit.custom_root(
        torch.func.grad(inner_objective), solve=fo.linear_solve.cg(maxiter=cg_iterations)
    )
    def adapt(init, theta, x, y):
        w, _, _ = fo.inner_loop(inner_objective, init, inner, [(theta, x, y)] * steps)
        return w

    return adapt


adapt = make_adapt(steps=30, cg_iterations=10)


def meta_loss(theta, x_support, y_support, x_query, y_query):
    """The query loss after adapting to the support set, from theta."""
    return loss_fn(adapt(theta, theta, x_support, y_support), x_query, y_query)


# all tasks of a batch at once: vmap runs the solver and the implicit backward batched
batched_meta_loss = torch.vmap(meta_loss, in_dims=(None, 0, 0, 0, 0))

# %% [markdown]
# ## Meta-training
# Per meta-iteration: 4 tasks, adapted on 10 points each, the query loss measured on 10
# other points; `funcopt.Adam` updates `theta` as an ordinary torch optimizer. Before
# and after, the same 25 held-out tasks measure the query loss after adaptation.

# %%
theta = {name: p.requires_grad_() for name, p in init_params().items()}
initial_theta = {name: p.detach().clone() for name, p in theta.items()}
meta_optimizer = fo.Adam(theta.values(), lr=3e-3)
TASKS = 4
# The docs build runs this notebook with fewer meta-iterations (docs/conf.py sets
# FUNCOPT_QUICK=1, so the page builds in seconds); the script runs the full 1000.
META_ITERATIONS = 100 if os.environ.get("FUNCOPT_QUICK") == "1" else 1000

x_held, y_held = sample_tasks(25, 20)


def held_out_loss(theta):
    theta = {name: p.detach() for name, p in theta.items()}
    split = (x_held[:, :10], y_held[:, :10], x_held[:, 10:], y_held[:, 10:])
    return batched_meta_loss(theta, *split).mean().item()


before = held_out_loss(theta)
meta_losses = []
# disable=None: a progress bar on a terminal or in Jupyter, none in a log file
for _ in tqdm(range(META_ITERATIONS), desc="meta-training", disable=None):
    x, y = sample_tasks(TASKS, 20)
    loss = batched_meta_loss(theta, x[:, :10], y[:, :10], x[:, 10:], y[:, 10:]).mean()
    meta_optimizer.zero_grad()
    loss.backward()
    meta_optimizer.step()
    meta_losses.append(loss.item())
after = held_out_loss(theta)
print(
    f"query loss after adaptation on 25 held-out tasks: {before:.3f} from the random init, {after:.3f} meta-learned"
)

# %% [markdown]
# ## Implicit against unrolled, on one task
# MAML would differentiate through the inner steps instead: `fo.inner_loop` keeps each
# step's graph, and the meta-gradient goes back through all of them (memory grows with
# the steps). Where the inner problem is solved exactly, the two meta-gradients are the
# same. Here, in float64, on one task from the meta-learned `theta`: the more inner steps
# (the closer to `w*`), the closer the implicit meta-gradient is to the unrolled one.

# %%
theta64 = {name: p.detach().double() for name, p in theta.items()}
x, y = sample_tasks(1, 20)
task = (x[0, :10].double(), y[0, :10].double(), x[0, 10:].double(), y[0, 10:].double())


def implicit_meta_loss(theta, adapt, x_support, y_support, x_query, y_query):
    return loss_fn(adapt(theta, theta, x_support, y_support), x_query, y_query)


def unrolled_meta_loss(theta, steps, x_support, y_support, x_query, y_query):
    w, _, _ = fo.inner_loop(inner_objective, theta, inner, [(theta, x_support, y_support)] * steps)
    return loss_fn(w, x_query, y_query)


def flat(grads):
    return torch.cat([g.flatten() for g in grads.values()])


comparison = []
for steps in (10, 30, 100):
    implicit = torch.func.grad(implicit_meta_loss)(theta64, make_adapt(steps, cg_iterations=50), *task)
    unrolled = torch.func.grad(unrolled_meta_loss)(theta64, steps, *task)
    difference = float((flat(implicit) - flat(unrolled)).norm() / flat(unrolled).norm())
    comparison.append((steps, difference))
    print(f"{steps:4d} inner steps: |implicit - unrolled| / |unrolled| = {difference:.1e}")

# %% [markdown]
# ## The meta-learned initialization at work

# %%
grid = torch.linspace(-5, 5, 200).unsqueeze(1)
x, y = x_held[0], y_held[0]
fig, axes = plt.subplots(1, 3, figsize=(16, 4))
window = min(25, len(meta_losses))
axes[0].plot(meta_losses, alpha=0.3)
axes[0].plot(torch.tensor(meta_losses).unfold(0, window, 1).mean(1), label="running mean")
axes[0].set(
    yscale="log", xlabel="meta-iteration", ylabel="query loss after adaptation", title="meta-training"
)
axes[0].legend()
axes[1].plot([s for s, _ in comparison], [d for _, d in comparison], "o-")
axes[1].set(xscale="log", yscale="log", xlabel="inner steps", ylabel="relative difference")
axes[1].set(title="implicit against unrolled meta-gradient")
learned = {name: p.detach() for name, p in theta.items()}
for label, start in [("random init", initial_theta), ("iMAML init", learned)]:
    adapted = adapt(start, start, x[:10], y[:10])
    axes[2].plot(grid, net(adapted, grid).detach(), label=f"adapted from the {label}")
axes[2].scatter(x[:10], y[:10], color="k", zorder=3, label="10 points seen")
axes[2].scatter(x[10:], y[10:], color="k", alpha=0.3, label="query points")
axes[2].set(title="a held-out task", xlabel="x", ylim=(-6, 6))
axes[2].legend(loc="lower left", fontsize=8)
fig.tight_layout()
fig.savefig("imaml.png", dpi=100)

assert after < before
assert comparison[-1][1] < comparison[0][1]
