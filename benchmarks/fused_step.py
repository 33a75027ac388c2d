"""``fused=True`` on the CPU: each class's fused step against the memory-bandwidth floor.

funcopt's ``fused=True`` steps each CPU param with one kernel that inductor compiles from
the algorithm's elementwise math (funcopt/_src/torch/fused.py). On step_time.py's parameter
set (~160 float32 tensors, ~24M elements), for each algorithm, it times, interleaved
round by round (medians):

- ``fo.X(params, fused=True).step()``;
- the floor: per param, a compiled in-place kernel (``torch.compile``, dynamic length,
  as the fused one) that reads the param, its gradient and the same buffers as the step,
  and writes the param and those buffers, with no math beyond an add. Nothing that
  steps in place can move fewer bytes, and it pays the same per-param call overhead;
- torch's fastest eager step: ``torch.optim.X`` with ``foreach=False``, ``foreach=True``
  and, for SGD, Adam, AdamW and Adagrad, ``fused=True`` (torch's hand-written kernels);
- with ``--compiled``, ``torch.compile`` of torch's own step (``foreach=True``; it
  compiles for about a minute per algorithm).

It prints the ratios fused / floor (target: 1.15x at most), fused / torch's fastest eager
step, and fused / torch's compiled step (target: 1.0x at most), with torch's threads,
then again with one thread (``torch.set_num_threads(1)``; kernels are compiled per
thread count). Adafactor's step is not compiled (its math reduces over rows and
columns): it runs the in-place step, and is shown against the same floor.

With ``--first-step`` it also times the first fused step (compiling its kernels) of
each algorithm in a new process, twice: with an empty inductor cache (cold), then in a
second process with the cache the first one filled (warm; target: under 5 s).

For SGD, Adam, AdamW and Adagrad funcopt's ``fused=True`` calls torch's own fused
kernels (funcopt/_src/torch/torch_kernels.py): there the ratio to torch's fused step is
the one to watch (target: 1.0x; 1.05x at most on a GPU).

With ``--device cuda`` it times the same contenders on a GPU (where funcopt's
``fused=True`` runs torch's CUDA kernels for those four, and the adapter's foreach step
for the others), and with ``--compiled`` also ``torch.compile`` of funcopt's own step.

With ``--routes`` it also times the two ways funcopt's ``fused=True`` can step CPU
params, each forced: one compiled graph per group and dtype over the lists of params,
gradients and buffers (funcopt/_src/torch/fused_lists.py, "lists"), and a kernel per
param with tiny params in the in-place step's chunks (fused.py, "per param"). With
``--sets big,tiny`` it times other parameter sets than step_time.py's: ``big``, 10
params of 2.4M elements (24M), and ``tiny``, 300 params of 3 elements.

With ``--write-table PATH`` it writes the tables as Markdown, with a line naming the run.

    python benchmarks/fused_step.py [--rounds 10] [--algorithms Adam,NAdam] [--compiled]
        [--first-step] [--threads 1] [--device cuda] [--routes] [--sets benchmark,big,tiny]
        [--write-table docs/_generated/fused_step.md]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import types

import torch

import funcopt as fo
from funcopt._src.torch import fused_lists

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from step_time import (  # noqa: E402
    benchmark_shapes,
    default_algorithms,
    make_trainable,
    markdown_table,
    measure,
    synchronizer,
    write_table,
)

TORCH_FUSED = {"SGD", "Adam", "AdamW", "Adagrad"}


def _floor_kernel(p: torch.Tensor, g: torch.Tensor, *buffers: torch.Tensor) -> None:
    """Read p, g and the buffers once; write p and the buffers once."""
    total = p + g
    for b in buffers:
        total = total + b
        b.copy_(b + g)
    p.copy_(total)


_FLOORS: dict[int, callable] = {}


def floor_kernel() -> callable:
    """`_floor_kernel` compiled for torch's number of threads now (inductor generates
    serial code for one thread), as funcopt's fused kernels are."""
    threads = torch.get_num_threads()
    if threads not in _FLOORS:
        code = _floor_kernel.__code__.replace(co_name=f"floor_{threads}")  # dynamo compiles per code object
        fn = types.FunctionType(code, _floor_kernel.__globals__, code.co_name)
        _FLOORS[threads] = torch.compile(fn, dynamic=True, fullgraph=True)
    return _FLOORS[threads]


def floor_step(fused: torch.optim.Optimizer) -> callable:
    """The floor for the step of `fused` (stepped once, so its state has every buffer):
    per param, `_FLOOR` on copies of its param, gradient and the state's buffers shaped
    like it (counters and Adafactor's factored buffers are not streamed)."""
    kernel = floor_kernel()
    work = []
    for group in fused.param_groups:
        for p in group["params"]:
            state = fused.state.get(p, {})
            buffers = [
                v for v in state.values() if isinstance(v, torch.Tensor) and v.shape == p.shape and v.dim()
            ]
            # copies, 1-D and no views (dynamo guards on a view's base: a compile per base's shape)
            work.append([t.detach().reshape(-1).clone() for t in (p, p.grad, *buffers)])

    def step() -> None:
        for tensors in work:
            kernel(*tensors)

    return step


