# %% [markdown]
# # MAML on sinusoid regression, with a differentiable inner loop
#
# Model-agnostic meta-learning (Finn et al., 2017) learns an initialization from which
# a few optimizer steps fit a new task. Each task is a sinusoid `A sin(x + phase)`; the
# model sees 10 points of it. The *inner loop* adapts the model to the task with a few
# funcopt NAdam steps; the *outer loop* differentiates the loss after adaptation with
# respect to the initial weights, through the inner steps (second order), and updates
# them with `funcopt.Adamax` used as an ordinary `torch.optim` optimizer.
#
# Run it as a script with `python examples/maml_sinusoid.py`; it writes `maml_sinusoid.png`.

# %%
import math
import os

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F
from torch.func import functional_call
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


model = torch.nn.Sequential(
    torch.nn.Linear(1, 40), torch.nn.ReLU(), torch.nn.Linear(40, 40), torch.nn.ReLU(), torch.nn.Linear(40, 1)
)


def loss_fn(params, x, y):
    return F.mse_loss(functional_call(model, params, (x,)), y)


# %% [markdown]
# ## The inner loop
# `fo.inner_loop` takes one NAdam step per batch and returns the adapted weights as a
# differentiable function of the starting weights. ReLU networks have gradient entries
# that are exactly zero, where the derivative of NAdam's square root is infinite and
# would make the meta-gradient NaN: `eps_root` (inside the square root) prevents that.

# %%
inner = fo.nadam(lr=0.02, eps_root=1e-16)


def adapt(params, x, y, steps):
    adapted, _, _ = fo.inner_loop(loss_fn, params, inner, [(x, y)] * steps)
    return adapted


# %% [markdown]
# ## Meta-training
# Per meta-iteration: 4 tasks; adapt on 10 points of each (one inner step), measure the
# loss on 10 other points, and backpropagate through the adaptation.

# %%
meta_params = {name: p.detach().clone().requires_grad_() for name, p in model.named_parameters()}
initial_params = {name: p.detach().clone() for name, p in meta_params.items()}
meta_optimizer = fo.Adamax(meta_params.values(), lr=3e-3)
TASKS = 4
# The docs build runs this notebook with fewer meta-iterations (docs/conf.py sets
# FUNCOPT_QUICK=1, so the page builds in seconds); the script runs the full 1500.
META_ITERATIONS = 300 if os.environ.get("FUNCOPT_QUICK") == "1" else 1500

meta_losses = []
# disable=None: a progress bar on a terminal or in Jupyter, none in a log file
for _ in tqdm(range(META_ITERATIONS), desc="meta-training", disable=None):
    x, y = sample_tasks(TASKS, 20)
    loss = (
        sum(loss_fn(adapt(meta_params, x[t, :10], y[t, :10], 1), x[t, 10:], y[t, 10:]) for t in range(TASKS))
        / TASKS
    )
    meta_optimizer.zero_grad()
    loss.backward()
    meta_optimizer.step()
    meta_losses.append(loss.item())

# %% [markdown]
# ## Adaptation to new tasks, before and after meta-training
# From the random initial weights and from the meta-learned ones, 5 NAdam steps on 10
# points of each of 50 new tasks; the error is measured on 100 other points.

# %%
x, y = sample_tasks(50, 110)


def error_after_adaptation(params, steps=5):
    return (
        sum(
            loss_fn(adapt(params, x[t, :10], y[t, :10], steps), x[t, 10:], y[t, 10:]).item()
            for t in range(50)
        )
        / 50
    )


learned = {name: p.detach() for name, p in meta_params.items()}
before, after = error_after_adaptation(initial_params), error_after_adaptation(learned)
print(
    f"mean squared error on new tasks after 5 steps: {before:.2f} from random init, {after:.2f} from MAML init"
)

# %%
grid = torch.linspace(-5, 5, 200).unsqueeze(1)
fig, axes = plt.subplots(1, 3, figsize=(16, 4))
axes[0].plot(meta_losses, alpha=0.3)
axes[0].plot(torch.tensor(meta_losses).unfold(0, 50, 1).mean(1), label="running mean")
axes[0].set(yscale="log", xlabel="meta-iteration", ylabel="loss after adaptation", title="meta-training")
axes[0].legend()
for ax, (title, params) in zip(axes[1:], [("random init", initial_params), ("MAML init", learned)]):
    ax.scatter(x[0, :10], y[0, :10], color="k", zorder=3, label="10 points seen")
    ax.plot(x[0, 10:].sort(0).values, y[0, 10:][x[0, 10:].argsort(0).squeeze()], "k", alpha=0.3, label="task")
    with torch.no_grad():
        ax.plot(grid, functional_call(model, params, (grid,)), ":", label="before adaptation")
    ax.plot(
        grid,
        functional_call(model, adapt(params, x[0, :10], y[0, :10], 5), (grid,)).detach(),
        label="after 5 steps",
    )
    ax.set(title=f"adapting from the {title}", xlabel="x", ylim=(-6, 6))
    ax.legend(loc="lower left", fontsize=8)
fig.tight_layout()
fig.savefig("maml_sinusoid.png", dpi=100)

assert after < before
