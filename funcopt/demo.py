"""``python -m funcopt.demo``: short versions of funcopt's three uses, and a figure.

1. Drop-in: a small MLP trained with ``funcopt.NAdam`` beside ``torch.optim.NAdam``
   (same init, same data, an lr scheduler): the losses and params agree.
2. A learning-rate sweep: 16 training runs in one ``torch.func.vmap`` call, against a
   Python loop over the same 16 runs: the final losses agree to float32 round-off on
   the runs that train stably; the runs of the largest lrs are unstable and named.
3. MAML on sinusoid regression: a second-order, differentiable inner loop of
   ``fo.inner_loop``; adaptation to a new task before and after meta-training.

Writes ``funcopt_demo.png`` (or ``--out PATH``). Needs matplotlib (the ``demo`` extra:
``pip install torch==2.13.0 -e ".[demo]"`` in a clone); without it, only the numbers are printed.
About half a minute on 2 CPU cores, more when they are busy. It prints a line as each
stage starts and ends, and during the long ones; progress bars show on a terminal only.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Iterator, Sequence

import torch
import torch.nn.functional as F
from torch.func import functional_call, vmap

import funcopt as fo


def _say(line: str) -> None:
    """Print a line now: flushed, so a log file or a pipe shows progress as it happens."""
    print(line, flush=True)


def _progress(items: Sequence, desc: str, leave: bool = True) -> Iterator:
    """A tqdm progress bar on a terminal; elsewhere (a log file, a pipe), a line at each
    fifth of the way, with the time so far."""
    try:
        from tqdm.auto import tqdm  # type: ignore[import-untyped]
    except ImportError:
        tqdm = None
    if tqdm is not None and sys.stderr.isatty():
        yield from tqdm(items, desc=desc, leave=leave)
        return
    n, start = len(items), time.perf_counter()
    marks = {n * k // 5 for k in range(1, 5)}
    for i, item in enumerate(items):
        if i in marks:
            _say(f"   {desc}: {i}/{n} ({time.perf_counter() - start:.0f} s)")
        yield item


def _mlp(inputs: int, hidden: int, seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(inputs, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, 1))


def drop_in(steps: int = 200) -> dict:
    """Train the same MLP with torch.optim.NAdam and funcopt.NAdam (StepLR schedule)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(512, 4, generator=g)
    y = torch.sin(2 * x[:, :1]) + 0.5 * x[:, 1:2] ** 2
    losses = {}
    models = {}
    for label, cls in (("torch.optim.NAdam", torch.optim.NAdam), ("funcopt.NAdam", fo.NAdam)):
        _say(f"   training with {label}, {steps} steps")
        model = models[label] = _mlp(4, 64, seed=1)
        opt = cls(model.parameters(), lr=1e-2)
        scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=steps // 4, gamma=0.5)
        curve = []
        for _ in _progress(range(steps), desc=label, leave=False):
            opt.zero_grad()
            loss = F.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            scheduler.step()
            curve.append(loss.item())
        losses[label] = curve
    a, b = (list(m.parameters()) for m in models.values())
    max_diff = max((p - q).abs().max().item() for p, q in zip(a, b))
    return {"losses": losses, "max_param_diff": max_diff}


def lr_sweep(n_lrs: int = 16, steps: int = 100) -> dict:
    """Final loss after `steps` NAdam steps for each lr, all runs in one vmap, and the
    same runs one at a time in a Python loop. Also each run's highest loss during
    training, relative to its loss at the start (above 1: the run was unstable)."""
    model = _mlp(8, 32, seed=0)
    params = {k: v.detach() for k, v in model.named_parameters()}
    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 8, generator=g)
    y = torch.sin(x.sum(1, keepdim=True))

    def loss_fn(p, x, y):
        return F.mse_loss(functional_call(model, p, (x,)), y)

    def final_loss(lr):
        adapted, _, losses = fo.inner_loop(loss_fn, params, fo.nadam(lr=lr), [(x, y)] * steps)
        return loss_fn(adapted, x, y), torch.stack(losses).max() / losses[0]

    lrs = torch.logspace(-4, -0.5, n_lrs)
    _say(f"   {n_lrs} runs of {steps} NAdam steps in one vmap")
    t0 = time.perf_counter()
    batched, peak = vmap(final_loss)(lrs)
    t_vmap = time.perf_counter() - t0
    _say(f"   the same {n_lrs} runs one at a time, in a Python loop")
    t0 = time.perf_counter()
    runs = [final_loss(lr) for lr in _progress(list(lrs), desc="python loop", leave=False)]
    t_loop = time.perf_counter() - t0
    looped, loop_peak = (torch.stack(column) for column in zip(*runs))
    return {
        "lrs": lrs, "final_loss": batched, "loop_final_loss": looped, "t_vmap": t_vmap, "t_loop": t_loop,
        "peak": peak, "loop_peak": loop_peak,
    }  # fmt: skip


