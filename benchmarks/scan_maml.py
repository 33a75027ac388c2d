"""Compiled second-order MAML with the inner loop as one scan (`fo.scan_inner_loop`),
against optax's ``jax.jit`` with ``lax.scan``, at K = 5, 50 and 500 inner steps.

The problem is researcher.py's section 2: the meta-gradient (and loss) of second-order
MAML on 8 sinusoid tasks (10 points each, funcopt.demo's 1-40-40-1 ReLU MLP), K Adamax
inner steps (lr 0.01) on each task's support set, the meta-loss on the adapted params.

Contenders:

- funcopt scan: ``torch.compile`` (not ``fullgraph``, with
  ``torch._dynamo.config.capture_scalar_outputs = True``, which torch 2.13's inductor
  needs to lower scan) of the meta-loss, the 8 tasks' inner loops run as one
  `fo.scan_inner_loop` over their stacked params (the inner loss is the sum of the
  tasks' losses, ``vmap`` over tasks inside the step, so each task's params get their
  own task's gradient, and Adamax is elementwise: 8 independent inner loops); the
  meta-gradient by ``torch.autograd.grad`` on the compiled loss (scan runs under no
  ``torch.func`` transform);
- funcopt unrolled: researcher.py's ``torch.compile(grad_and_value(...), fullgraph=True)``
  of `fo.inner_loop` (the K steps unrolled), at K=5 and 50 only, left out if its first
  call takes more than ``--max-compile`` s;
- optax: ``jax.jit(jax.value_and_grad(...))`` with ``vmap`` over tasks and the K steps
  in ``lax.scan`` (researcher.py's), its compile time the first call after
  ``jax.clear_caches()``.

Method: one torch thread, XLA's CPU client on the calling thread, one process. The
cold compile of a torch contender is its first call (forward and backward) with
inductor's caches off (``fx_graph_cache = False`` and a new, empty
``TORCHINDUCTOR_CACHE_DIR``), torch's one-time set-up paid before on a trivial function.
Per-call times are medians of interleaved rounds (`step_time.interleaved`), fewer at
K=500. The compiled scan's meta-gradient is checked against the eager `fo.inner_loop`'s
at K=5 (float32, relative 1e-4).

    python benchmarks/scan_maml.py [--rounds 7] [--max-compile 240] [--max-unrolled 150]
        [--write-table docs/_generated/scan_maml.md]
"""

from __future__ import annotations

import os
import tempfile

# before JAX loads (XLA's ops on the calling thread), and before inductor reads its cache dir
os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false")
os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="scan_maml_inductor_")

import argparse  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402
from torch.func import vmap  # noqa: E402

import funcopt as fo  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from researcher import jax_first_call, maml_functions, maml_problem, optax_maml  # noqa: E402
from step_time import interleaved, markdown_table, write_table  # noqa: E402


def scan_meta_grad(k: int) -> tuple[Callable[[], tuple[list[torch.Tensor], torch.Tensor]], dict]:
    """The compiled-scan contender: a function giving ``(meta-gradient list, loss)``,
    and the meta-params (in ``named_parameters`` order)."""
    _, meta_params, xs, ys, loss_fn = maml_problem()
    tasks = xs.shape[0]
    support = tuple(t.expand(k, *t.shape).contiguous() for t in (xs, ys))  # (K, tasks, points, 1)

    def stacked_loss(params, x, y):  # the tasks' losses summed: each task's params get its own gradient
        return vmap(loss_fn)(params, x, y).sum()

    def meta_loss(meta):
        stacked = {n: v.unsqueeze(0).repeat(tasks, *([1] * v.dim())) for n, v in meta.items()}
        adapted, _, _ = fo.scan_inner_loop(stacked_loss, stacked, fo.adamax(lr=0.01), support)
        return vmap(loss_fn)(adapted, xs, ys).mean()

    compiled = torch.compile(meta_loss)
    meta = {n: v.requires_grad_() for n, v in meta_params.items()}

    def call():
        loss = compiled(meta)
        return list(torch.autograd.grad(loss, list(meta.values()))), loss.detach()

    return call, meta


def unrolled_meta_grad(k: int) -> Callable[[], Any]:
    """researcher.py's compiled `fo.inner_loop` meta-gradient (the K steps unrolled)."""
    fns, meta_params = maml_functions(k)
    compiled = torch.compile(fns["funcopt"], fullgraph=True)
    return lambda: compiled(meta_params)


class _Timeout(Exception):
    pass


def _alarm(signum, frame):
    TIMED_OUT[0] = True
    raise _Timeout


TIMED_OUT = [False]


def first_call(fn: Callable[[], Any], limit: float) -> float | None:
    """Seconds of `fn`'s first call (its compile), or None past `limit` seconds
    (inductor wraps the alarm's exception in its own)."""
    TIMED_OUT[0] = False
    signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(int(limit))
    t0 = time.perf_counter()
    try:
        fn()
    except Exception:
        if TIMED_OUT[0]:
            torch._dynamo.reset()
            return None
        raise
    finally:
        signal.alarm(0)
    return time.perf_counter() - t0


