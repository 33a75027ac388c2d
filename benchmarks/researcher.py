"""Where researchers run funcopt: compiled sweeps, compiled meta-learning, and the memory
of a differentiable unroll, measured against optax on JAX (``jax.jit``) in the same run.

Method. One torch thread (``torch.set_num_threads(1)``), and XLA's CPU client with its
Eigen thread pool off (``--xla_cpu_multi_thread_eigen=false``, set before JAX loads);
both live in this one process, and the contenders of a section run interleaved, round
after round (`step_time.interleaved`); figures are medians. The first call of a
compiled torch function (its compile time) is measured in a new process with an empty
inductor cache (a new ``TORCHINDUCTOR_CACHE_DIR``; torch's one-time set-up paid before,
on a trivial function): what a user's first run pays. Then, in brackets, its first call
in this process with the cache that run filled (a later run of the same program). JAX's
first calls follow ``jax.clear_caches()``. Single measurements: they depend much on
the machine's load (inductor compiles each kernel with the system's C++ compiler).

1. Sweeps: 16 runs x 100 Adamax steps of an 8->64->1 tanh MLP on 256 points, as an lr
   sweep (16 learning rates, one init) and as an ensemble (16 inits, one lr), with
   ``vmap`` over the 16 runs:

   - funcopt eager: ``vmap`` of the whole 100-step run (`fo.inner_loop`);
   - funcopt compiled: ``torch.compile(vmap(step), fullgraph=True)``, one step
     (gradient, ``update``, `fo.apply_updates`) compiled and called 100 times from
     Python (compiling the 100-step run would unroll it: 100 times the graph);
   - the same step written by hand with plain tensor math, compiled the same way: what
     torch itself reaches on this graph (its floor), with no funcopt in it;
   - optax: ``jax.jit(jax.vmap(step))`` called 100 times (like with like: the ratio),
     and, for reference, the whole run in one ``jax.jit`` with ``lax.fori_loop``.

2. MAML meta-iteration: the meta-gradient (and loss) of second-order MAML on 8
   sinusoid tasks (10 points each, funcopt.demo's 1-40-40-1 model), K Adamax inner
   steps (lr 0.01) by `fo.inner_loop`, ``vmap`` over the tasks, ``grad_and_value``
   outside: eager; ``torch.compile`` of the whole meta-gradient (the K steps unrolled);
   the same by hand, compiled (torch's floor); and optax, ``jax.jit(jax.value_and_grad)``
   with the K steps unrolled in Python at K=5 and in ``lax.scan`` at K=50 (unrolled, XLA
   took 300 s to compile it here). A torch contender whose first call takes more than
   ``--max-compile`` seconds is left out.

3. Memory: the peak resident set (``VmHWM``) of one second-order meta-gradient,
   eager, of a K-step Adamax unroll (8 sinusoid tasks of 1000 points, a loop over tasks
   as in torch_func.py), by `fo.inner_loop` and by the same loop written by hand; each in
   a new process. The ratio is of the growth over the process's resident set just
   before the unroll (the unroll's own memory; the whole peak, mostly torch's libraries,
   is printed too).

    python benchmarks/researcher.py [--rounds 7] [--max-compile 600] [--skip-k50]
        [--write-table docs/_generated/researcher.md]
"""

from __future__ import annotations

import os

# before JAX loads: XLA's CPU client then runs its ops on the calling thread
os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false")

import argparse  # noqa: E402
import functools  # noqa: E402
import json  # noqa: E402
import resource  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.func import functional_call, grad, grad_and_value, vmap  # noqa: E402

import funcopt as fo  # noqa: E402
from funcopt.demo import sinusoid_model, sinusoid_tasks  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from step_time import interleaved, markdown_table, write_table  # noqa: E402
from torch_func import mlp_problem  # noqa: E402

RUNS, STEPS, BETA1, BETA2, EPS = 16, 100, 0.9, 0.999, 1e-8


def jax_first_call(fn, *args):
    import jax

    t0 = time.perf_counter()
    out = jax.block_until_ready(fn(*args))
    return out, time.perf_counter() - t0


def hand_adamax(p, g, m, u, step, lr):
    """Adamax by hand, plain tensor math (torch.optim's formula): the new p, m, u."""
    m = torch.lerp(m, g, 1 - BETA1)
    u = torch.maximum(u * BETA2, g.abs() + EPS)
    return p - lr / (1 - BETA1**step) * m / u, m, u


