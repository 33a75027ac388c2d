"""Step time of `fo.Momo`, `fo.PolyakSGD` and `fo.SM3` (in place) against the earlier
classes: `fo.Optimizer` over their functional forms (`fo.momo`, `fo.polyak_sgd`,
`fo.sm3`), which is what those classes were. Interleaved round by round
(`step_time.measure`), in two sittings that create the contenders in opposite orders;
prints the medians and their ratio.

    python benchmarks/inplace_before_after.py [--rounds 5] [--threads 1] [--sets 1M,24M]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from collections.abc import Callable
from typing import Any

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from step_time import benchmark_shapes, make_trainable, measure  # noqa: E402

import funcopt as fo  # noqa: E402

SETS = {"1M": lambda: [(256, 256), (256,)] * 16, "24M": benchmark_shapes}
# class -> (its keyword arguments, the earlier class's factory of the same arguments)
CLASSES: dict[str, tuple[dict[str, Any], Callable[..., Any]]] = {
    "Momo": (
        {"lr": 0.5, "weight_decay": 0.01},
        lambda lr, beta, lower_bound, weight_decay, adapt_lower_bound: fo.momo(
            lr,
            beta=beta,
            lower_bound=lower_bound,
            weight_decay=weight_decay,
            adapt_lower_bound=adapt_lower_bound,
        ),
    ),
    "PolyakSGD": (
        {"max_lr": 0.3},
        lambda lr, max_lr, f_min, eps, variant: fo.polyak_sgd(
            max_learning_rate=max_lr, scaling=lr, f_min=f_min, eps=eps, variant=variant
        ),
    ),
    "SM3": ({"lr": 0.1}, lambda lr, momentum: fo.sm3(lr, momentum=momentum)),
}
DEFAULTS = {
    "Momo": dict(lr=1.0, beta=0.9, lower_bound=0.0, weight_decay=0.0, adapt_lower_bound=False),
    "PolyakSGD": dict(lr=1.0, max_lr=1.0, f_min=0.0, eps=0.0, variant="sps"),
    "SM3": dict(lr=0.1, momentum=0.9),
}


def contenders(name: str, shapes: list[tuple[int, ...]], reverse: bool) -> dict[str, Callable[[], Any]]:
    kwargs, factory = CLASSES[name]

    def new() -> Callable[[], Any]:
        params = make_trainable(shapes)
        opt = getattr(fo, name)(params, **kwargs)
        return lambda: opt.step(lambda: torch.tensor(1.0))

    def earlier() -> Callable[[], Any]:
        params = make_trainable(shapes)
        opt = fo.Optimizer(params, factory, **{**DEFAULTS[name], **kwargs})
        return lambda: opt.step(lambda: torch.tensor(1.0))

    makers = [("before (fo.Optimizer, functional)", earlier), ("after (in place)", new)]
    return {label: make() for label, make in (reversed(makers) if reverse else makers)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--sets", default="1M,24M")
    parser.add_argument("--classes", default=",".join(CLASSES))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s); load {os.getloadavg()}")
    for set_name in args.sets.split(","):
        shapes = SETS[set_name]()
        n = sum(torch.Size(s).numel() for s in shapes)
        for name in args.classes.split(","):
            times: dict[str, list[float]] = {}
            for reverse in (False, True):
                for label, ts in measure(contenders(name, shapes, reverse), args.rounds).items():
                    times.setdefault(label, []).extend(ts)
            before, after = (statistics.median(ts) * 1e3 for ts in times.values())
            print(
                f"{set_name} ({len(shapes)} tensors, {n / 1e6:.1f}M) {name}: before {before:.2f} ms, "
                f"after {after:.2f} ms, after/before {after / before:.2f}"
            )
    print(f"load {os.getloadavg()}")


if __name__ == "__main__":
    main()
