"""Optimizer step time: funcopt against torch.optim, measured in the same run.

For each algorithm, on a fixed set of ~160 float32 tensors (~25M elements, a ResNet +
transformer mix), it times

- torch.optim.X() (the for-loop path, torch's CPU default) and X(foreach=True),
- funcopt.X().step() (the adapter),
- tx.update + fo.apply_updates (the pure functional path),

interleaved round by round, and prints medians and ratios to the faster torch path.
The medians pool two sittings that create and run the contenders in opposite orders
(see `timed`). Then it times the adapter on 300 tiny tensors, where Python overhead
dominates.

Targets: adapter <= 1.05x, functional <= 2.0x, adapter on tiny tensors <= 1.1x.

With ``--models`` it then times the adapter on the parameter sets of a few models
(`MODELS`), each algorithm and model in a new process, and counts its page faults per
step: a step's time depends on the heap's history, which one process would share.

With ``--write-table PATH`` it also writes the main table as Markdown, with a line naming
the run (command, torch, machine, date), for docs/performance.md to include.

    python benchmarks/step_time.py [--rounds 15] [--algorithms NAdam,Adamax] [--device cuda] [--models]
        [--write-table docs/_generated/step_time.md]
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time

try:
    import resource
except ImportError:  # not POSIX
    resource = None  # type: ignore[assignment]

import optree
import torch

import funcopt as fo

# not timed on this parameter set: LBFGS's step takes a closure, SparseAdam takes sparse
# gradients only, Muon steps 2-D params only
UNTIMED = {"LBFGS", "SparseAdam", "Muon"}


def default_algorithms() -> list[str]:
    """Every class funcopt has that torch.optim also has (but `UNTIMED`), in torch's order."""
    return [
        name
        for name, cls in vars(torch.optim).items()
        if isinstance(cls, type) and issubclass(cls, torch.optim.Optimizer) and cls is not torch.optim.Optimizer
        and name in fo.__all__ and name not in UNTIMED
    ]  # fmt: skip


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows]) + "\n"


def machine(device: str = "cpu") -> str:
    """The hardware a figure was measured on: the GPU, or the CPU and torch's threads."""
    if torch.device(device).type == "cuda":
        return torch.cuda.get_device_name(device)
    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            name = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), name)
    except OSError:
        pass
    return f"{name}, {os.cpu_count()} cores, {torch.get_num_threads()} torch thread(s)"


def funcopt_version() -> str:
    """funcopt's version, and its git commit where it runs from a clone."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(fo.__file__)))
    git = ["git", "-C", root]
    try:
        commit = subprocess.run(
            [*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        )
        changes = subprocess.run(
            [*git, "status", "--porcelain", "--", "funcopt"], capture_output=True, text=True
        )
    except (OSError, subprocess.CalledProcessError):
        return f"funcopt {fo.__version__}"
    local = " with uncommitted changes" if changes.stdout.strip() else ""
    return f"funcopt {fo.__version__} at {commit.stdout.strip()}{local}"


def write_table(path: str, table: str, device: str = "cpu", note: str = "") -> None:
    """Write a benchmark's Markdown table to `path` (docs/performance.md includes it),
    under a line that says how, where and when it was measured."""
    command = shlex.join(["python", os.path.relpath(sys.argv[0]), *sys.argv[1:]])
    load = f"; load average {os.getloadavg()[0]:.1f} at the end" if hasattr(os, "getloadavg") else ""
    when = datetime.date.today().isoformat()
    with open(path, "w") as f:
        f.write(
            f"{table}\n_`{command}`, {when}: {funcopt_version()}, torch {torch.__version__}, {machine(device)}{load}."
        )
        f.write(f" {note}_\n" if note else "_\n")
    print(f"table written to {path}")


def benchmark_shapes() -> list[tuple[int, ...]]:
    """160 tensors, ~24M elements, 107 of them under 4096 elements."""
    shapes: list[tuple[int, ...]] = [(64, 3, 7, 7), (64,), (64,)]
    # ResNet-like: 3x3 convs, each with batch-norm weight and bias; 1x1 projections
    for channels, convs in [(64, 4), (128, 4), (256, 6), (512, 4)]:
        shapes += [(channels, channels, 3, 3), (channels,), (channels,)] * convs
    for c in (64, 128, 256):
        shapes += [(2 * c, c, 1, 1), (2 * c,), (2 * c,)]
    shapes += [(256, 64, 1, 1), (256,)] * 12 + [(64,)] * 18
    # transformer-like: 3 blocks of width 512 (attention, MLP, two layer norms)
    for _ in range(3):
        shapes += [(512, 512), (512,)] * 4
        shapes += [(2048, 512), (2048,), (512, 2048), (512,)]
        shapes += [(512,), (512,)] * 2
    shapes += [(1000, 512), (1000,), (512,), (512,)]
    return shapes


def mobilenet_v2_shapes() -> list[tuple[int, ...]]:
    """MobileNetV2's 158 tensors (3.5M elements): mostly small and mid-size."""
    shapes: list[tuple[int, ...]] = [(32, 3, 3, 3), (32,), (32,)]
    cin = 32
    for t, c, n in [(1, 16, 1), (6, 24, 2), (6, 32, 3), (6, 64, 4), (6, 96, 3), (6, 160, 3), (6, 320, 1)]:
        for _ in range(n):
            hidden = cin * t
            if t != 1:
                shapes += [(hidden, cin, 1, 1), (hidden,), (hidden,)]
            shapes += [(hidden, 1, 3, 3), (hidden,), (hidden,), (c, hidden, 1, 1), (c,), (c,)]
            cin = c
    return shapes + [(1280, 320, 1, 1), (1280,), (1280,), (1000, 1280), (1000,)]


