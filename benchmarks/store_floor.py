"""How fast a pure step can be on this CPU: the compiled pure Adamax step against the
same math hand-written in C, in one process.

A pure step writes its results to memory that holds no input. With ordinary stores the
CPU reads each cache line before writing it (read-for-ownership), so Adamax moves 10
buffers per element instead of the 7 of an in-place step; non-temporal (streaming)
stores skip that read, and inductor (torch 2.13) emits none. This script times, on
the benchmark parameter set of ``step_time.py`` (its ~24M elements as one flat buffer
for the C kernel, which moves the same bytes):

- C in place, and C into fresh memory with ordinary and with streaming stores (AVX2,
  compiled here with gcc and OpenMP, as many threads as torch uses), and the same
  kernel with ordinary stores called tensor by tensor, into tensors allocated as a
  pure step's outputs (the structure of inductor's step: a loop per tensor);
- ``torch.compile`` of funcopt's pure Adamax step, of the same step on one element per
  tensor (its cost besides memory traffic: guards, allocations, calls), and of the step
  written back in place;
- torch.optim.Adamax's eager for-loop step (``foreach`` is slower on the CPU),

interleaved round by round, with freed memory kept in the process (see
``torch_func.keep_freed_memory``). If the compiled pure step costs what the C kernel
with ordinary stores does, tensor by tensor, it is at this machine's floor for them on
this set of tensors. x86-64 with gcc only.

With ``--write-table PATH`` it also writes the table as Markdown, with a line naming the
run, for docs/performance.md to include.

    python benchmarks/store_floor.py [--rounds 15] [--write-table docs/_generated/store_floor.md]
"""

from __future__ import annotations

import argparse
import ctypes
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

import funcopt as fo

sys.path.insert(0, str(Path(__file__).parent))
from step_time import (  # noqa: E402
    benchmark_shapes,
    interleaved,
    make_params,
    make_trainable,
    markdown_table,
    pure_step,
    write_table,
    written_back_step,
)
from torch_func import keep_freed_memory  # noqa: E402

KERNEL = r"""
#include <immintrin.h>
#include <stddef.h>
/* One Adamax step (lr 2e-3, betas 0.9 and 0.999, eps 1e-8; the bias correction, a
   constant, left out) from p, g, m, u into po, mo, uo, which may be p, m, u. */
void adamax(size_t n, int streaming, int threads, const float *p, const float *g,
            const float *m, const float *u, float *po, float *mo, float *uo) {
    const __m256 beta1 = _mm256_set1_ps(0.9f), one_minus_beta1 = _mm256_set1_ps(0.1f);
    const __m256 beta2 = _mm256_set1_ps(0.999f), eps = _mm256_set1_ps(1e-8f);
    const __m256 neg_lr = _mm256_set1_ps(-2e-3f), sign = _mm256_set1_ps(-0.0f);
#pragma omp parallel for schedule(static) num_threads(threads)
    for (size_t i = 0; i < n; i += 8) {
        __m256 G = _mm256_load_ps(g + i), M = _mm256_load_ps(m + i);
        __m256 U = _mm256_load_ps(u + i), P = _mm256_load_ps(p + i);
        M = _mm256_fmadd_ps(M, beta1, _mm256_mul_ps(G, one_minus_beta1));
        U = _mm256_max_ps(_mm256_mul_ps(U, beta2), _mm256_add_ps(_mm256_andnot_ps(sign, G), eps));
        P = _mm256_fmadd_ps(neg_lr, _mm256_div_ps(M, U), P);
        if (streaming) {
            _mm256_stream_ps(po + i, P); _mm256_stream_ps(mo + i, M); _mm256_stream_ps(uo + i, U);
        } else {
            _mm256_store_ps(po + i, P); _mm256_store_ps(mo + i, M); _mm256_store_ps(uo + i, U);
        }
    }
}
"""


