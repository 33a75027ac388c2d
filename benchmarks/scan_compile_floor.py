"""The cold compile of scan_maml.py's compiled second-order MAML: funcopt's
`fo.scan_inner_loop` against the same inner loop written by hand in plain torch (one
``torch._higher_order_ops.scan`` whose body is a hand-written Adamax step on a tuple of
tensors, no funcopt), to tell torch's scan + inductor floor from funcopt's extra graph.

The problem, model and meta-loss are scan_maml.py's (researcher.py's ``maml_problem``:
8 sinusoid tasks, the 1-40-40-1 ReLU MLP, K Adamax steps at lr 0.01, the tasks stacked
and their inner losses summed under ``vmap``, second-order: the inner gradient is
``torch.func.grad_and_value`` inside the scan body, differentiated by the meta-backward).

One contender per process (``--which torch`` or ``--which funcopt``), each with a new,
empty ``TORCHINDUCTOR_CACHE_DIR`` and ``fx_graph_cache = False``, torch's one-time set-up
paid before on a trivial function, one torch thread, as scan_maml.py does. It prints the
first call's seconds (compile, forward and backward, as the meta-step), the meta-gradient's
error relative to the eager `fo.inner_loop`'s (scan_maml.py's ``check_k5``, asserted
<= 1e-4), the median per-call time after, and the 1-minute load average.

Measured (torch 2.13 CPU, K=5, a shared 2-core machine at load 2-4, fresh process and
cache each): cold compile by hand 36.7, 40.1, 37.8, 41.4 s; funcopt 41.4, 43.3, 36.1, 41.5 s (0.95-1.13x,
within the load's noise), the same meta-gradient (1.3e-6 relative to each other).
Graph size (``TORCH_LOGS=graph_code,aot_graphs``, lines with ``=``): TorchDynamo's graph
244 by hand against 670 with funcopt (its `_traced_probe` step, dead code dropped later,
and the pytree/state plumbing), AOT forward 275 against 352, backward 393 against 521.

    python benchmarks/scan_compile_floor.py --which torch [--k 5] [--rounds 7] [--save PATH]
"""

from __future__ import annotations

import os
import tempfile

os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="scan_floor_inductor_")

import argparse  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
from torch._higher_order_ops.scan import scan  # noqa: E402
from torch.func import grad_and_value, vmap  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from researcher import BETA1, BETA2, EPS, maml_problem  # noqa: E402
from scan_maml import check_k5, scan_meta_grad  # noqa: E402
from step_time import interleaved  # noqa: E402

LR = 0.01


def _std(t: torch.Tensor) -> torch.Tensor:
    return t.clone(memory_format=torch.contiguous_format)


class _StdGrad(torch.autograd.Function):
    """The identity, whose backward gives standard-strided gradients: torch's compiled
    scan backward refuses an output gradient whose strides differ from its body's (as
    in funcopt's ``_FirstOrderOnly``, without its double-backward guard)."""

    @staticmethod
    def forward(ctx, *xs):
        return tuple(x.view_as(x) for x in xs)

    @staticmethod
    def backward(ctx, *grads):
        return tuple(_std(g) for g in grads)


def torch_meta_grad(k: int) -> tuple[Callable[[], tuple[list[torch.Tensor], torch.Tensor]], dict]:
    """The hand-written contender: scan_maml.py's ``scan_meta_grad`` with the inner loop
    as one torch scan over a hand-written Adamax step (carry: params, exp_avg, exp_inf
    as tuples of tensors, and the step count)."""
    _, meta_params, xs, ys, loss_fn = maml_problem()
    names = tuple(meta_params)
    tasks = xs.shape[0]
    support = tuple(t.expand(k, *t.shape).contiguous() for t in (xs, ys))  # (K, tasks, points, 1)

    def stacked_loss(params, x, y):  # the tasks' losses summed: each task's params get its own gradient
        return vmap(lambda p, x, y: loss_fn(dict(zip(names, p)), x, y))(params, x, y).sum()

    grad_loss = grad_and_value(stacked_loss)

    def body(carry, x):
        p, m, u, step = carry
        g, loss = grad_loss(p, *x)
        step = step + 1
        clr = LR / (1 - torch.pow(BETA1, step))
        m = tuple(torch.lerp(mi, gi, 1 - BETA1) for mi, gi in zip(m, g))
        u = tuple(torch.maximum(ui * BETA2, gi.abs() + EPS) for ui, gi in zip(u, g))
        p = tuple(pi - clr * mi / ui for pi, mi, ui in zip(p, m, u))
        # standard-strided clones: scan refuses a body output that may alias an input or
        # another output, or whose strides differ from the initial carry's (size-1 dims too)
        return tuple(tuple(_std(t) for t in ts) for ts in (p, m, u)) + (step.clone(),), loss

    def meta_loss(meta):
        p = tuple(_std(v.unsqueeze(0).repeat(tasks, *([1] * v.dim()))) for v in meta.values())
        zeros = tuple(torch.zeros_like(v) for v in p)
        init = (p, zeros, tuple(torch.zeros_like(v) for v in p), torch.zeros(()))
        (adapted, _, _, _), _ = scan(body, init, support)
        adapted = _StdGrad.apply(*adapted)
        return vmap(lambda a, x, y: loss_fn(dict(zip(names, a)), x, y))(adapted, xs, ys).mean()

    compiled = torch.compile(meta_loss)
    meta = {n: v.requires_grad_() for n, v in meta_params.items()}

    def call():
        loss = compiled(meta)
        return list(torch.autograd.grad(loss, list(meta.values()))), loss.detach()

    return call, meta


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--which", choices=("torch", "funcopt"), required=True)
    parser.add_argument("--k", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=7, help="per-call rounds after the compile (0: none)")
    parser.add_argument("--save", metavar="PATH", help="save the meta-gradient to PATH (torch.save)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch._dynamo.config.capture_scalar_outputs = True  # inductor's lowering of scan reads its counter
    torch._inductor.config.fx_graph_cache = False
    torch.compile(lambda t: t * 2)(torch.ones(3))  # torch's one-time set-up
    call, meta = (torch_meta_grad if args.which == "torch" else scan_meta_grad)(args.k)
    load0 = os.getloadavg()[0]
    t0 = time.perf_counter()
    grads, loss = call()
    first = time.perf_counter() - t0
    load1 = os.getloadavg()[0]
    line = (
        f"{args.which} K={args.k}: cold compile (first call) {first:.1f} s, load {load0:.2f} -> {load1:.2f}"
    )
    if args.k == 5:
        line += f"; meta-gradient vs eager inner_loop: relative {check_k5(call, meta):.1e}"
    if args.save:
        torch.save([g.detach() for g in grads], args.save)
    if args.rounds:
        t = interleaved({"call": call}, args.rounds, warmup=1)["call"]
        line += f"; {t * 1e3:.2f} ms/call (median of {args.rounds}), load {os.getloadavg()[0]:.2f}"
    print(f"torch {torch.__version__}; " + line, flush=True)


if __name__ == "__main__":
    main()