def hand_inner_loop(loss_fn, p, x, y, k):
    """`k` Adamax steps (lr 0.01) on the loss at (x, y), by hand: what ``fo.inner_loop``
    does, in plain tensor math. Returns the adapted params."""
    m = {n: torch.zeros_like(v) for n, v in p.items()}
    u = {n: torch.zeros_like(v) for n, v in p.items()}
    for step in range(1, k + 1):
        g = grad(loss_fn)(p, x, y)
        new = {n: hand_adamax(p[n], g[n], m[n], u[n], step, 0.01) for n in p}
        p, m, u = ({n: v[i] for n, v in new.items()} for i in range(3))
    return p


# -- 1. sweeps ------------------------------------------------------------------------


def sweep_problem(case: str):
    """The lr sweep's or the ensemble's params and lrs (16 each), its loss, and its
    steps: funcopt's and the same by hand (each with its initial state), and funcopt's
    whole eager run."""
    model, params, x, y = mlp_problem()
    if case == "lr sweep":
        P = {k: v.expand(RUNS, *v.shape).clone() for k, v in params.items()}
        lr = torch.logspace(-4, -0.5, RUNS)
    else:
        inits = [mlp_problem(seed)[1] for seed in range(RUNS)]
        P = {k: torch.stack([p[k] for p in inits]) for k in params}
        lr = torch.full((RUNS,), 1e-2)

    def loss_fn(p, x, y):
        return F.mse_loss(functional_call(model, p, (x,)), y)

    def fo_step(p, s, lr):
        updates, s = fo.adamax(lr=lr).update(grad(loss_fn)(p, x, y), s, p)
        return fo.apply_updates(p, updates), s

    def hand_step(p, s, lr):
        step, m, u = s
        step = step + 1
        g = grad(loss_fn)(p, x, y)
        new = {k: hand_adamax(p[k], g[k], m[k], u[k], step, lr) for k in p}
        return {k: v[0] for k, v in new.items()}, (step, {k: v[1] for k, v in new.items()}, {k: v[2] for k, v in new.items()})  # fmt: skip

    def fo_run(p, lr, steps=STEPS):  # the eager contender: the whole run under vmap
        return fo.inner_loop(loss_fn, p, fo.adamax(lr=lr), [(x, y)] * steps)[0]

    zeros = {k: torch.zeros_like(v) for k, v in P.items()}
    steps = {
        "funcopt": (fo_step, vmap(fo.adamax().init)(P)),
        "by hand": (hand_step, (torch.zeros(RUNS), zeros, zeros)),
    }
    return P, lr, x, y, steps, fo_run


def compiled_contender(spec: str):
    """The compiled function that `spec` names, and the arguments of its first call:
    ``sweep:<case>:<name>`` (one vmapped step; ``sweep:<case>:<name>:tanh`` with
    inductor's tanh decomposed, see `TANH`) or ``maml:<K>:<name>`` (a meta-gradient)."""
    what, case, name, *tanh = spec.split(":")
    if what == "sweep":
        P, lr, _, _, steps, _ = sweep_problem(case)
        step, state = steps[name]
        return torch.compile(vmap(step), fullgraph=True, options=TANH if tanh else None), (P, state, lr)
    fns, meta_params = maml_functions(int(case))
    return torch.compile(fns[name], fullgraph=True), (meta_params,)


def first_call_child_main(spec: str) -> None:
    """In a new process: the seconds of `spec`'s first call (torch's own first-compile
    set-up, such as probing the compiler, paid before, on a trivial function)."""
    given = os.environ["TORCHINDUCTOR_CACHE_DIR"]  # the cache the parent then compiles from, warm
    with tempfile.TemporaryDirectory() as cache:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
        torch.compile(lambda t: t * 2)(torch.ones(3))
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = given
    fn, args = compiled_contender(spec)
    t0 = time.perf_counter()
    fn(*args)
    print(json.dumps(time.perf_counter() - t0))


