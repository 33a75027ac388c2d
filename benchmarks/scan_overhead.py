"""Pure torch: the per-call cost of a compiled ``torch._higher_order_ops.scan`` of a
trivial step, against K, next to the compiled unrolled loop. It shows the fixed cost
that torch 2.13's scan adds to a compiled call (docs/long-inner-loops.md, "What a
compiled call costs"), apart from funcopt: the step is N tensors of 8x40 through
``tanh(0.9 c + x)``. CPU, one torch thread.

    python benchmarks/scan_overhead.py [K ...]   (default 5 50 500; N=19 carries by env)

Measured 2026-12-02 on a shared 2-core machine, one process per line: fwd+bwd 1.91 ms a
call at K=5 (load average 4.9; unrolled 0.49 ms), 8.23 ms at K=50 and 68.07 ms at K=500
(load 2 to 3; unrolled 2.76 ms at K=50); forward alone (no_grad) 0.40 ms at K=5
(unrolled 0.18 ms). At load 7.5 to 8.4: 6.25 ms at K=5 (unrolled 1.38 ms).
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="scan_overhead_"))

import torch  # noqa: E402
from torch._higher_order_ops.scan import scan  # noqa: E402

N = int(os.environ.get("N", 19))  # carries (the MAML benchmark's: 6 params, Adamax's 12 moments, 1 count)


def scanned(hs, xs):
    def body(carry, x):
        new = [torch.tanh(c * 0.9 + x).clone() for c in carry]
        return new, new[0].sum()

    out, ys = scan(body, list(hs), xs)
    return sum(o.pow(2).sum() for o in out) + ys.sum()  # (distinct gradients: scan refuses aliasing ones)


def unrolled(hs, xs):
    carry, ys = list(hs), []
    for x in xs:
        carry = [torch.tanh(c * 0.9 + x) for c in carry]
        ys.append(carry[0].sum())
    return sum(o.pow(2).sum() for o in carry) + torch.stack(ys).sum()


def median_ms(fn, n: int) -> float:
    fn()
    fn()
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e3


def main() -> None:
    torch.set_num_threads(1)
    torch._dynamo.config.capture_scalar_outputs = True  # inductor's while_loop lowering of scan needs it
    hs = [torch.randn(8, 40, requires_grad=True) for _ in range(N)]
    for k in [int(k) for k in sys.argv[1:] or ["5", "50", "500"]]:
        xs = torch.randn(k, 8, 40)
        for name, fn in [("scan", scanned), ("unrolled", unrolled)][: 2 if k <= 50 else 1]:
            c = torch.compile(fn, fullgraph=True)
            t0 = time.perf_counter()
            torch.autograd.grad(c(hs, xs), hs)
            compile_s = time.perf_counter() - t0
            n = 21 if k < 500 else 7
            both = median_ms(lambda: torch.autograd.grad(c(hs, xs), hs), n)  # noqa: B023
            with torch.no_grad():
                forward = median_ms(lambda: c(hs, xs), n)  # noqa: B023
            print(
                f"K={k} {name}: compile {compile_s:.1f} s, fwd+bwd {both:.2f} ms/call, forward (no_grad) {forward:.2f} ms/call"
            )
    print(f"load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
