"""A chain of building blocks in the adapter, against the AdamW class: step time.

``fo.Optimizer(params, lambda lr, weight_decay: fo.chain(fo.scale_by_adam(),
fo.add_decayed_weights(weight_decay), fo.scale_by_learning_rate(lr)), ...)`` runs the
chain's pure update (the generic path: fresh tensors, then written back into the state)
where ``fo.AdamW`` runs its in-place math. On step_time.py's parameter set (~160 float32
tensors, ~24M elements) it times both, and torch.optim.AdamW, interleaved round by
round, and prints the medians and the ratio chain / fo.AdamW; then again with
``torch.set_num_threads(1)`` (on the CPU). Target: within 1.2x.

    python benchmarks/chain_step.py [--rounds 15] [--tiny] [--device cuda]
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
from step_time import benchmark_shapes, make_trainable, synchronizer  # noqa: E402

LR, WEIGHT_DECAY = 1e-3, 1e-2


def adamw_chain(lr: float, weight_decay: float) -> fo.GradientTransformation:
    """AdamW from optax's building blocks."""
    return fo.chain(fo.scale_by_adam(), fo.add_decayed_weights(weight_decay), fo.scale_by_learning_rate(lr))


def contenders(shapes: list[tuple[int, ...]], device: str) -> dict[str, torch.optim.Optimizer]:
    """Each contender with params and gradients of its own."""
    adamw = getattr(fo, "AdamW", torch.optim.AdamW)  # fo.AdamW, where funcopt has it
    made = lambda: make_trainable(shapes, device)  # noqa: E731
    return {
        "chain": fo.Optimizer(made(), adamw_chain, lr=LR, weight_decay=WEIGHT_DECAY),
        "fo.AdamW" if adamw is not torch.optim.AdamW else "torch AdamW": adamw(
            made(), lr=LR, weight_decay=WEIGHT_DECAY
        ),
        "torch foreach": torch.optim.AdamW(made(), lr=LR, weight_decay=WEIGHT_DECAY, foreach=True),
    }


def medians(shapes: list[tuple[int, ...]], rounds: int, device: str, warmup: int = 3) -> dict[str, float]:
    """Median step times over `rounds` rounds, the contenders interleaved in each round,
    pooled over two sittings that run them in opposite orders."""
    times: dict[str, list[float]] = {}
    sync = synchronizer(device)
    for reverse in (False, True):
        made = contenders(shapes, device)
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


def report(title: str, t: dict[str, float]) -> float:
    reference = next(k for k in t if k != "chain" and k != "torch foreach")
    ratio = t["chain"] / t[reference]
    print(
        f"{title:30} "
        + "  ".join(f"{label} {seconds * 1e3:7.2f}ms" for label, seconds in t.items())
        + f"   chain / {reference}: {ratio:.2f}x",
        flush=True,
    )
    return ratio


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--tiny", action="store_true", help="also time 300 tensors of 3 elements")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    shapes = benchmark_shapes()
    numel = sum(torch.Size(s).numel() for s in shapes)
    print(f"torch {torch.__version__}; {len(shapes)} float32 tensors, {numel / 1e6:.1f}M elements")
    sets = [("parameter set", shapes)] + ([("300 tiny tensors", [(3,)] * 300)] if args.tiny else [])
    threads = torch.get_num_threads()
    cpu = torch.device(args.device).type == "cpu"
    for threads_now in sorted({threads, 1}, reverse=True) if cpu else [threads]:
        torch.set_num_threads(threads_now)
        where = f"{threads_now} thread(s)" if cpu else args.device
        for title, s in sets:
            report(f"{title}, {where}", medians(s, args.rounds, args.device))
    torch.set_num_threads(threads)
    print("target: chain / AdamW <= 1.2x")


if __name__ == "__main__":
    main()
