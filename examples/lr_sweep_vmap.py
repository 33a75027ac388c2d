# %% [markdown]
# # A learning-rate sweep in one `vmap`-ed training run
#
# funcopt's optimizers are pure functions whose hyperparameters may be tensors. So a
# whole training run is a function of the learning rate, and `torch.func.vmap` runs it
# for many learning rates at once: one batched run instead of a Python loop of runs.
# Here: 24 learning rates for NAdam on a small MLP, against the same 24 runs one by
# one. Only generated data is used.
#
# Run it as a script with `python examples/lr_sweep_vmap.py`; it writes `lr_sweep_vmap.png`.

# %%
import time

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F
from torch.func import functional_call, vmap
from tqdm.auto import tqdm

import funcopt as fo

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
params = {name: p.detach() for name, p in model.named_parameters()}
x = torch.randn(256, 8)
y = torch.sin(x.sum(1, keepdim=True))
STEPS = 150


def loss_fn(params, x, y):
    return F.mse_loss(functional_call(model, params, (x,)), y)


# %% [markdown]
# ## One training run, as a function of the learning rate
# `fo.inner_loop` takes one step per batch; `lr` is a 0-d tensor, so nothing in the run
# reads it as a Python number and `vmap` can batch over it.


# %%
def final_loss(lr):
    trained, _, losses = fo.inner_loop(loss_fn, params, fo.nadam(lr=lr), [(x, y)] * STEPS)
    return loss_fn(trained, x, y)


lrs = torch.logspace(-4, -0.3, 24)

start = time.perf_counter()
batched = vmap(final_loss)(lrs)
t_vmap = time.perf_counter() - start

start = time.perf_counter()
# disable=None: a progress bar on a terminal or in Jupyter, none in a log file
looped = torch.stack([final_loss(lr) for lr in tqdm(lrs, desc="one run at a time", disable=None)])
t_loop = time.perf_counter() - start

print(f"24 runs: one vmap {t_vmap:.2f} s, a Python loop {t_loop:.2f} s ({t_loop / t_vmap:.1f}x faster)")
print(f"best learning rate: {lrs[batched.argmin()]:.3g}")

# %% [markdown]
# The two sweeps agree up to float32 round-off (batched matrix products sum in another
# order, and long runs at unstable learning rates amplify that).

# %%
agree = (batched - looped).abs() / looped
print(f"median relative difference vmap vs loop: {agree.median():.1e}")

# %% [markdown]
# ## Final loss against learning rate, and the time it took

# %%
fig, (ax, bars) = plt.subplots(1, 2, figsize=(11, 4), gridspec_kw={"width_ratios": [3, 1]})
ax.plot(lrs, batched, "o-", label="one vmap-ed run")
ax.plot(lrs, looped, "x", label="Python loop of runs")
ax.set(xscale="log", yscale="log", xlabel="learning rate", ylabel=f"loss after {STEPS} NAdam steps")
ax.legend()
bars.bar(["vmap", "loop"], [t_vmap, t_loop], color=["tab:blue", "tab:orange"])
bars.set(ylabel="seconds", title="24 training runs")
fig.tight_layout()
fig.savefig("lr_sweep_vmap.png", dpi=100)

# the timing is shown, not asserted (it depends on the machine); the agreement is checked
assert agree.median() < 1e-3
