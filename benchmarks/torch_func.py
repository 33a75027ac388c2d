"""Differentiable and batched optimization: funcopt measured against the alternative in
the same run.

1. A sweep of 16 learning rates in one ``vmap``-ed training run, against 16 runs in a
   Python loop, on a small MLP (target: at least 4x faster).
2. A MAML meta-iteration (second-order, differentiable inner loop) with
   ``fo.inner_loop`` + ``fo.adamax``, against the same loop written with plain tensor
   math by hand (target: overhead at most 1.2x).
3. The compiled pure functional step, ``torch.compile(update + apply_updates)``, on the
   step_time.py parameter set (~24M elements), against the faster of torch.optim.X()
   and X(foreach=True) eager (target: at most 0.8x). Compiling takes a while. Each
   algorithm runs in a new process, as a training run would (the pure step's speed
   depends on the heap's history), twice: with glibc's default allocator settings, then
   with freed memory kept in the process (see ``keep_freed_memory``), which removes the
   page faults a pure step can otherwise pay for its fresh outputs. For reference it
   also times the same compiled update with its results copied back into the inputs (in
   place, not pure), and then, apart, ``torch.compile(update)`` alone, as the target
   is worded: it neither reads nor writes the params.

4. With ``--compiled-adapter``: ``torch.compile(optimizer.step)`` of funcopt's adapter
   against torch.optim's compiled step, on the same parameter set, with the time of the
   first (compiling) step of each, each with an empty inductor cache. No target; it
   takes several minutes.

With ``--device cuda`` sections 3 and 4 run on the GPU (section 3 once: the allocator
settings concern the CPU); sections 1 and 2 stay on the CPU.

``--quick`` runs section 3 for Adamax and NAdam only (unless ``--algorithms`` names
others), with glibc's default settings only, and times only the compiled pure step
there (one compilation per algorithm instead of six): a few minutes instead of many. With
``--write-table PATH`` it also writes its results as a Markdown table, with a line naming
the run, for docs/performance.md to include.

    python benchmarks/torch_func.py [--quick] [--skip-compile] [--compiled-adapter] [--algorithms NAdam,Adamax]
        [--device cuda] [--write-table docs/_generated/torch_func.md]
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.func import functional_call, grad, vmap

import funcopt as fo
from funcopt.demo import sinusoid_model, sinusoid_tasks

sys.path.insert(0, str(Path(__file__).parent))
from step_time import (  # noqa: E402
    benchmark_shapes,
    default_algorithms,
    interleaved,
    make_params,
    make_trainable,
    markdown_table,
    page_faults,
    pure_step,
    synchronizer,
    write_table,
    written_back_step,
)

# -- 1. learning-rate sweep -------------------------------------------------------


def mlp_problem(seed=0):
    g = torch.Generator().manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))
    params = {k: v.detach() for k, v in model.named_parameters()}
    x = torch.randn(256, 8, generator=g)
    y = torch.sin(x.sum(1, keepdim=True))
    return model, params, x, y


def sweep_benchmark(rounds: int) -> list[str]:
    model, params, x, y = mlp_problem()
    steps = 100

    def loss_fn(p, x, y):
        return F.mse_loss(functional_call(model, p, (x,)), y)

    def train(lr):
        p, _, _ = fo.inner_loop(loss_fn, params, fo.nadam(lr=lr), [(x, y)] * steps)
        return loss_fn(p, x, y)

    lrs = torch.logspace(-4, -0.5, 16)
    t = interleaved(
        # the loop takes each lr as a Python number, as one would write it (the eager path)
        {"vmap": lambda: vmap(train)(lrs), "loop": lambda: [train(lr) for lr in lrs.tolist()]},
        rounds,
        warmup=1,
    )
    # agreement, on a short run (float32 round-off of batched matmuls grows chaotically
    # over long training runs at some learning rates; the tests check it in float64)
    short = lambda lr: loss_fn(fo.inner_loop(loss_fn, params, fo.nadam(lr=lr), [(x, y)] * 10)[0], x, y)  # noqa: E731
    err = (vmap(short)(lrs) - torch.stack([short(lr) for lr in lrs])).abs().max().item()
    print(
        f"1. lr sweep, 16 lrs x {steps} NAdam steps on an MLP: vmap {t['vmap'] * 1e3:.0f} ms, "
        f"loop {t['loop'] * 1e3:.0f} ms -> speedup {t['loop'] / t['vmap']:.1f}x "
        f"(target >= 4x; after 10 steps max |vmap - loop| = {err:.1e})"
    )
    return [
        f"1. lr sweep, 16 lrs x {steps} NAdam steps, small MLP: one `vmap`-ed run vs a Python loop of runs",
        f"{t['vmap'] * 1e3:.0f}", f"{t['loop'] * 1e3:.0f}", f"**{t['loop'] / t['vmap']:.1f}x faster**", ">= 4x faster",
    ]  # fmt: skip


# -- 2. MAML meta-iteration --------------------------------------------------------


def maml_benchmark(rounds: int) -> list[str]:
    model = sinusoid_model()
    meta_params = {k: v.detach().clone().requires_grad_() for k, v in model.named_parameters()}
    tasks, inner_steps, lr = 8, 5, 0.01
    xs, ys, _, _ = sinusoid_tasks(tasks, 10, torch.Generator().manual_seed(0))

    def loss_fn(p, x, y):
        return F.mse_loss(functional_call(model, p, (x,)), y)

    def funcopt_iteration():
        total = 0.0
        for t in range(tasks):
            adapted, _, _ = fo.inner_loop(
                loss_fn, meta_params, fo.adamax(lr=lr), [(xs[t], ys[t])] * inner_steps
            )
            total = total + loss_fn(adapted, xs[t], ys[t])
        total.backward()
        for p in meta_params.values():
            p.grad = None

    def by_hand_iteration():
        # the same Adamax inner loop, written with plain differentiable tensor math
        beta1, beta2, eps = 0.9, 0.999, 1e-8
        total = 0.0
        g_fn = grad(loss_fn)
        for t in range(tasks):
            p = dict(meta_params)
            m = {k: torch.zeros_like(v) for k, v in p.items()}
            u = {k: torch.zeros_like(v) for k, v in p.items()}
            for step in range(1, inner_steps + 1):
                g = g_fn(p, xs[t], ys[t])
                clr = lr / (1 - beta1**step)
                for k in p:
                    m[k] = torch.lerp(m[k], g[k], 1 - beta1)
                    u[k] = torch.maximum(u[k] * beta2, g[k].abs() + eps)
                    p[k] = p[k] - clr * m[k] / u[k]
            total = total + loss_fn(p, xs[t], ys[t])
        total.backward()
        for p in meta_params.values():
            p.grad = None

    t = interleaved({"funcopt": funcopt_iteration, "by hand": by_hand_iteration}, rounds)
    print(
        f"2. MAML meta-iteration ({tasks} tasks x {inner_steps} Adamax inner steps, second order): "
        f"funcopt {t['funcopt'] * 1e3:.1f} ms, by hand {t['by hand'] * 1e3:.1f} ms -> "
        f"overhead {t['funcopt'] / t['by hand']:.2f}x (target <= 1.2x)"
    )
    return [
        f"2. MAML meta-iteration, {tasks} tasks x {inner_steps} Adamax steps, second order: "
        "`fo.inner_loop` vs the same loop by hand",
        f"{t['funcopt'] * 1e3:.1f}", f"{t['by hand'] * 1e3:.1f}", f"**{t['funcopt'] / t['by hand']:.2f}x**", "<= 1.2x",
    ]  # fmt: skip


# -- 3. compiled functional step ---------------------------------------------------


def keep_freed_memory() -> bool:
    """Ask glibc to keep freed memory in the process instead of returning it to the OS.

    A pure step writes its outputs to newly allocated memory. By default glibc gives large
    freed blocks back to the OS, depending on the heap's history, and the next step then
    page-faults them in again. This is the runtime form of
    ``GLIBC_TUNABLES=glibc.malloc.mmap_threshold=1073741824:glibc.malloc.trim_threshold=2147483647``.
    It applies to the whole process, torch's eager steps included.
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
    return bool(libc.mallopt(M_MMAP_THRESHOLD, 1 << 30)) and bool(libc.mallopt(M_TRIM_THRESHOLD, 2**31 - 1))


