"""A chain of building blocks in the adapter, against the AdamW class: step time.

``fo.Optimizer(params, lambda lr, weight_decay: fo.chain(fo.scale_by_adam(),
fo.add_decayed_weights(weight_decay), fo.scale_by_learning_rate(lr)), ...)`` steps in
place (``funcopt/_src/torch/chain_inplace.py``), as ``fo.AdamW`` does. On step_time.py's
parameter set (~160 float32 tensors, ~24M elements) it times the chain, the chain with a
warmup-cosine schedule as its learning rate, the chain with a 0-d tensor weight decay,
fo.AdamW and torch.optim.AdamW(foreach=True), interleaved round by round, and prints the
medians and the ratio of each chain to fo.AdamW; then again with
``torch.set_num_threads(1)`` (on the CPU). Target: within 1.2x. ``--pure`` also times the
chain forced through the pure update (the path it took before).

With ``--write-table PATH`` it also writes the results as Markdown, with a line naming
the run (command, torch, machine, date), for docs/performance.md to include.

    python benchmarks/chain_step.py [--rounds 15] [--tiny] [--pure] [--device cuda]
        [--write-table docs/_generated/chain_step.md]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

import funcopt as fo

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from step_time import benchmark_shapes, make_trainable, markdown_table, synchronizer, write_table  # noqa: E402

LR, WEIGHT_DECAY = 1e-3, 1e-2
CHAINS = ("chain", "chain, schedule lr", "chain, tensor wd", "chain, pure path")


def adamw_chain(lr: float, weight_decay: float) -> fo.GradientTransformation:
    """AdamW from optax's building blocks."""
    return fo.chain(fo.scale_by_adam(), fo.add_decayed_weights(weight_decay), fo.scale_by_learning_rate(lr))


class PureChain(fo.Optimizer):
    """The chain forced through the pure update (``_step_functional``), as before."""

    def _step_group(self, group, params, grads):
        states = [self.state[p] if p in self.state else {} for p in params]
        skipped = [self.state[p] for p in group["params"] if p.grad is None and self.state.get(p)]
        self._step_functional(
            self._make_transform(self._group_hyperparams(group)), params, grads, states, skipped
        )


def contenders(shapes: list[tuple[int, ...]], device: str, pure: bool) -> dict[str, torch.optim.Optimizer]:
    """Each contender with params and gradients of its own."""
    made = lambda: make_trainable(shapes, device)  # noqa: E731
    schedule = fo.warmup_cosine_decay_schedule(0.0, LR, warmup_steps=100, decay_steps=10_000)
    out = {
        "chain": fo.Optimizer(made(), adamw_chain, lr=LR, weight_decay=WEIGHT_DECAY),
        "chain, schedule lr": fo.Optimizer(made(), adamw_chain, lr=schedule, weight_decay=WEIGHT_DECAY),
        "chain, tensor wd": fo.Optimizer(made(), adamw_chain, lr=LR, weight_decay=torch.tensor(WEIGHT_DECAY)),
        "fo.AdamW": fo.AdamW(made(), lr=LR, weight_decay=WEIGHT_DECAY),
        "torch foreach": torch.optim.AdamW(made(), lr=LR, weight_decay=WEIGHT_DECAY, foreach=True),
    }
    if pure:
        out["chain, pure path"] = PureChain(made(), adamw_chain, lr=LR, weight_decay=WEIGHT_DECAY)
    return out


def medians(
    shapes: list[tuple[int, ...]], rounds: int, device: str, pure: bool, warmup: int = 3
) -> dict[str, float]:
    """Median step times over `rounds` rounds, the contenders interleaved in each round,
    pooled over two sittings that run them in opposite orders."""
    times: dict[str, list[float]] = {}
    sync = synchronizer(device)
    for reverse in (False, True):
        made = contenders(shapes, device, pure)
        order = list(made)[::-1] if reverse else list(made)
        for r in range(warmup + rounds):
            for label in order:
                sync()
                t0 = time.perf_counter()
                made[label].step()
                sync()
                dt = time.perf_counter() - t0
                if r >= warmup:
                    times.setdefault(label, []).append(dt)
    return {label: statistics.median(ts) for label, ts in times.items()}


def report(title: str, t: dict[str, float]) -> list[str]:
    """Print the medians and each chain's ratio to fo.AdamW; return them as a table row."""
    ratios = {label: t[label] / t["fo.AdamW"] for label in CHAINS if label in t}
    print(
        f"{title:30} "
        + "  ".join(f"{label} {seconds * 1e3:7.2f}ms" for label, seconds in t.items())
        + "\n"
        + " " * 31
        + "  ".join(f"{label} / fo.AdamW: {ratio:.2f}x" for label, ratio in ratios.items()),
        flush=True,
    )
    ms = lambda seconds: f"{seconds * 1e3:.2f}"  # noqa: E731
    row = [title, ms(t["fo.AdamW"]), ms(t["torch foreach"])]
    for label in CHAINS[:3]:
        row += [ms(t[label]), f"**{ratios[label]:.2f}x**"]
    return row + ([ms(t[CHAINS[3]]), f"{ratios[CHAINS[3]]:.2f}x"] if CHAINS[3] in t else [])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--tiny", action="store_true", help="also time 300 tensors of 3 elements")
    parser.add_argument("--pure", action="store_true", help="also time the chain on the pure path")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--write-table", metavar="PATH", help="also write the results as Markdown to PATH")
    args = parser.parse_args()
    shapes = benchmark_shapes()
    numel = sum(torch.Size(s).numel() for s in shapes)
    print(f"torch {torch.__version__}; {len(shapes)} float32 tensors, {numel / 1e6:.1f}M elements")
    sets = [("parameter set", shapes)] + ([("300 tiny tensors", [(3,)] * 300)] if args.tiny else [])
    threads = torch.get_num_threads()
    cpu = torch.device(args.device).type == "cpu"
    rows = []
    for threads_now in sorted({threads, 1}, reverse=True) if cpu else [threads]:
        torch.set_num_threads(threads_now)
        where = f"{threads_now} thread(s)" if cpu else args.device
        for title, s in sets:
            rows.append(report(f"{title}, {where}", medians(s, args.rounds, args.device, args.pure)))
    torch.set_num_threads(threads)
    print("target: chain / AdamW <= 1.2x")
    if args.write_table:
        header = ["set", "fo.AdamW ms", "torch foreach ms"]
        for label in CHAINS[:3]:
            header += [f"{label} ms", "/ fo.AdamW"]
        header += [f"{CHAINS[3]} ms", "/ fo.AdamW"] if args.pure else []
        note = (
            f"{len(shapes)} float32 tensors, {numel / 1e6:.1f}M elements (the tiny set: 300 tensors of 3); "
            f"medians of {2 * args.rounds} interleaved rounds; schedule lr: warmup-cosine; tensor wd: a 0-d "
            "float32 tensor."
        )
        write_table(args.write_table, markdown_table(header, rows), args.device, note)


if __name__ == "__main__":
    main()