def first_calls(spec: str) -> tuple[float | None, float | None, Any]:
    """`spec`'s first call in a new process with an empty inductor cache (cold; None if
    not done within ``--max-compile`` s), then here with the cache it filled (warm), and
    the compiled function (or None)."""
    with tempfile.TemporaryDirectory() as cache:
        try:
            child = subprocess.run(
                [sys.executable, __file__, f"--first-call={spec}"],
                check=True,
                stdout=subprocess.PIPE,
                text=True,
                timeout=MAX_COMPILE[0],
                env={**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache},
            )
        except subprocess.TimeoutExpired:
            return None, None, None
        cold = json.loads(child.stdout.splitlines()[-1])
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
        torch._dynamo.reset()
        fn, args = compiled_contender(spec)
        t0 = time.perf_counter()
        fn(*args)
        return cold, time.perf_counter() - t0, fn


def sweep_benchmark(rounds: int) -> list[list[str]]:
    import jax
    import jax.numpy as jnp
    import optax

    rows: list[list[str]] = []
    for case in ("lr sweep", "ensemble"):
        P, lr, x, y, steps, fo_run = sweep_problem(case)
        jx, jy, jlr = jnp.asarray(x.numpy()), jnp.asarray(y.numpy()), jnp.asarray(lr.numpy())
        jp = {k: jnp.asarray(v.numpy()) for k, v in P.items()}
        rows += sweep_case(rounds, case, P, lr, steps, fo_run, jax_sweep(jax, jnp, optax, jx, jy, jp, jlr))
    return rows


def jax_sweep(jax, jnp, optax, jx, jy, jp, jlr):
    """optax's contenders: the vmapped step, jitted, and the whole run in one jit; each
    with its first call (s), from cleared caches."""

    def j_loss(p):
        h = jnp.tanh(jx @ p["0.weight"].T + p["0.bias"])
        return jnp.mean((h @ p["2.weight"].T + p["2.bias"] - jy) ** 2)

    def j_step(p, s, lr):
        tx = optax.inject_hyperparams(optax.adamax)(learning_rate=lr)
        updates, s = tx.update(jax.grad(j_loss)(p), s, p)
        return optax.apply_updates(p, updates), s

    def j_whole(p, s, lr):
        return jax.lax.fori_loop(0, STEPS, lambda _, c: jax.vmap(j_step)(*c, lr), (p, s))[0]

    js = jax.vmap(lambda p, lr: optax.inject_hyperparams(optax.adamax)(learning_rate=lr).init(p))(jp, jlr)
    jax.clear_caches()
    stepped, whole = jax.jit(jax.vmap(j_step)), jax.jit(j_whole)
    _, first_step = jax_first_call(stepped, jp, js, jlr)
    _, first_whole = jax_first_call(whole, jp, js, jlr)

    def looped():
        p, s = jp, js
        for _ in range(STEPS):
            p, s = stepped(p, s, jlr)
        return jax.block_until_ready(p)

    return {
        "optax": (looped, first_step),
        "optax whole": (lambda: jax.block_until_ready(whole(jp, js, jlr)), first_whole),
    }


TANH = {"cpp.use_decompose_tanh": True}
"""inductor's option that computes tanh from exp (as XLA's CPU backend approximates it),
where by default it calls a vectorized tanh that takes about 2.5x XLA's time."""


