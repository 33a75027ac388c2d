"""Step time of the catalogue's drop-in classes against their reference torch packages,
measured in the same run.

For each class, on `step_time.benchmark_shapes` (~160 float32 tensors, ~24M elements),
it times the funcopt class's ``step()`` against its reference, interleaved round by
round (`step_time.measure`), in two sittings that create and run the contenders in
opposite orders, and prints the medians and their ratio. The references:

- ``prodigyopt.Prodigy`` for `fo.Prodigy`; ``dadaptation.DAdaptAdam(decouple=True)``
  for `fo.DAdaptAdamW`; ``schedulefree``'s classes for `fo.AdamWScheduleFree` and
  `fo.SGDScheduleFree` (each in train mode);
- timm's classes (loaded from its optimizer modules alone, see ``tests/timm_loader.py``;
  install timm with ``pip install --no-deps timm==1.0.31``) for `fo.Lamb`, `fo.Lion`,
  `fo.Adan`, `fo.Lars`, `fo.AdaBelief`, `fo.NAdamW`, `fo.MADGRAD`, `fo.NovoGrad` and
  `fo.Adopt`, with the same arguments (Lamb, Lars, Adan, AdaBelief, MADGRAD and NovoGrad
  follow timm's math; Lion, NAdamW and Adopt optax's, which differs where the algorithm
  pages say);
- the classes with no reference package are timed against
  ``torch.optim.AdamW(foreach=True)``, a yardstick of what an Adam-like step costs,
  not a reference.

Target (issue 64): at most 1.0x the reference package's step.

    python benchmarks/catalogue_step.py [--rounds 5] [--classes Prodigy,Lamb] [--threads 1] [--model MobileNetV2]
        [--write-table docs/_generated/catalogue_step.md]
"""

from __future__ import annotations

import argparse
import importlib
import os
import statistics
import sys
import warnings
from collections.abc import Callable
from typing import Any

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from step_time import MODELS, benchmark_shapes, make_trainable, markdown_table, measure, write_table  # noqa: E402
from timm_loader import timm_optimizers  # noqa: E402

import funcopt as fo  # noqa: E402

ADAMW = ("torch.optim", "AdamW", {"foreach": True})
# class -> (its keyword arguments, and the reference (module, class, extra keyword arguments))
CLASSES: dict[str, tuple[dict[str, Any], tuple[str, str, dict[str, Any]]]] = {
    "Prodigy": ({"weight_decay": 0.01}, ("prodigyopt", "Prodigy", {})),
    "DAdaptAdamW": ({"weight_decay": 0.01}, ("dadaptation", "DAdaptAdam", {"decouple": True})),
    "AdamWScheduleFree": ({"lr": 1e-3, "weight_decay": 0.01}, ("schedulefree", "AdamWScheduleFree", {})),
    "SGDScheduleFree": ({"lr": 0.1, "weight_decay": 0.01}, ("schedulefree", "SGDScheduleFree", {})),
    "Lamb": ({"lr": 1e-3, "weight_decay": 0.01}, ("timm", "Lamb", {})),
    "Lion": ({"lr": 1e-4, "weight_decay": 0.01}, ("timm", "Lion", {})),
    "Adan": ({"lr": 1e-3, "weight_decay": 0.01}, ("timm", "Adan", {})),
    "Lars": ({"lr": 0.1, "momentum": 0.9, "weight_decay": 0.01}, ("timm", "Lars", {})),
    "AdaBelief": ({"lr": 1e-3}, ("timm", "AdaBelief", {})),
    "NAdamW": ({"lr": 1e-3}, ("timm", "NAdamW", {})),
    "MADGRAD": ({"lr": 1e-2, "weight_decay": 0.01}, ("timm", "MADGRAD", {})),
    "NovoGrad": ({"lr": 1e-3, "weight_decay": 0.01}, ("timm", "NvNovoGrad", {})),
    "Adopt": ({"lr": 1e-3}, ("timm", "Adopt", {})),
    "AdEMAMix": ({"lr": 1e-3}, ADAMW),
    "Yogi": ({"lr": 1e-2}, ADAMW),
    "Signum": ({"lr": 1e-3}, ADAMW),
    "Momo": ({"lr": 0.5, "weight_decay": 0.01}, ADAMW),
    "PolyakSGD": ({"max_lr": 0.3}, ADAMW),
    "SM3": ({"lr": 0.1}, ADAMW),
}
NEEDS_LOSS = {"Momo", "PolyakSGD"}  # their step(closure) reads the loss (a constant here; AdamW's ignores it)