def check_k5(scan_call: Callable[[], Any], meta: dict) -> float:
    """The compiled scan's meta-gradient against the eager `fo.inner_loop`'s, K=5: the
    largest error relative to each tensor's largest entry (asserted <= 1e-4)."""
    fns, meta_params = maml_functions(5)
    eager, _ = fns["funcopt"](meta_params)
    got, _ = scan_call()
    rel = max(float((g - eager[n]).abs().max() / eager[n].abs().max()) for g, n in zip(got, meta))
    assert rel <= 1e-4, (
        f"compiled scan's meta-gradient differs from the eager inner_loop's: relative {rel:.1e}"
    )
    return rel


def bench_k(k: int, rounds: int, max_compile: float, max_unrolled: float) -> tuple[list[str], dict]:
    """One K: compile times and per-call medians of the contenders, a table row."""
    scan_call, meta = scan_meta_grad(k)
    fns: dict[str, Callable[[], Any]] = {"scan": scan_call}
    first: dict[str, float | None] = {"scan": first_call(scan_call, max_compile)}
    if first["scan"] is None:
        fns.pop("scan")
    if k <= 50:
        unrolled = unrolled_meta_grad(k)
        first["unrolled"] = first_call(unrolled, max_unrolled)
        if first["unrolled"] is not None:
            fns["unrolled"] = unrolled
    optax = optax_maml(k, scan=True)
    _, first["optax"] = jax_first_call(optax)
    fns["optax"] = optax
    rel = check_k5(scan_call, meta) if k == 5 and "scan" in fns else None
    t = interleaved(fns, rounds, warmup=1)
    return row(k, first, t, rel, max_compile, max_unrolled), {"first": first, "t": t, "rel": rel}


def row(
    k: int, first: dict, t: dict, rel: float | None, max_compile: float, max_unrolled: float
) -> list[str]:
    def ms(name):
        return f"{t[name] * 1e3:.2f}" if name in t else ""

    def comp(name):
        if name not in first:
            return "not run"
        limit = max_unrolled if name == "unrolled" else max_compile
        return f"> {limit:.0f}" if first[name] is None else f"{first[name]:.1f}"

    def ratio(name, what):
        if what == "compile":
            return f"{first[name] / first['optax']:.1f}x" if first.get(name) else ""
        return f"**{t[name] / t['optax']:.2f}x**" if name in t else ""

    line = (
        f"K={k}: scan compile {comp('scan')} s, {ms('scan')} ms/call ({ratio('scan', 'call')} optax); "
        f"unrolled compile {comp('unrolled')} s, {ms('unrolled')} ms/call ({ratio('unrolled', 'call')}); "
        f"optax lax.scan jit compile {comp('optax')} s, {ms('optax')} ms/call"
    )
    if rel is not None:
        line += f"; K=5 meta-gradient scan vs eager inner_loop: relative {rel:.1e}"
    print(line.replace("**", ""), flush=True)
    return [
        f"K={k}",
        comp("scan"),
        ms("scan"),
        ratio("scan", "call"),
        comp("unrolled"),
        ms("unrolled"),
        ratio("unrolled", "call"),
        comp("optax"),
        ms("optax"),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=7, help="rounds at K=5 and 50 (3 at K=500)")
    parser.add_argument("--max-compile", type=float, default=240.0, help="first-call limit, seconds")
    parser.add_argument("--max-unrolled", type=float, default=150.0, help="the unrolled one's limit, seconds")
    parser.add_argument("--ks", default="5,50,500")
    parser.add_argument("--write-table", metavar="PATH", help="also write the results as Markdown to PATH")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch._dynamo.config.capture_scalar_outputs = True  # inductor's lowering of scan reads its counter
    torch._inductor.config.fx_graph_cache = False
    torch.compile(lambda t: t * 2)(torch.ones(3))  # torch's one-time set-up
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s)", flush=True)
    rows = []
    for k in (int(k) for k in args.ks.split(",")):
        rows.append(bench_k(k, args.rounds if k <= 50 else 3, args.max_compile, args.max_unrolled)[0])
    if args.write_table:
        header = ["K", "scan: compile s", "scan: ms/call", "scan / optax", "unrolled: compile s",
                  "unrolled: ms/call", "unrolled / optax", "optax `lax.scan`: compile s", "optax: ms/call"]  # fmt: skip
        note = (
            f"Second-order MAML, 8 sinusoid tasks, K Adamax steps; compile = the first call with inductor's "
            f"caches off; medians of {args.rounds} interleaved rounds (3 at K=500)."
        )
        write_table(args.write_table, markdown_table(header, rows), "cpu", note)


if __name__ == "__main__":
    main()