def sweep_case(rounds, case, P, lr, steps, fo_run, jax_fns) -> list[list[str]]:
    first, compiled = {}, {}
    names = [*steps, *(f"{name}:tanh" for name in steps)]  # each also with tanh decomposed
    for name in names:
        first[name] = first_calls(f"sweep:{case}:{name}")
        compiled[name] = first[name][2]

    def looped(name):
        step, (p, s) = compiled[name], (P, steps[name.split(":")[0]][1])
        for _ in range(STEPS):
            p, s = step(p, s, lr)
        return p

    fns = {"funcopt eager": lambda: vmap(fo_run)(P, lr)}
    fns.update({f"{name} compiled": functools.partial(looped, name) for name in names})
    fns.update({name: fn for name, (fn, _) in jax_fns.items()})
    # agreement: the compiled step against the eager run, after a few steps (float32)
    short = vmap(functools.partial(fo_run, steps=5))(P, lr)
    p, s = P, steps["funcopt"][1]
    for _ in range(5):
        p, s = compiled["funcopt"](p, s, lr)
    err = max((p[k] - short[k]).abs().max().item() for k in p)
    t = interleaved(fns, rounds, warmup=1)
    o, o_first = t["optax"], jax_fns["optax"][1]
    print(
        f"1. {case}, {RUNS} x {STEPS} Adamax steps, 8->64->1 MLP: funcopt eager vmap "
        f"{t['funcopt eager'] * 1e3:.0f} ms ({t['funcopt eager'] / o:.1f}x optax), compiled step "
        f"{t['funcopt compiled'] * 1e3:.0f} ms ({t['funcopt compiled'] / o:.2f}x; target <= 1.5x), "
        f"by hand compiled {t['by hand compiled'] * 1e3:.0f} ms ({t['by hand compiled'] / o:.2f}x), "
        f"tanh decomposed: funcopt {t['funcopt:tanh compiled'] * 1e3:.0f} ms "
        f"({t['funcopt:tanh compiled'] / o:.2f}x), by hand {t['by hand:tanh compiled'] * 1e3:.0f} ms "
        f"({t['by hand:tanh compiled'] / o:.2f}x), "
        f"optax jit step {o * 1e3:.0f} ms, optax whole-run jit {t['optax whole'] * 1e3:.0f} ms. "
        f"First call, cold (warm cache): funcopt {first['funcopt'][0]:.1f} s ({first['funcopt'][1]:.1f} s), "
        f"by hand {first['by hand'][0]:.1f} s ({first['by hand'][1]:.1f} s), optax {o_first:.1f} s "
        f"(whole run {jax_fns['optax whole'][1]:.1f} s). max |compiled - eager| after 5 steps {err:.1e}",
        flush=True,
    )
    rows = [[f"1. {case}: funcopt, eager `vmap` of the run", f"{t['funcopt eager'] * 1e3:.0f}", "",
             f"{o * 1e3:.0f}", f"{o_first:.1f}", f"**{t['funcopt eager'] / o:.1f}x**", ""]]  # fmt: skip
    for name in names:
        who, tanh = name.split(":")[0], " (inductor's tanh decomposed)" if name.endswith(":tanh") else ""
        rows.append([
            f"1. {case}: {who}, `torch.compile(vmap(step))` x {STEPS}{tanh}" + (" (torch's floor)" if who == "by hand" else ""),
            f"{t[name + ' compiled'] * 1e3:.0f}", f"{first[name][0]:.1f} ({first[name][1]:.1f})",
            f"{o * 1e3:.0f}", f"{o_first:.1f}", f"**{t[name + ' compiled'] / o:.2f}x**",
            "<= 1.5x, compile < 5 s" if who == "funcopt" else "",
        ])  # fmt: skip
    rows.append([f"1. {case}: optax, the whole run in one `jax.jit` (`fori_loop`)", "", "",
                 f"{t['optax whole'] * 1e3:.0f}", f"{jax_fns['optax whole'][1]:.1f}", "", ""])  # fmt: skip
    return rows


# -- 2. MAML ----------------------------------------------------------------------------


def maml_problem(tasks: int = 8, points: int = 10):
    model = sinusoid_model()
    meta_params = {k: v.detach().clone() for k, v in model.named_parameters()}
    xs, ys, _, _ = sinusoid_tasks(tasks, points, torch.Generator().manual_seed(0))

    def loss_fn(p, x, y):
        return F.mse_loss(functional_call(model, p, (x,)), y)

    return model, meta_params, xs, ys, loss_fn


def maml_functions(k: int):
    """The meta-gradient functions of funcopt and by hand, and their input."""
    _, meta_params, xs, ys, loss_fn = maml_problem()

    def fo_task(p, x, y):
        adapted, _, _ = fo.inner_loop(loss_fn, p, fo.adamax(lr=0.01), [(x, y)] * k)
        return loss_fn(adapted, x, y)

    def hand_task(p, x, y):
        return loss_fn(hand_inner_loop(loss_fn, p, x, y, k), x, y)

    def meta(task):
        return grad_and_value(lambda p: vmap(task, in_dims=(None, 0, 0))(p, xs, ys).mean())

    return {"funcopt": meta(fo_task), "by hand": meta(hand_task)}, meta_params