def build(directory: str) -> ctypes.CDLL:
    source, library = Path(directory, "adamax.c"), Path(directory, "adamax.so")
    source.write_text(KERNEL)
    flags = ["-O3", "-mavx2", "-mfma", "-fopenmp", "-shared", "-fPIC"]
    subprocess.run(["gcc", *flags, str(source), "-o", str(library)], check=True)
    return ctypes.CDLL(str(library))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--write-table", metavar="PATH", help="also write the table as Markdown to PATH")
    args = parser.parse_args()
    if platform.machine() not in ("x86_64", "AMD64") or shutil.which("gcc") is None:
        print("needs an x86-64 CPU and gcc")
        return
    keep_freed_memory()
    shapes = benchmark_shapes()
    n = sum(torch.Size(s).numel() for s in shapes) // 8 * 8
    threads = torch.get_num_threads()
    with tempfile.TemporaryDirectory() as directory:
        kernel = build(directory).adamax

    flat_g = torch.randn(n) * 0.01
    flat = {label: [torch.randn(n) * 0.1, torch.zeros(n), torch.zeros(n)] for label in ("in", "fresh", "nt")}

    def c_step(streaming: int, src: list[torch.Tensor], dst: list[torch.Tensor]) -> None:
        # torch's CPU allocator aligns to 64 bytes, which the aligned loads and stores need
        p, g, m, u, po, mo, uo = (ctypes.c_void_p(t.data_ptr()) for t in (src[0], flat_g, *src[1:], *dst))
        kernel(ctypes.c_size_t(n), streaming, threads, p, g, m, u, po, mo, uo)

    def c_fresh(label: str, streaming: int):
        def step() -> None:
            new = [torch.empty(n) for _ in range(3)]  # fresh memory, as a pure step's outputs
            c_step(streaming, flat[label], new)
            flat[label] = new

        return step

    params, grads = make_params(shapes)
    tx = fo.adamax()
    assert all(g.numel() % 8 == 0 for g in grads)  # the kernel's vectors of 8
    # the same kernel, called tensor by tensor, as inductor's loops run
    by_tensor = [
        [p.clone() for p in params],
        [torch.zeros_like(p) for p in params],
        [torch.zeros_like(p) for p in params],
    ]

    def c_fresh_by_tensor() -> None:
        new = [[torch.empty_like(t) for t in column] for column in by_tensor]
        for i, g in enumerate(grads):
            ts = (by_tensor[0][i], g, by_tensor[1][i], by_tensor[2][i], new[0][i], new[1][i], new[2][i])
            kernel(ctypes.c_size_t(g.numel()), 0, threads, *(ctypes.c_void_p(t.data_ptr()) for t in ts))
        by_tensor[:] = new

    compiled_pure = torch.compile(pure_step(tx), fullgraph=True)
    compiled_write_back = torch.compile(written_back_step(tx), fullgraph=True)
    box = {"params": params, "state": tx.init(params)}
    in_place = ([p.clone() for p in params], tx.init(params))

    def inductor_pure() -> None:
        box["params"], box["state"] = compiled_pure(grads, box["state"], box["params"])

    # the compiled step's cost besides its memory traffic (guards, allocations, calls)
    tiny_params, tiny_grads = make_params([(1,)] * len(shapes))
    tiny = {"params": tiny_params, "state": tx.init(tiny_params)}

    def inductor_pure_tiny() -> None:  # a second graph of the same function (other shapes)
        tiny["params"], tiny["state"] = compiled_pure(tiny_grads, tiny["state"], tiny["params"])

    steps = {
        "C, in place": lambda: c_step(0, flat["in"], flat["in"]),
        "C, fresh memory": c_fresh("fresh", 0),
        "C, fresh memory, streaming stores": c_fresh("nt", 1),
        "C, fresh memory, tensor by tensor": c_fresh_by_tensor,
        "compiled pure step": inductor_pure,
        "compiled pure step, 1 element a tensor": inductor_pure_tiny,
        "compiled step written back in place": lambda: compiled_write_back(grads, in_place[1], in_place[0]),
        "torch.optim.Adamax": torch.optim.Adamax(make_trainable(shapes), foreach=False).step,
    }
    for step in steps.values():  # compile, and create the state
        step()
    t = interleaved(steps, args.rounds)
    print(f"Adamax on {n / 1e6:.1f}M elements, {threads} threads, median of {args.rounds} rounds")
    for label, seconds in t.items():
        print(
            f"  {label:38} {seconds * 1e3:6.1f} ms  {seconds / t['C, in place']:.2f}x C in place  "
            f"{seconds / t['torch.optim.Adamax']:.2f}x torch"
        )
    if args.write_table:
        rows = [
            [
                label,
                f"{seconds * 1e3:.1f}",
                f"{seconds / t['C, in place']:.2f}x",
                f"**{seconds / t['torch.optim.Adamax']:.2f}x**",
            ]
            for label, seconds in t.items()
        ]
        header = ["Adamax step", "ms", "x C in place", "x torch.optim.Adamax"]
        note = f"{n / 1e6:.1f}M float32 elements; medians of {args.rounds} interleaved rounds."
        write_table(args.write_table, markdown_table(header, rows), note=note)


if __name__ == "__main__":
    main()