def reference_name(name: str) -> str:
    module, cls, extra = CLASSES[name][1]
    options = ", ".join(f"{k}={v}" for k, v in extra.items())
    return f"{module}.{cls}({options})"


def builders(name: str, shapes: list[tuple[int, ...]]) -> dict[str, Callable[[], Callable[[], Any]]]:
    """The two contenders of `name`, each a function that creates it (its own params,
    gradients and state) and returns its step."""
    kwargs, (module, cls, extra) = CLASSES[name]
    if module == "timm":
        timm = timm_optimizers()
        if timm is None:
            raise SystemExit("timm is not installed: pip install --no-deps timm==1.0.31")
        reference_cls = getattr(timm, cls)
    else:
        reference_cls = getattr(importlib.import_module(module), cls)
    ref_kwargs = (
        {**kwargs, **extra} if module != "torch.optim" else {"lr": 1e-3, "weight_decay": 0.01, **extra}
    )

    def loss() -> torch.Tensor:
        return torch.tensor(1.0)

    def make(factory: Callable[[list[torch.nn.Parameter]], Any]) -> Callable[[], Callable[[], Any]]:
        def build() -> Callable[[], Any]:
            params = make_trainable(shapes)
            grads = [p.grad for p in params]
            opt = factory(params)
            if hasattr(opt, "train") and "ScheduleFree" in name:
                opt.train()

            def step() -> None:
                for p, g in zip(params, grads):  # schedulefree overwrites p.grad: give it back
                    p.grad = g
                opt.step(loss if name in NEEDS_LOSS else None)

            return step

        return build

    return {
        "reference": make(lambda ps: reference_cls(ps, **ref_kwargs)),
        "funcopt": make(lambda ps: getattr(fo, name)(ps, **kwargs)),
    }


def timed(name: str, shapes: list[tuple[int, ...]], rounds: int) -> dict[str, float]:
    """Median step times over two sittings in opposite orders (see step_time.timed)."""
    times: dict[str, list[float]] = {}
    made = builders(name, shapes)
    for reverse in (False, True):
        labels = list(made)[::-1] if reverse else list(made)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            steps = {label: made[label]() for label in labels}
            for label, ts in measure(steps, rounds, warmup=2).items():
                times.setdefault(label, []).extend(ts)
        del steps
    return {label: statistics.median(ts) for label, ts in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--classes", default=",".join(CLASSES))
    parser.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: torch's default)")
    parser.add_argument(
        "--model", choices=list(MODELS), help="time on this model's params (default: step_time's set)"
    )
    parser.add_argument("--write-table", metavar="PATH", help="also write the table as Markdown to PATH")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    shapes = MODELS[args.model]() if args.model else benchmark_shapes()
    numel = sum(torch.Size(s).numel() for s in shapes)
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads; {len(shapes)} tensors, {numel / 1e6:.1f}M"
    )
    print(f"{'class':18} {'reference':44} {'ref ms':>8} {'funcopt ms':>10} {'ratio':>6}")
    rows = []
    for name in args.classes.split(","):
        t = timed(name, shapes, args.rounds)
        ratio = t["funcopt"] / t["reference"]
        ref = reference_name(name)
        print(
            f"{name:18} {ref:44} {t['reference'] * 1e3:8.1f} {t['funcopt'] * 1e3:10.1f} {ratio:5.2f}x",
            flush=True,
        )
        rows.append(
            [
                name,
                f"`{ref}`",
                f"{t['reference'] * 1e3:.1f}",
                f"{t['funcopt'] * 1e3:.1f}",
                f"**{ratio:.2f}x**",
            ]
        )
    print("target: <= 1.0x a reference package (torch.optim.AdamW is a yardstick, not a reference)")
    if args.write_table:
        header = ["class", "reference", "reference ms", "funcopt ms", "funcopt / reference"]
        note = (
            f"{len(shapes)} float32 tensors, {numel / 1e6:.1f}M elements; medians of {2 * args.rounds} interleaved "
            "rounds. torch.optim.AdamW(foreach=True) is a yardstick, not a reference."
        )
        write_table(args.write_table, markdown_table(header, rows), note=note)


if __name__ == "__main__":
    main()