def optax_maml(k: int, scan: bool):
    import jax
    import jax.numpy as jnp
    import optax

    _, meta_params, xs, ys, _ = maml_problem()
    jp = {n: jnp.asarray(v.numpy()) for n, v in meta_params.items()}
    jxs, jys = jnp.asarray(xs.numpy()), jnp.asarray(ys.numpy())
    opt = optax.adamax(0.01)

    def loss_fn(p, x, y):
        h = jax.nn.relu(x @ p["0.weight"].T + p["0.bias"])
        h = jax.nn.relu(h @ p["2.weight"].T + p["2.bias"])
        return jnp.mean((h @ p["4.weight"].T + p["4.bias"] - y) ** 2)

    def task(p, x, y):
        def body(c, _):
            p, s = c
            updates, s = opt.update(jax.grad(loss_fn)(p, x, y), s, p)
            return (optax.apply_updates(p, updates), s), None

        c = (p, opt.init(p))
        if scan:
            c, _ = jax.lax.scan(body, c, None, length=k)
        else:
            for _ in range(k):
                c, _ = body(c, None)
        return loss_fn(c[0], x, y)

    jax.clear_caches()
    meta = jax.jit(jax.value_and_grad(lambda p: jax.vmap(task, in_axes=(None, 0, 0))(p, jxs, jys).mean()))
    return lambda: jax.block_until_ready(meta(jp))


def maml_benchmark(rounds: int, k: int) -> list[list[str]]:
    fns_, meta_params = maml_functions(k)
    j = optax_maml(k, scan=k > 5)
    first: dict = {}
    _, first["optax"] = jax_first_call(j)
    fns = {"funcopt eager": lambda: fns_["funcopt"](meta_params), "optax": j}
    for name in ("funcopt", "by hand"):
        first[name] = first_calls(f"maml:{k}:{name}")
        if first[name][2] is not None:
            fns[f"{name} compiled"] = functools.partial(first[name][2], meta_params)
    if "funcopt compiled" in fns:  # the compiled meta-gradient agrees with the eager one
        (g_c, _), (g_e, _) = fns["funcopt compiled"](), fns["funcopt eager"]()
        err = max((g_c[n] - g_e[n]).abs().max().item() for n in g_e)
        print(f"   K={k}: max |compiled - eager| of the meta-gradient {err:.1e}", flush=True)
    t = interleaved(fns, rounds)
    o = t["optax"]
    how = "lax.scan" if k > 5 else "unrolled"
    line = f"2. MAML, 8 tasks x K={k} Adamax steps, second order: funcopt eager {t['funcopt eager'] * 1e3:.1f} ms ({t['funcopt eager'] / o:.1f}x optax)"  # noqa: E501
    rows = [[f"2. MAML K={k}: funcopt eager (`vmap` over tasks)", f"{t['funcopt eager'] * 1e3:.1f}", "",
             f"{o * 1e3:.2f}", f"{first['optax']:.1f}", f"**{t['funcopt eager'] / o:.1f}x**", ""]]  # fmt: skip
    for name in ("funcopt", "by hand"):
        cold, warm, _ = first[name]
        target = ("<= 1.0x, compile < 15 s" if k == 5 else "compile < 30 s") if name == "funcopt" else ""
        what = f"2. MAML K={k}: {name}, `torch.compile` of the meta-gradient (K steps unrolled)"
        what += " (torch's floor)" if name == "by hand" else ""
        if cold is None:
            line += f", {name} compiled: no first call within {MAX_COMPILE[0]:.0f} s"
            rows.append(
                [what, "", f"> {MAX_COMPILE[0]:.0f}", f"{o * 1e3:.2f}", f"{first['optax']:.1f}", "", target]
            )
            continue
        run_s = t[f"{name} compiled"]
        line += f", {name} compiled {run_s * 1e3:.2f} ms ({run_s / o:.2f}x; first call {cold:.0f} s, warm cache {warm:.0f} s)"  # noqa: E501
        rows.append([what, f"{run_s * 1e3:.2f}", f"{cold:.1f} ({warm:.1f})", f"{o * 1e3:.2f}",
                     f"{first['optax']:.1f}", f"**{run_s / o:.2f}x**", target])  # fmt: skip
    print(f"{line}; optax jit ({how}) {o * 1e3:.2f} ms (first call {first['optax']:.1f} s)", flush=True)
    return rows


MAX_COMPILE = [600.0]


# -- 3. memory --------------------------------------------------------------------------