def sweep_agreement(sweep: dict) -> list[str]:
    """Lines saying how closely the vmapped runs match the looped ones.

    Batched matrix products sum in another order than single ones, so the two differ by
    float32 round-off, which grows over the steps. In a run whose loss rose above its
    starting value (an lr too large: the run is unstable) it grows chaotically into a
    different trajectory, so those runs are named apart, not counted as agreement."""
    stable = (sweep["peak"] <= 1) & (sweep["loop_peak"] <= 1)
    vmapped, looped = sweep["final_loss"], sweep["loop_final_loss"]
    relative = (vmapped - looped).abs() / looped.abs()
    lines = [
        f"   vmap and loop agree on the {int(stable.sum())} runs whose loss never rose above its start: "
        f"final losses within {relative[stable].max().item() if stable.any() else float('nan'):.0e} "
        "(relative; float32 round-off)"
    ]
    if not stable.all():
        rose = torch.maximum(sweep["peak"], sweep["loop_peak"])[~stable].max().item()
        lrs = ", ".join(f"{lr:.2g}" for lr in sweep["lrs"][~stable].tolist())
        lines.append(
            f"   lr {lrs}: unstable (the loss rose up to {rose:.3g}x its start), where round-off grows "
            f"chaotically: final losses differ by up to {relative[~stable].max().item():.0e}, not compared"
        )
    return lines


def sinusoid_tasks(
    n: int, points: int, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """n sinusoid regression tasks, `points` samples each: x, y, amplitude, phase."""
    amplitude = torch.rand(n, 1, 1, generator=generator) * 4.9 + 0.1
    phase = torch.rand(n, 1, 1, generator=generator) * math.pi
    x = torch.rand(n, points, 1, generator=generator) * 10 - 5
    return x, amplitude * torch.sin(x + phase), amplitude, phase


def sinusoid_model(seed: int = 0) -> torch.nn.Module:
    """The MLP of the MAML paper's sinusoid experiment: 1-40-40-1, ReLU."""
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(1, 40),
        torch.nn.ReLU(),
        torch.nn.Linear(40, 40),
        torch.nn.ReLU(),
        torch.nn.Linear(40, 1),
    )


def maml(meta_iterations: int = 1500, tasks_per_batch: int = 4, inner_steps: int = 1) -> dict:
    """MAML (second order) on sinusoids: meta-learn an init that adapts in a few steps."""
    model = sinusoid_model()
    meta_params = {k: v.detach().clone().requires_grad_() for k, v in model.named_parameters()}
    meta_opt = fo.Adamax(meta_params.values(), lr=3e-3)
    # eps_root: ReLU gives exact-zero gradient entries, where sqrt's derivative would
    # make the meta-gradient NaN (see fo.nadam)
    inner = fo.nadam(lr=0.02, eps_root=1e-16)
    g = torch.Generator().manual_seed(0)

    def loss_fn(p, x, y):
        return F.mse_loss(functional_call(model, p, (x,)), y)

    def adapt(params, x, y, steps):
        adapted, _, _ = fo.inner_loop(loss_fn, params, inner, [(x, y)] * steps)
        return adapted

    # a held-out task, to show adaptation before and after meta-training
    tx, ty, amp, phase = sinusoid_tasks(1, 10, g)
    grid = torch.linspace(-5, 5, 200).unsqueeze(1)
    truth = amp[0] * torch.sin(grid + phase[0])

    def predictions() -> tuple[torch.Tensor, torch.Tensor]:
        params = {k: v.detach() for k, v in meta_params.items()}
        with torch.no_grad():
            before = functional_call(model, params, (grid,))
        after = functional_call(model, adapt(params, tx[0], ty[0], 5), (grid,)).detach()
        return before, after

    def held_out_error(tasks: int = 20) -> float:
        """Mean squared error on 20 new tasks after 5 steps on 10 points of each."""
        x, y, _, _ = sinusoid_tasks(tasks, 110, torch.Generator().manual_seed(123))
        params = {k: v.detach() for k, v in meta_params.items()}
        errors = [loss_fn(adapt(params, x[t, :10], y[t, :10], 5), x[t, 10:], y[t, 10:]) for t in range(tasks)]
        return torch.stack(errors).mean().item()

    _say("   adapting the initial params to 20 new tasks")
    before_meta, error_before = predictions(), held_out_error()
    _say(f"   meta-training: {meta_iterations} meta-iterations of {tasks_per_batch} tasks")
    meta_losses = []
    for _ in _progress(range(meta_iterations), desc="MAML"):
        x, y, _, _ = sinusoid_tasks(tasks_per_batch, 20, g)
        loss = torch.zeros(())
        for t in range(tasks_per_batch):  # adapt on 10 points, evaluate on the other 10
            adapted = adapt(meta_params, x[t, :10], y[t, :10], inner_steps)
            loss = loss + loss_fn(adapted, x[t, 10:], y[t, 10:]) / tasks_per_batch
        meta_opt.zero_grad()
        loss.backward()
        meta_opt.step()
        meta_losses.append(loss.item())
    _say("   adapting the meta-learned params to the 20 new tasks")
    return {
        "grid": grid, "truth": truth, "support": (tx[0], ty[0]), "meta_losses": meta_losses,
        "before_meta": before_meta, "after_meta": predictions(),
        "error_before": error_before, "error_after": held_out_error(),
    }  # fmt: skip


