"""Peak memory of one optimizer step, beyond what the process held before it.

For each algorithm, on step_time.py's set of 160 float32 tensors (24.1M elements), it
measures one step (after two warm-up steps) of

- torch.optim.X() (the for-loop path) and X(foreach=True),
- funcopt.X().step() (the adapter),
- tx.update + fo.apply_updates (the pure functional path), as step_time.py runs them
  (`builders`), and compiled (`pure_step`),
- the compiled step with its results written back into its inputs (`written_back_step`),

each in a new process, and prints the highest resident memory during the step minus
the resident memory before it, in MiB and as a multiple of the params' size. The
children run with MALLOC_MMAP_THRESHOLD_=65536, so that glibc maps every large tensor
apart and unmaps it when freed: resident memory then follows the live tensors, not the
heap's history. Linux only (it reads /proc/self/status).

``--quick`` leaves out the two compiled cases (each compiles for a minute or so; the
compiled pure step holds what the eager functional one does, old and new state at once). With ``--write-table PATH`` it also writes the table as Markdown, with a
line naming the run, for docs/performance.md to include.

    python benchmarks/step_memory.py [--quick] [--algorithms NAdam,Adamax] [--write-table docs/_generated/step_memory.md]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

CASES = [
    "torch",
    "torch foreach",
    "funcopt adapter",
    "funcopt functional",
    "compiled",
    "compiled, written back",
]
MiB = 1 << 20


def resident() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_resident() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM"))


def measure(name: str, case: str) -> tuple[float, float]:
    """(peak MiB beyond the memory before the step, params' MiB), in this process."""
    import torch
    from step_time import benchmark_shapes, builders, make_params, pure_step, written_back_step

    import funcopt as fo

    shapes = benchmark_shapes()
    size = sum(torch.Size(s).numel() * 4 for s in shapes) / MiB  # float32
    if case.startswith("compiled"):
        params, grads = make_params(shapes)
        tx = getattr(fo, name.lower())()
        held = {"params": params, "state": tx.init(params)}
        del params
        if case == "compiled, written back":
            compiled = torch.compile(written_back_step(tx))

            def step() -> None:
                compiled(grads, held["state"], held["params"])

        else:
            compiled = torch.compile(pure_step(tx))

            def step() -> None:
                held["params"], held["state"] = compiled(grads, held["state"], held["params"])

    else:
        step = builders(name, shapes)[case]()
    for _ in range(2):
        step()
    before = resident()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # the high-water mark starts again from the current resident memory
    step()
    return (peak_resident() - before) / MiB, size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--algorithms", help="comma-separated (default: every one funcopt and torch.optim have)"
    )
    parser.add_argument("--quick", action="store_true", help="leave out the compiled cases")
    parser.add_argument("--write-table", metavar="PATH", help="also write the table as Markdown to PATH")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(*measure(*args.child))
        return
    from step_time import default_algorithms, markdown_table, write_table

    algorithms = args.algorithms.split(",") if args.algorithms else default_algorithms()
    cases = [case for case in CASES if not (args.quick and case.startswith("compiled"))]
    if not os.path.exists("/proc/self/clear_refs"):
        sys.exit("step_memory.py reads /proc/self: it runs on Linux only")
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}
    here = os.path.dirname(os.path.abspath(__file__))
    print("peak resident memory during one step beyond the memory before it, MiB (x the params' size)")
    print(f"{'algorithm':10}" + "".join(f"{case:>24}" for case in cases))
    rows = []
    for name in algorithms:
        row, rows = f"{name:10}", [*rows, [name]]
        for case in cases:
            out = subprocess.run(
                [sys.executable, os.path.abspath(__file__), "--child", name, case],
                env=env, cwd=here, capture_output=True, text=True, check=True,
            )  # fmt: skip
            peak, size = map(float, out.stdout.split()[-2:])
            row += f"{f'{peak:.0f} ({peak / size:.2f}x)':>24}"
            rows[-1].append(f"{peak:.0f} ({peak / size:.2f}x)")
        print(row, flush=True)
    print(f"(params: {size:.0f} MiB)")
    if args.write_table:
        note = (
            f"Peak resident memory during one step beyond the memory before it, MiB (x the params' "
            f"{size:.0f} MiB); one step after two, each case in a new process."
        )
        write_table(args.write_table, markdown_table(["algorithm", *cases], rows), note=note)


if __name__ == "__main__":
    main()