def torch_steps(name: str, shapes, device: str) -> dict[str, callable]:
    """torch's eager steps of `name`: the for-loop, foreach, and fused where torch has it."""
    cls = getattr(torch.optim, name)
    steps = {
        "torch": cls(make_trainable(shapes, device), foreach=False).step,
        "torch foreach": cls(make_trainable(shapes, device), foreach=True).step,
    }
    if name in TORCH_FUSED:
        steps["torch fused"] = cls(make_trainable(shapes, device), fused=True).step
    return steps


def compiled_step(cls: type, name: str, shapes, device: str) -> callable:
    """``torch.compile`` of `cls`'s step (torch's own, or funcopt's), compiled here (its
    first two calls)."""
    opt = cls(make_trainable(shapes, device), foreach=True)
    step = torch.compile(opt.step)
    t0 = time.perf_counter()
    step()
    step()
    print(f"  (torch.compile of {cls.__module__.split('.')[0]}'s {name} step: {time.perf_counter() - t0:.0f} s)",
          flush=True)  # fmt: skip
    return step


SETS = {
    "big": lambda: [(2400, 1000)] * 10,
    "tiny": lambda: [(3,)] * 300,
}


def routed(name: str, shapes, device: str, lists: bool) -> callable:
    """funcopt's fused step of `name`, its CPU params forced to the list graph or to
    the per-param kernels (`fused_lists.LISTS_ON_CPU`), compiled here (its first step)."""
    opt = getattr(fo, name)(make_trainable(shapes, device), fused=True)

    def step() -> None:
        default, fused_lists.LISTS_ON_CPU = fused_lists.LISTS_ON_CPU, lists
        try:
            opt.step()
        finally:
            fused_lists.LISTS_ON_CPU = default

    t0 = time.perf_counter()
    step()
    print(f"  (fused {name}, {'lists' if lists else 'per param'}: first step {time.perf_counter() - t0:.1f} s)",
          flush=True)  # fmt: skip
    return step


def timed(
    name: str, shapes, device: str, rounds: int, compiled: bool, routes: bool = False
) -> dict[str, float]:
    """Median step times of the contenders, interleaved round by round."""
    fused = getattr(fo, name)(make_trainable(shapes, device), fused=True)
    t0 = time.perf_counter()
    fused.step()  # compiles its kernels, and creates every buffer
    print(f"  (fused {name}: first step {time.perf_counter() - t0:.1f} s)", flush=True)
    steps = {"fused": fused.step, "floor": floor_step(fused), **torch_steps(name, shapes, device)}
    if routes and name not in TORCH_FUSED:
        steps["lists"] = routed(name, shapes, device, lists=True)
        steps["per param"] = routed(name, shapes, device, lists=False)
    steps["floor"]()  # compiles the floor's kernels
    if compiled:
        steps["torch compiled"] = compiled_step(getattr(torch.optim, name), name, shapes, device)
        if device != "cpu":
            steps["funcopt compiled"] = compiled_step(getattr(fo, name), name, shapes, device)
    times = measure(steps, rounds, sync=synchronizer(device))
    return {label: statistics.median(ts) for label, ts in times.items()}


FIRST_STEP = """
import sys, time, torch, funcopt as fo
sys.path.insert(0, {here!r})
from step_time import benchmark_shapes, make_trainable
opt = getattr(fo, {name!r})(make_trainable(benchmark_shapes()), fused=True)
t0 = time.perf_counter()
opt.step()
print(time.perf_counter() - t0)
"""


def first_steps(name: str) -> tuple[float, float]:
    """The first fused step of `name` in a new process with an empty inductor cache, then
    in another with the cache the first filled: (cold, warm) seconds."""
    here = os.path.dirname(os.path.abspath(__file__))
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache}
        times = []
        for _ in range(2):
            out = subprocess.run(
                [sys.executable, "-c", FIRST_STEP.format(here=here, name=name)],
                env=env, capture_output=True, text=True, check=True,
            )  # fmt: skip
            times.append(float(out.stdout.strip().splitlines()[-1]))
    return times[0], times[1]