def rss_now() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_rss() -> int:
    """This process's peak resident set, bytes: ``VmHWM``, where Linux has it (the
    ``ru_maxrss`` of a child keeps its parent's peak across fork and exec), else
    ``ru_maxrss``."""
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) * 1024
    except (OSError, StopIteration):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def memory_child_main(spec: str) -> None:
    """One eager second-order meta-gradient of a K-step unroll; prints peak RSS (bytes)
    and the RSS just before."""
    name, k = spec.split(",")
    k = int(k)
    model, meta_params, xs, ys, loss_fn = maml_problem(points=1000)
    meta_params = {n: v.requires_grad_() for n, v in meta_params.items()}

    def adapt(p, x, y):
        if name == "funcopt":
            return fo.inner_loop(loss_fn, p, fo.adamax(lr=0.01), [(x, y)] * k)[0]
        return hand_inner_loop(loss_fn, p, x, y, k)

    before = rss_now()
    total = sum(loss_fn(adapt(meta_params, xs[t], ys[t]), xs[t], ys[t]) for t in range(len(xs)))
    total.backward()
    print(json.dumps({"peak": peak_rss(), "before": before}))


def memory_benchmark() -> list[list[str]]:
    rows = []
    for k in (5, 50):
        got = {}
        for name in ("funcopt", "by hand"):
            child = subprocess.run(
                [sys.executable, __file__, f"--memory-child={name},{k}"],
                check=True,
                stdout=subprocess.PIPE,
                text=True,
            )
            got[name] = json.loads(child.stdout.splitlines()[-1])
        grow = {n: (v["peak"] - v["before"]) / 2**20 for n, v in got.items()}
        peak = {n: v["peak"] / 2**20 for n, v in got.items()}
        ratio = grow["funcopt"] / grow["by hand"]
        print(
            f"3. peak memory, second-order unroll of K={k} Adamax steps (8 tasks x 1000 points): "
            f"funcopt +{grow['funcopt']:.0f} MiB (peak RSS {peak['funcopt']:.0f} MiB), by hand "
            f"+{grow['by hand']:.0f} MiB (peak {peak['by hand']:.0f} MiB) -> {ratio:.2f}x (target <= 1.2x)",
            flush=True,
        )
        rows.append([
            f"3. peak memory of a second-order K={k} unroll, MiB over the RSS before it (peak RSS "
            f"{peak['funcopt']:.0f} vs {peak['by hand']:.0f} MiB): funcopt vs by hand",
            f"{grow['funcopt']:.0f}", "", f"{grow['by hand']:.0f}", "", f"**{ratio:.2f}x**", "<= 1.2x",
        ])  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--max-compile", type=float, default=600.0, help="K=50 compile limit, seconds")
    parser.add_argument("--skip-k50", action="store_true", help="leave out MAML's K=50 compiled contenders")
    parser.add_argument("--only", help="comma-separated sections to run: 1,2,3")
    parser.add_argument("--write-table", metavar="PATH", help="also write the results as Markdown to PATH")
    parser.add_argument("--first-call", help=argparse.SUPPRESS)
    parser.add_argument("--memory-child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.first_call:
        return first_call_child_main(args.first_call)
    if args.memory_child:
        return memory_child_main(args.memory_child)
    MAX_COMPILE[0] = args.max_compile
    with tempfile.TemporaryDirectory() as cache:  # torch's one-time set-up, as in the children
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
        torch.compile(lambda t: t * 2)(torch.ones(3))
    sections = set((args.only or "1,2,3").split(","))
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s)", flush=True)
    rows = []
    if "1" in sections:
        rows += sweep_benchmark(args.rounds)
    if "2" in sections:
        rows += maml_benchmark(3 * args.rounds, 5)
        if not args.skip_k50:
            rows += maml_benchmark(args.rounds, 50)
    if "3" in sections:
        rows += memory_benchmark()
    if args.write_table:
        header = ["benchmark", "funcopt (or by hand) ms; 3: MiB", "its first call, s (warm cache)", "optax ms; 3: by hand, MiB", "optax first call, s", "ratio", "target"]  # fmt: skip
        note = f"Medians of {args.rounds} interleaved rounds ({3 * args.rounds} for MAML K=5); first calls with cold caches."
        write_table(args.write_table, markdown_table(header, rows), "cpu", note)


if __name__ == "__main__":
    main()