def plot(drop: dict, sweep: dict, meta: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(20, 4.2))
    ax = axes[0]
    for (label, curve), style in zip(drop["losses"].items(), ("-", "--")):
        ax.plot(curve, style, label=label, linewidth=2)
    ax.set(yscale="log", xlabel="step", ylabel="training loss", title="drop-in: funcopt.NAdam vs torch")
    ax.legend()
    ax = axes[1]
    ax.plot(sweep["lrs"], sweep["final_loss"], "o-", label="one vmapped run")
    ax.plot(sweep["lrs"], sweep["loop_final_loss"], "x", label="Python loop")
    ax.set(xscale="log", yscale="log", xlabel="learning rate", ylabel="final loss",
           title=f"lr sweep: vmap {sweep['t_vmap']:.1f}s vs loop {sweep['t_loop']:.1f}s")  # fmt: skip
    ax.legend()
    for ax, (title, (before, after)) in zip(
        axes[2:], (("before meta-training", meta["before_meta"]), ("after meta-training", meta["after_meta"]))
    ):
        ax.plot(meta["grid"], meta["truth"], "k", label="task")
        ax.plot(meta["grid"], before, ":", label="init")
        ax.plot(meta["grid"], after, label="after 5 NAdam steps")
        ax.plot(*meta["support"], "o", label="10 points seen")
        ax.set(title=f"MAML, {title}", xlabel="x", ylim=(-6, 6))
        ax.legend(loc="lower left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="funcopt demo")
    parser.add_argument("--out", default="funcopt_demo.png", help="where to write the figure")
    parser.add_argument("--quick", action="store_true", help="tiny sizes (a few seconds)")
    args = parser.parse_args(argv)
    scale = 0.2 if args.quick else 1.0

    _say("1. drop-in replacement: one MLP trained with torch.optim.NAdam and with funcopt.NAdam")
    drop = drop_in(steps=int(200 * scale))
    _say("   final training loss:")
    for label, curve in drop["losses"].items():
        _say(f"   {label:18} {curve[-1]:.6f}")
    _say(f"   largest parameter difference: {drop['max_param_diff']:.1e}")

    _say("2. lr sweep: 16 learning rates for NAdam, in one vmap and in a Python loop")
    sweep = lr_sweep(n_lrs=16, steps=int(100 * scale))
    best = sweep["final_loss"].argmin()
    _say(f"   one vmap {sweep['t_vmap']:.2f}s, Python loop {sweep['t_loop']:.2f}s "
         f"({sweep['t_loop'] / sweep['t_vmap']:.1f}x); best lr {sweep['lrs'][best]:.2g} "
         f"(final loss {sweep['final_loss'][best]:.4f})")  # fmt: skip
    _say("\n".join(sweep_agreement(sweep)))

    _say("3. MAML on sinusoids: meta-learning an init that adapts in 5 NAdam steps")
    meta = maml(meta_iterations=int(1500 * scale))
    _say(f"   mean error on 20 new tasks after 5 adaptation steps: {meta['error_before']:.2f} "
         f"from the initial params, {meta['error_after']:.2f} from the meta-learned ones")  # fmt: skip

    try:
        plot(drop, sweep, meta, args.out)
    except ImportError:
        _say("(install matplotlib to get the figure: pip install matplotlib)")
    else:
        _say(f"figure written to {args.out}")


if __name__ == "__main__":
    main()