def compile_benchmark(
    rounds: int, algorithms: list[str], keep: bool, device: str = "cpu", quick: bool = False
) -> list[list[str]]:
    """Each algorithm in a process of its own, as a training run would have it: the
    pure step's time depends on the heap's history (see keep_freed_memory), which
    earlier sections and algorithms would otherwise set. Returns table rows."""
    shapes = benchmark_shapes()
    if torch.device(device).type != "cpu":
        setting = torch.cuda.get_device_name(device)
    else:
        setting = "freed memory kept in the process" if keep else "glibc's default allocator settings"
    print(
        f"3. compiled pure step on {len(shapes)} tensors, "
        f"{sum(torch.Size(s).numel() for s in shapes) / 1e6:.1f}M elements, {setting}, "
        "each algorithm in a new process:",
        flush=True,
    )
    rows = []
    for name in algorithms:
        options = [f"--compiled-step-of={name}", f"--rounds={rounds}", f"--device={device}"]
        options += ["--keep-freed-memory"] * keep + ["--quick"] * quick
        child = subprocess.run(
            [sys.executable, __file__, *options], check=True, stdout=subprocess.PIPE, text=True
        )
        for line in child.stdout.splitlines():
            if line.startswith("RESULT "):
                rows += [
                    [f"3. {name}: {what}, {setting}", f"{ours * 1e3:.1f}", f"{torch_s * 1e3:.1f}",
                     f"**{ours / torch_s:.2f}x**", target]
                    for what, ours, torch_s, target in json.loads(line.removeprefix("RESULT "))
                ]  # fmt: skip
            else:
                print(line, flush=True)
    return rows