def row_of(name: str, t: dict[str, float], args: argparse.Namespace) -> list[str]:
    """A table's row: the times and ratios of `name`'s contenders `t`."""
    eager = min((k for k in t if k.startswith("torch") and k != "torch compiled"), key=t.get)
    ms = lambda seconds: f"{seconds * 1e3:.2f}"  # noqa: E731
    ratio = lambda a, b: f"**{t[a] / t[b]:.2f}x**" if a in t and b in t else "-"  # noqa: E731
    row = [
        name, ms(t["fused"]), ms(t["floor"]), ratio("fused", "floor"),
        f"{ms(t[eager])} ({eager})", ratio("fused", eager),
    ]  # fmt: skip
    row += [ratio("fused", "torch foreach"), ratio("fused", "torch fused")]  # torch's kernels: SGD, Adam, ...
    if args.compiled:
        row += [ms(t["torch compiled"]), ratio("fused", "torch compiled")]
    if "funcopt compiled" in t:
        row += [ms(t["funcopt compiled"]), ratio("funcopt compiled", "torch compiled")]
    if args.routes:
        row += [ms(t["lists"]) if "lists" in t else "-", ms(t["per param"]) if "per param" in t else "-"]
        row += [ratio("lists", "per param"), ratio("lists", "torch foreach")]
        row += [ratio("lists", "torch compiled")] if args.compiled else []
    return row


def header_of(args: argparse.Namespace) -> list[str]:
    header = ["algorithm", "fused ms", "floor ms", "fused / floor", "torch's fastest eager ms", "fused / it",
              "fused / torch foreach", "fused / torch fused"]  # fmt: skip
    if args.compiled:
        header += ["torch.compile'd torch step ms", "fused / it"]
    if args.compiled and args.device != "cpu":
        header += ["torch.compile'd funcopt step ms", "it / torch's"]
    if args.routes:
        header += ["lists ms", "per param ms", "lists / per param", "lists / torch foreach"]
        header += ["lists / torch.compile'd"] if args.compiled else []
    return header


def describe(set_name: str, shapes) -> str:
    numel = sum(torch.Size(s).numel() for s in shapes)
    return f"{set_name}: {len(shapes)} float32 tensors, {numel / 1e6:.1f}M elements"


def first_step_table(algorithms: list[str]) -> str:
    rows = []
    for name in algorithms:
        cold, warm = first_steps(name)
        rows.append([name, f"{cold:.1f}", f"**{warm:.1f}**"])
        print(f"{name}: first step {cold:.1f} s cold, {warm:.1f} s with a warm inductor cache", flush=True)
    print("target: first step with a warm cache < 5 s")
    return "First fused step (compiling), each in a new process:\n\n" + markdown_table(
        ["algorithm", "empty cache s", "warm cache s"], rows
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--algorithms", default=",".join(default_algorithms()))
    parser.add_argument("--compiled", action="store_true", help="also time torch.compile of torch's step")
    parser.add_argument("--first-step", action="store_true", help="time the first step, cold and warm cache")
    parser.add_argument("--threads", help="the thread counts to time, say 1 (default: torch's, then 1)")
    parser.add_argument("--device", default="cpu", help="cuda: a GPU, where fused=True steps as foreach does")
    parser.add_argument(
        "--routes", action="store_true", help="also time the list graph and per-param kernels"
    )
    parser.add_argument("--sets", default="benchmark", help="parameter sets: benchmark, big, tiny")
    parser.add_argument("--write-table", metavar="PATH", help="also write the tables as Markdown to PATH")
    args = parser.parse_args()
    sets = {name: SETS.get(name, benchmark_shapes)() for name in args.sets.split(",")}
    print(f"torch {torch.__version__}; {args.device}")
    algorithms = args.algorithms.split(",")
    threads = torch.get_num_threads()
    tables = []
    counts = [int(n) for n in args.threads.split(",")] if args.threads else sorted({threads, 1}, reverse=True)
    if args.device != "cpu":
        counts = [threads]  # the host's threads barely matter to a GPU's step
    for threads_now in counts:
        torch.set_num_threads(threads_now)
        for set_name, shapes in sets.items():
            print(f"\n{threads_now} thread(s), {describe(set_name, shapes)}")
            rows = []
            for name in algorithms:
                t = timed(name, shapes, args.device, args.rounds, args.compiled, args.routes)
                rows.append(row_of(name, t, args))
                print("  ".join(cell.replace("**", "") for cell in rows[-1]), flush=True)
            title = f"{threads_now} thread(s), {describe(set_name, shapes)}:\n\n"
            tables.append(title + markdown_table(header_of(args), rows))
    torch.set_num_threads(threads)
    print("targets: fused / floor <= 1.15x; fused / torch.compile'd torch step <= 1.0x")
    if args.first_step:
        tables.append(first_step_table(algorithms))
    if args.write_table:
        note = (
            f"Medians of {args.rounds} interleaved rounds. Floor: a compiled kernel per param that reads and writes "
            "the step's tensors (see the script)."
        )
        write_table(args.write_table, "\n".join(tables), args.device, note)


if __name__ == "__main__":
    main()