def resnet18_shapes() -> list[tuple[int, ...]]:
    """ResNet-18's 62 tensors (11.7M elements)."""
    shapes: list[tuple[int, ...]] = [(64, 3, 7, 7), (64,), (64,)]
    cin = 64
    for c in (64, 128, 256, 512):
        for block in range(2):
            shapes += [(c, cin, 3, 3), (c,), (c,), (c, c, 3, 3), (c,), (c,)]
            if block == 0 and cin != c:
                shapes += [(c, cin, 1, 1), (c,), (c,)]
            cin = c
    return shapes + [(1000, 512), (1000,)]


MODELS = {
    "MobileNetV2": mobilenet_v2_shapes,
    "ResNet-18": resnet18_shapes,
    "MLP 40x(64x64)": lambda: [(64, 64), (64,)] * 40,
    "small CNN": lambda: [(32, 32, 3, 3), (32,), (32,)] * 10 + [(16, 16, 3, 3), (16,), (16,)] * 10,
}


def make_params(shapes, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    params = [(torch.randn(s, generator=g) * 0.1).to(device) for s in shapes]
    grads = [(torch.randn(s, generator=g) * 0.01).to(device) for s in shapes]
    return params, grads


def make_trainable(shapes, device="cpu") -> list[torch.nn.Parameter]:
    """`make_params` as Parameters, each with its gradient in ``.grad``."""
    params, grads = make_params(shapes, device=device)
    params = [torch.nn.Parameter(p) for p in params]
    for p, g in zip(params, grads):
        p.grad = g
    return params


def synchronizer(device: str):
    """What to call before reading the clock: a step on a GPU only queues its kernels."""
    return torch.cuda.synchronize if torch.device(device).type == "cuda" else lambda: None


def pure_step(tx: fo.GradientTransformation) -> callable:
    """`tx`'s whole pure step as one function (to compile): update, then apply_updates."""

    def step(grads, state, params):
        updates, state = tx.update(grads, state, params)
        return fo.apply_updates(params, updates), state

    return step


def written_back_step(tx: fo.GradientTransformation) -> callable:
    """`pure_step` with its results copied back into its inputs inside the function:
    compiled, inductor then writes them in place (not pure; see recipes.md)."""
    pure = pure_step(tx)

    def step(grads, state, params):
        new = optree.tree_leaves(pure(grads, state, params))
        for dst, src in zip(optree.tree_leaves((params, state)), new):
            dst.copy_(src)

    return step


TORCH_FUSED = ("SGD", "Adam", "AdamW", "Adagrad")
EXTRA = ("torch foreach", "torch fused", "torch compiled")
"""torch's steps that the adapter's is also shown against, one by one, where timed."""


def builders(name: str, shapes, device="cpu", compiled: bool = False) -> dict[str, callable]:
    """For each contender, a function that creates it (its own params and state) and
    returns its step. On a GPU, torch's fused step too (where torch has one), and with
    `compiled` torch.compile of torch's foreach step (it compiles in the warm-up)."""

    def adapter_like(make):
        return lambda: make(make_trainable(shapes, device)).step

    def pure():
        params, grads = make_params(shapes, device=device)
        tx = getattr(fo, name.lower())()
        box = {"params": params, "state": tx.init(params)}

        def step():
            updates, box["state"] = tx.update(grads, box["state"], box["params"])
            box["params"] = fo.apply_updates(box["params"], updates)

        return step

    made = {
        "torch": adapter_like(lambda ps: getattr(torch.optim, name)(ps, foreach=False)),
        "torch foreach": adapter_like(lambda ps: getattr(torch.optim, name)(ps, foreach=True)),
        "funcopt adapter": adapter_like(lambda ps: getattr(fo, name)(ps)),
        "funcopt functional": pure,
    }
    if torch.device(device).type != "cpu" and name in TORCH_FUSED:
        made["torch fused"] = adapter_like(lambda ps: getattr(torch.optim, name)(ps, fused=True))
    if compiled:
        made["torch compiled"] = lambda: torch.compile(
            getattr(torch.optim, name)(make_trainable(shapes, device), foreach=True).step
        )
    return made


def contenders(
    name: str, shapes, device="cpu", reverse: bool = False, functional: bool = True, compiled: bool = False
) -> dict[str, callable]:
    """Each contender owns its params and state; calling it performs one step. They are
    created, and later run, in this order, or in the reverse one."""
    made = builders(name, shapes, device, compiled)
    if not functional:
        del made["funcopt functional"]
    labels = list(made)[::-1] if reverse else list(made)
    return {label: made[label]() for label in labels}


def measure(
    steps: dict[str, callable], rounds: int, warmup: int = 3, sync=lambda: None
) -> dict[str, list[float]]:
    """Each step's times over `rounds` rounds, the steps interleaved in each round."""
    times: dict[str, list[float]] = {k: [] for k in steps}
    for r in range(warmup + rounds):
        for label, step in steps.items():
            sync()
            t0 = time.perf_counter()
            step()
            sync()
            dt = time.perf_counter() - t0
            if r >= warmup:
                times[label].append(dt)
    return times


def interleaved(fns: dict, rounds: int, warmup: int = 2, sync=lambda: None) -> dict[str, float]:
    """Each function's median time over `rounds` rounds, interleaved in each round."""
    return {k: statistics.median(v) for k, v in measure(fns, rounds, warmup, sync).items()}


def timed(
    name: str, shapes, device: str, rounds: int, sync=lambda: None, compiled: bool = False
) -> dict[str, float]:
    """Median step times, pooled over two sittings that create and run the contenders in
    opposite orders: within one process, the contender created first measured up to 10%
    slower than the same code created later (300 tiny tensors), which favours the others."""
    times: dict[str, list[float]] = {}
    for reverse in (False, True):
        steps = contenders(name, shapes, device, reverse, compiled=compiled)
        for label, ts in measure(steps, rounds, sync=sync).items():
            times.setdefault(label, []).extend(ts)
    return {label: statistics.median(ts) for label, ts in times.items()}


def page_faults() -> int:
    """Page faults of this process so far (0 where not POSIX)."""
    return 0 if resource is None else resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def model_step(name: str, model: str, device: str, rounds: int) -> None:
    """The adapter's step on one model's params against torch's faster step, and its most
    page faults in a step; run in a process of its own (see `models`). The functional
    update is left out: its fresh memory would change the heap that the others see."""
    steps = contenders(name, MODELS[model](), device, functional=False)
    adapter, faults = steps["funcopt adapter"], []

    def counted():
        before = page_faults()
        adapter()
        faults.append(page_faults() - before)

    steps["funcopt adapter"] = counted
    warmup = 3
    t = interleaved(steps, rounds, warmup, sync=synchronizer(device))
    ratio = t["funcopt adapter"] / min(t["torch"], t["torch foreach"])
    print(
        f"{name:10} {model:16} {t['funcopt adapter'] * 1e3:7.2f}ms {ratio:6.2f}x {max(faults[warmup:]):7d}",
        flush=True,
    )


def models(algorithms: list[str], device: str, rounds: int) -> None:
    """`model_step` for each algorithm and model, each in a new process."""
    print(
        f"\n{'algorithm':10} {'model':16} {'adapter':>9} {'ratio':>7} {'faults':>7}  (ratio to torch's faster step)"
    )
    for name in algorithms:
        for model in MODELS:
            options = [f"--model-step={name}:{model}", f"--rounds={rounds}", f"--device={device}"]
            subprocess.run([sys.executable, __file__, *options], check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--algorithms", default=",".join(default_algorithms()))
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--models", action="store_true", help="also time the adapter on model-shaped sets")
    parser.add_argument("--model-step", help=argparse.SUPPRESS)  # ALGORITHM:MODEL, run by --models
    parser.add_argument("--write-table", metavar="PATH", help="also write the table as Markdown to PATH")
    parser.add_argument("--compiled", action="store_true", help="also time torch.compile of torch's step")
    args = parser.parse_args()
    if args.model_step:
        model_step(*args.model_step.split(":", 1), args.device, args.rounds)
        return
    sync = synchronizer(args.device)

    shapes = benchmark_shapes()
    numel = sum(torch.Size(s).numel() for s in shapes)
    small = sum(torch.Size(s).numel() < 4096 for s in shapes)
    where = (
        torch.cuda.get_device_name(args.device)
        if torch.device(args.device).type == "cuda"
        else f"{torch.get_num_threads()} threads"
    )
    print(f"torch {torch.__version__}, {where}")
    print(f"parameter set: {len(shapes)} float32 tensors, {numel / 1e6:.1f}M elements, {small} under 4096")
    tiny = [(3,)] * 300
    header = (
        f"{'algorithm':10} {'torch':>8} {'foreach':>8} {'adapter':>8} {'functional':>10}  {'adapter/torch':>13} "
        f"{'functional/torch':>16}   tiny: {'torch':>7} {'adapter':>7} {'ratio':>6} {'functional':>10} {'ratio':>6}"
    )
    print(header)
    print("-" * len(header))
    rows = []
    # ratios to each of torch's steps, on a GPU (where torch has fused steps) or with --compiled
    columns = [
        label for label in EXTRA if torch.device(args.device).type != "cpu" or label == "torch compiled"
    ]
    columns = [label for label in columns if label != "torch compiled" or args.compiled]
    for name in args.algorithms.split(","):
        t = timed(name, shapes, args.device, args.rounds, sync, compiled=args.compiled)
        best = min(t["torch"], t["torch foreach"])
        tt = timed(name, tiny, args.device, args.rounds * 4, sync)
        tiny_best = min(tt["torch"], tt["torch foreach"])
        ms = lambda seconds: f"{seconds * 1e3:.1f}"  # noqa: E731
        rows.append([
            name, ms(t["torch"]), ms(t["torch foreach"]), ms(t["funcopt adapter"]), ms(t["funcopt functional"]),
            f"**{t['funcopt adapter'] / best:.2f}x**", f"**{t['funcopt functional'] / best:.2f}x**",
            f"{tiny_best * 1e3:.2f}", f"{tt['funcopt adapter'] * 1e3:.2f}", f"**{tt['funcopt adapter'] / tiny_best:.2f}x**",
        ])  # fmt: skip
        extra = [label for label in EXTRA if label in t]
        rows[-1] += [
            f"**{t['funcopt adapter'] / t[label]:.2f}x**" if label in t else "-" for label in columns
        ]
        if extra:
            print(
                "  adapter / "
                + ", ".join(f"{label}: {t['funcopt adapter'] / t[label]:.2f}x" for label in extra)
            )
        print(
            f"{name:10} {t['torch'] * 1e3:7.1f}ms {t['torch foreach'] * 1e3:7.1f}ms "
            f"{t['funcopt adapter'] * 1e3:7.1f}ms {t['funcopt functional'] * 1e3:9.1f}ms  "
            f"{t['funcopt adapter'] / best:12.2f}x {t['funcopt functional'] / best:15.2f}x   "
            f"      {tiny_best * 1e3:6.2f}ms {tt['funcopt adapter'] * 1e3:6.2f}ms {tt['funcopt adapter'] / tiny_best:5.2f}x "
            f"{tt['funcopt functional'] * 1e3:8.2f}ms {tt['funcopt functional'] / tiny_best:5.2f}x",
            flush=True,
        )
    print("targets: adapter <= 1.05x, functional <= 2.0x, adapter on 300 tiny tensors <= 1.1x")
    print("(the functional update on the tiny tensors has no target: it allocates every new tensor)")
    if args.write_table:
        header = [
            "algorithm", "torch ms", "torch foreach ms", "adapter ms", "functional ms", "adapter / torch",
            "functional / torch", "300 tiny: torch ms", "adapter ms", "adapter / torch",
        ] + [f"adapter / {label}" for label in columns]  # fmt: skip
        note = (
            f"{len(shapes)} float32 tensors, {numel / 1e6:.1f}M elements; medians of {2 * args.rounds} "
            f"interleaved rounds ({4 * 2 * args.rounds} on the tiny tensors); ratios to torch's faster step."
        )
        write_table(args.write_table, markdown_table(header, rows), args.device, note)
    if args.models:
        models(args.algorithms.split(","), args.device, args.rounds * 2)


if __name__ == "__main__":
    main()