def compiled_step_benchmark(rounds: int, name: str, device: str = "cpu", quick: bool = False) -> None:
    """One algorithm's compiled pure step against torch's eager steps, in a process that
    `compile_benchmark` starts for it. With `quick`, only the pure step. It prints its
    table rows as a last line, ``RESULT`` and JSON."""
    shapes = benchmark_shapes()
    sync = synchronizer(device)
    params, grads = make_params(shapes, device=device)
    tx = getattr(fo, name.lower())()
    compiled = torch.compile(pure_step(tx), fullgraph=True)
    box = {"params": params, "state": tx.init(params)}
    t0 = time.perf_counter()
    box["params"], box["state"] = compiled(grads, box["state"], box["params"])
    sync()
    compile_s = time.perf_counter() - t0
    faults = []

    def compiled_step():
        before = page_faults()
        box["params"], box["state"] = compiled(grads, box["state"], box["params"])
        faults.append(page_faults() - before)

    fns = {"compiled": compiled_step}
    if not quick:  # the same update, with the results written back into the inputs (not pure)
        fns["in place"] = functools.partial(
            torch.compile(written_back_step(tx), fullgraph=True),
            grads,
            tx.init(params),
            [p.clone() for p in params],
        )
        fns["in place"]()
    for label, foreach in (("torch", False), ("torch foreach", True)):
        fns[label] = getattr(torch.optim, name)(make_trainable(shapes, device), foreach=foreach).step
    t = interleaved(fns, rounds, sync=sync)
    best = min(t["torch"], t["torch foreach"])
    written_back = (
        f"; written back in place {t['in place'] * 1e3:.1f} ms -> {t['in place'] / best:.2f}x"
        if not quick
        else ""
    )
    print(
        f"   {name:9} compiled {t['compiled'] * 1e3:6.1f} ms, torch {t['torch'] * 1e3:6.1f} ms, "
        f"foreach {t['torch foreach'] * 1e3:6.1f} ms -> {t['compiled'] / best:.2f}x "
        f"(target <= 0.8x; {statistics.median(faults):.0f} page faults per compiled step; "
        f"first call compiled in {compile_s:.0f} s){written_back}",
        flush=True,
    )
    # rows: what, its time and torch's faster step timed with it (s), target
    rows = [[f"`torch.compile`d pure step (update + apply_updates; compiled in {compile_s:.0f} s; "
             f"{statistics.median(faults):.0f} page faults a step) vs torch's faster eager step",
             t["compiled"], best, "<= 0.8x"]]  # fmt: skip
    if quick:
        print("RESULT " + json.dumps(rows))
        return
    rows.append(["the same, written back into its inputs (not pure)", t["in place"], best, ""])

    # The update alone, `torch.compile(update)` as the target is worded, timed after the
    # rest, whose memory is freed first: its extra live tensors change the heap that
    # the whole step runs on (1,900-3,100 page faults a step with them). It neither
    # reads nor writes the params, an array fewer each than any whole step.
    del fns["compiled"], fns["in place"]
    box.clear()
    compiled_update = torch.compile(tx.update, fullgraph=True)
    update_box = {"state": tx.init(params), "updates": None}

    def update_alone():
        update_box["updates"] = None  # applied and dropped, as in a training loop
        update_box["updates"], update_box["state"] = compiled_update(grads, update_box["state"], params)

    update_alone()
    fns["update alone"] = update_alone
    t = interleaved(fns, rounds, sync=sync)
    best = min(t["torch"], t["torch foreach"])
    print(
        f"   {'':9} update alone {t['update alone'] * 1e3:.1f} ms, torch {t['torch'] * 1e3:.1f} ms, "
        f"foreach {t['torch foreach'] * 1e3:.1f} ms -> {t['update alone'] / best:.2f}x "
        "(params neither read nor written)",
        flush=True,
    )
    rows.append(
        ["`torch.compile(update)` alone, params neither read nor written", t["update alone"], best, "<= 0.8x"]
    )
    print("RESULT " + json.dumps(rows))


