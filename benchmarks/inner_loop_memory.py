"""Peak memory of a second-order meta-gradient through K inner steps, against K, for
the plain unroll of `fo.inner_loop`, the checkpointed loop (``checkpoint_every=8``) and
the truncated one (``truncate=8``).

The problem: a 0.33M-param float32 MLP (64-512-512-64, tanh), Adam (lr 1e-3, a tensor in
the state by ``fo.inject_hyperparams``), K steps on batches of 32, then the
meta-gradient of a query loss in the initial params and the lr (``torch.autograd.grad``;
the truncated loop's reaches the lr only). Each case runs in a new process (with
MALLOC_MMAP_THRESHOLD_=65536, so that resident memory follows the live tensors), and
reports the highest resident memory during the loop and its backward pass minus the
resident memory before, and a checksum of the meta-gradient: the checkpointed loop's
must equal the plain one's. Ratios are against the plain unroll in the same run.
Linux only (it reads /proc/self).

    python benchmarks/inner_loop_memory.py [--ks 8,16,32,64] [--write-table docs/_generated/inner_loop_memory.md]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

MiB = 1 << 20
SEGMENT = 8
CASES = {
    "plain": {},
    f"checkpoint_every={SEGMENT}": {"checkpoint_every": SEGMENT},
    f"truncate={SEGMENT}": {"truncate": SEGMENT},
}


def resident() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_resident() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM"))


def measure(case: str, k: int) -> tuple[float, float, float]:
    """(peak MiB beyond the memory before, params' MiB, meta-gradient checksum)."""
    import torch
    from torch.func import functional_call

    import funcopt as fo

    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 512),
        torch.nn.Tanh(),
        torch.nn.Linear(512, 512),
        torch.nn.Tanh(),
        torch.nn.Linear(512, 64),
    )
    params = {name: p.detach().requires_grad_() for name, p in model.named_parameters()}
    size = sum(p.numel() * 4 for p in params.values()) / MiB
    batches = [(torch.randn(32, 64), torch.randn(32, 64)) for _ in range(k)]
    query = (torch.randn(32, 64), torch.randn(32, 64))

    def loss_fn(params, x, y):
        return torch.nn.functional.mse_loss(functional_call(model, params, (x,)), y)

    lr = torch.tensor(1e-3, requires_grad=True)  # in the state, as checkpointing needs
    tx = fo.inject_hyperparams(fo.adam)(lr=lr)

    def meta_gradient():
        adapted, _, _ = fo.inner_loop(loss_fn, params, tx, batches, **CASES[case])
        return torch.autograd.grad(loss_fn(adapted, *query), [*params.values(), lr], allow_unused=True)

    meta_gradient()  # warm-up: the allocator's and torch's one-time costs
    before = resident()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # the high-water mark starts again from the current resident memory
    grads = meta_gradient()
    peak = (peak_resident() - before) / MiB
    checksum = sum(float(g.double().abs().sum()) for g in grads if g is not None)
    return peak, size, checksum


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ks", default="8,16,32,64", help="comma-separated numbers of inner steps")
    parser.add_argument("--write-table", metavar="PATH", help="also write the table as Markdown to PATH")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(*measure(args.child[0], int(args.child[1])))
        return
    if not os.path.exists("/proc/self/clear_refs"):
        sys.exit("inner_loop_memory.py reads /proc/self: it runs on Linux only")
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}
    here = os.path.dirname(os.path.abspath(__file__))
    ks = [int(k) for k in args.ks.split(",")]
    print("peak resident memory of a meta-gradient through K Adam steps beyond the memory before it, MiB")
    print(f"{'K':>4}" + "".join(f"{case:>28}" for case in CASES) + f"{'checkpointed grad - plain':>28}")
    rows = []
    for k in ks:
        peaks, sums = {}, {}
        for case in CASES:
            out = subprocess.run(
                [sys.executable, os.path.abspath(__file__), "--child", case, str(k)],
                env=env, cwd=here, capture_output=True, text=True, check=True,
            )  # fmt: skip
            peak, size, checksum = map(float, out.stdout.split()[-3:])
            peaks[case], sums[case] = peak, checksum
        plain = peaks["plain"]
        cells = [f"{peaks[c]:.0f}" + ("" if c == "plain" else f" ({peaks[c] / plain:.2f}x)") for c in CASES]
        difference = abs(sums[f"checkpoint_every={SEGMENT}"] - sums["plain"]) / sums["plain"]
        rows.append([str(k), *cells, f"{difference:.1e}"])
        print(f"{k:>4}" + "".join(f"{cell:>28}" for cell in cells) + f"{difference:>28.1e}", flush=True)
    print(f"(params: {size:.2f} MiB)")
    if args.write_table:
        from step_time import markdown_table, write_table

        note = (
            f"Peak resident memory (MiB) of a second-order meta-gradient through K Adam steps on a "
            f"{size * MiB / 4 / 1e6:.2f}M-param float32 MLP, beyond the memory before it, and the ratio to the "
            "plain unroll's in the same run; the last column is the relative difference of the checkpointed "
            "meta-gradient's checksum from the plain one's (float32 round-off: its backward sums the steps' "
            "contributions in another order). Each case in a new process, after a warm-up run."
        )
        header = ["K", *CASES, "checkpointed vs plain gradient"]
        write_table(args.write_table, markdown_table(header, rows), note=note)


if __name__ == "__main__":
    main()
