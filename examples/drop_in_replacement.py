# %% [markdown]
# # funcopt as a drop-in `torch.optim` replacement
#
# `funcopt.NAdam` (and `Adadelta`, `Adagrad`, `Adamax`) subclass `torch.optim.Optimizer`
# with the same constructor, hooks and `state_dict` format as the torch class of the
# same name. This notebook trains one model twice, with `torch.optim.NAdam` and with
# `funcopt.NAdam`, both driven by an lr scheduler; then it checkpoints the funcopt run
# halfway, resumes it in a fresh process-like setup, and shows that the three loss
# curves coincide. Only generated data is used.
#
# Run it as a script with `python examples/drop_in_replacement.py`; it writes
# `drop_in_replacement.png`.

# %%
import copy
import io

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

import funcopt as fo

torch.manual_seed(0)
x = torch.randn(1024, 8)
y = torch.sin(x[:, :1] * 2) + x[:, 1:2] * x[:, 2:3]

EPOCHS = 300


def make_model():
    torch.manual_seed(1)  # same initial weights for every run
    return torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.SiLU(), torch.nn.Linear(64, 1))


def make_training(optimizer_class):
    model = make_model()
    optimizer = optimizer_class(model.parameters(), lr=1e-2, weight_decay=1e-4)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=EPOCHS)
    return model, optimizer, scheduler


def train(model, optimizer, scheduler, epochs, desc):
    losses = []
    # disable=None: a progress bar on a terminal or in Jupyter, none in a log file
    for _ in tqdm(range(epochs), desc=desc, disable=None):
        optimizer.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        scheduler.step()
        losses.append(loss.item())
    return losses


# %% [markdown]
# ## The same training run with torch.optim.NAdam and with funcopt.NAdam
# The only difference between the two runs is the class name.

# %%
torch_run = make_training(torch.optim.NAdam)
torch_losses = train(*torch_run, EPOCHS, "torch.optim.NAdam")

funcopt_run = make_training(fo.NAdam)
funcopt_losses = train(*funcopt_run, EPOCHS, "funcopt.NAdam")

max_diff = max(
    (a - b).abs().max().item() for a, b in zip(torch_run[0].parameters(), funcopt_run[0].parameters())
)
print(f"final loss: torch {torch_losses[-1]:.6f}, funcopt {funcopt_losses[-1]:.6f}")
print(f"largest difference between the trained weights: {max_diff:.1e}")

# %% [markdown]
# ## Checkpoint and resume
# Train halfway, save model, optimizer and scheduler with `torch.save`, build everything
# anew, load the checkpoint (with `weights_only=True`, as a careful user would) and
# finish. The optimizer's `state_dict` has torch's format: it could equally be loaded
# into `torch.optim.NAdam`.

# %%
model, optimizer, scheduler = make_training(fo.NAdam)
resumed_losses = train(model, optimizer, scheduler, EPOCHS // 2, "first half")

buffer = io.BytesIO()
torch.save(
    {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()},
    buffer,
)
print("per-param state keys:", sorted(optimizer.state_dict()["state"][0]))

buffer.seek(0)
checkpoint = torch.load(buffer, weights_only=True)
model, optimizer, scheduler = make_training(fo.NAdam)
model.load_state_dict(checkpoint["model"])
optimizer.load_state_dict(checkpoint["optimizer"])
scheduler.load_state_dict(checkpoint["scheduler"])
resumed_losses += train(model, optimizer, scheduler, EPOCHS - EPOCHS // 2, "resumed")

# the same checkpoint loads into torch's own class
torch_optimizer = torch.optim.NAdam(copy.deepcopy(model).parameters())
torch_optimizer.load_state_dict(checkpoint["optimizer"])
print(f"resumed run, final loss {resumed_losses[-1]:.6f}")

# %% [markdown]
# ## The three loss curves

# %%
fig, ax = plt.subplots(figsize=(7, 4))
ax.plot(torch_losses, label="torch.optim.NAdam", linewidth=3, alpha=0.5)
ax.plot(funcopt_losses, "--", label="funcopt.NAdam")
ax.plot(resumed_losses, ":", label="funcopt.NAdam, checkpointed and resumed halfway")
ax.axvline(EPOCHS // 2, color="gray", linewidth=0.5)
ax.set(yscale="log", xlabel="epoch", ylabel="training loss", title="Same model, same schedule")
ax.legend()
fig.savefig("drop_in_replacement.png", dpi=100)

assert max_diff < 1e-4 and abs(resumed_losses[-1] - funcopt_losses[-1]) < 1e-5