# -- 4. compiled adapter step -------------------------------------------------------


def compiled_adapter_benchmark(rounds: int, algorithms: list[str], device: str = "cpu") -> list[list[str]]:
    shapes = benchmark_shapes()
    sync = synchronizer(device)
    print(f"4. torch.compile(optimizer.step), funcopt's adapter against torch.optim's, on {device}:")
    rows = []
    for name in algorithms:
        fns, first_s = {}, {}
        for label, cls in (("funcopt", getattr(fo, name)), ("torch", getattr(torch.optim, name))):
            fns[label] = torch.compile(cls(make_trainable(shapes, device)).step)
            with tempfile.TemporaryDirectory() as cache:  # a cold inductor cache: a fair first step
                os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
                t0 = time.perf_counter()
                fns[label]()
                sync()
                first_s[label] = time.perf_counter() - t0
        t = interleaved(fns, rounds, sync=sync)
        print(
            f"   {name:9} funcopt {t['funcopt'] * 1e3:6.1f} ms, torch {t['torch'] * 1e3:6.1f} ms "
            f"-> {t['funcopt'] / t['torch']:.2f}x; first step (compiling, cold cache) "
            f"{first_s['funcopt']:.0f} s vs {first_s['torch']:.0f} s",
            flush=True,
        )
        rows.append([
            f"4. {name}: `torch.compile(optimizer.step)`, funcopt's vs torch's (first step, compiling: "
            f"{first_s['funcopt']:.0f} s vs {first_s['torch']:.0f} s)",
            f"{t['funcopt'] * 1e3:.1f}", f"{t['torch'] * 1e3:.1f}", f"**{t['funcopt'] / t['torch']:.2f}x**", "",
        ])  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--skip-compile", action="store_true")
    parser.add_argument("--compiled-adapter", action="store_true", help="also run section 4")
    parser.add_argument(
        "--algorithms", help="comma-separated (default: every one funcopt and torch.optim have)"
    )
    parser.add_argument("--device", default="cpu", help="where the compiled-step section runs")
    parser.add_argument("--quick", action="store_true", help="section 3: default allocator, pure step only")
    parser.add_argument("--write-table", metavar="PATH", help="also write the results as Markdown to PATH")
    parser.add_argument("--compiled-step-of", help=argparse.SUPPRESS)  # section 3's child process
    parser.add_argument("--keep-freed-memory", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.compiled_step_of:
        if args.keep_freed_memory:
            keep_freed_memory()
        compiled_step_benchmark(args.rounds, args.compiled_step_of, args.device, args.quick)
        return
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    rows = [sweep_benchmark(max(5, args.rounds))]
    rows.append(maml_benchmark(3 * args.rounds))  # about 0.1 s a round: more rounds, a steadier median
    algorithms = args.algorithms.split(",") if args.algorithms else default_algorithms()
    if args.quick and not args.algorithms:
        algorithms = ["Adamax", "NAdam"]  # each compiles for a minute or so
    if not args.skip_compile:
        rows += compile_benchmark(args.rounds, algorithms, False, args.device, args.quick)
        # the allocator settings concern the CPU; where glibc takes them here, so do the children
        if torch.device(args.device).type == "cpu" and not args.quick and keep_freed_memory():
            rows += compile_benchmark(args.rounds, algorithms, True)
    if args.compiled_adapter:
        rows += compiled_adapter_benchmark(args.rounds, algorithms, args.device)
    if args.write_table:
        header = ["benchmark", "funcopt ms", "compared with, ms", "ratio", "target"]
        later = ["3"] * (not args.skip_compile) + ["4"] * args.compiled_adapter
        note = f"Medians of interleaved rounds ({max(5, args.rounds)} for 1, {3 * args.rounds} for 2"
        note += f", {args.rounds} for {' and '.join(later)})." if later else ")."
        write_table(args.write_table, markdown_table(header, rows), args.device, note)


if __name__ == "__main__":
    main()
