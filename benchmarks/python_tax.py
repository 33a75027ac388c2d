"""The Python tax of a functional step: funcopt's pure step on a small model, against
torch.optim's eager step of the same algorithm, measured in the same run.

On an 8 -> 64 -> 1 MLP (4 tensors, 641 elements), where per-call overhead, not memory,
sets the time, it times for each algorithm one ``tx.update`` + ``fo.apply_updates``
(the pure step, its results fresh tensors) and torch.optim's step in its two eager
paths (the for-loop and ``foreach=True``), interleaved round by round, with one torch
thread, and prints the medians and the ratio to torch's faster step (target, issue 61:
at most 1.2x but for SGD). It also times the same pure step under ``torch.compile``
(``compiled``: one graph, compiled once before the rounds, its first call timed apart),
which removes the Python around the math; and, for Adamax, the pure step's tensor work
alone, the same foreach ops written by hand without funcopt (``floor``: fresh buffers,
the update, then ``params + updates``), and those ops inside the least a pytree API
must do (``pytree floor``), to show how much of the eager step is Python.

    python benchmarks/python_tax.py [--rounds 2000] [--algorithms Adam,SGD] [--skip-compile]
        [--write-table docs/_generated/python_tax.md]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import optree
import torch

import funcopt as fo

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from step_time import default_algorithms, markdown_table, write_table  # noqa: E402

SHAPES = [(64, 8), (64,), (1, 64), (1,)]
LR = 1e-3


def factory(name: str) -> fo.GradientTransformation:
    return getattr(fo, name.lower())(lr=LR)


def adamax_floor(params: list[torch.Tensor], grads: list[torch.Tensor]) -> object:
    """Adamax's pure step as bare foreach ops: what a step costs with no Python around it."""
    exp_avg = [torch.zeros_like(p) for p in params]
    exp_inf = [torch.zeros_like(p) for p in params]

    def step() -> list[torch.Tensor]:
        out = [torch.zeros_like(p) for p in params]
        m = torch._foreach_lerp(exp_avg, grads, 0.1)
        u = torch._foreach_maximum(
            torch._foreach_mul(exp_inf, 0.999), torch._foreach_add(torch._foreach_abs(grads), 1e-8)
        )
        torch._foreach_addcdiv_(out, m, u, -LR)
        return torch._foreach_add(params, out)

    return step


def adamax_pytree_floor(params: list[torch.Tensor], grads: list[torch.Tensor]) -> object:
    """Adamax's pure step as a pytree API with no checks would run it: `adamax_floor`'s ops
    plus what no pure ``update`` + ``apply_updates`` can skip (flattening the grads, state
    and params, reading the count, a new count tensor, rebuilding the updates, state and
    params as trees)."""
    state = [torch.tensor(0.0), [torch.zeros_like(p) for p in params], [torch.zeros_like(p) for p in params]]
    carry = [params, state]

    def update(grads: object, state: list, params: object) -> tuple[object, list]:
        gs, treedef = optree.tree_flatten(grads)
        count, exp_avg, exp_inf = state
        ms, us = treedef.flatten_up_to(exp_avg), treedef.flatten_up_to(exp_inf)
        t = count.item() + 1
        m = torch._foreach_lerp(ms, gs, 0.1)
        u = torch._foreach_maximum(
            torch._foreach_mul(us, 0.999), torch._foreach_add(torch._foreach_abs(gs), 1e-8)
        )
        updates = torch._foreach_div(m, u)
        torch._foreach_mul_(updates, -LR / (1 - 0.9**t))
        new = [torch.scalar_tensor(t), treedef.unflatten(m), treedef.unflatten(u)]
        return treedef.unflatten(updates), new

    def apply_updates(params: object, updates: object) -> object:
        ps, treedef = optree.tree_flatten(params)
        return treedef.unflatten(torch._foreach_add(ps, treedef.flatten_up_to(updates)))

    def step() -> None:
        updates, carry[1] = update(grads, carry[1], carry[0])
        carry[0] = apply_updates(carry[0], updates)

    return step


def timed(name: str, rounds: int, compiled: bool) -> dict[str, float]:
    """Median seconds per step of each contender, interleaved round by round (and the
    seconds of the compiled step's first call, as ``"compile"``)."""
    torch.manual_seed(0)
    params = [torch.randn(s) for s in SHAPES]
    grads = [torch.randn(s) for s in SHAPES]
    tx = factory(name)

    def pure_step(grads: list, state: object, params: list) -> tuple[list, object]:
        updates, state = tx.update(grads, state, params)
        return fo.apply_updates(params, updates), state

    def runner(step: object) -> object:
        carry = [params, tx.init(params)]

        def run() -> None:
            carry[0], carry[1] = step(grads, carry[1], carry[0])

        return run

    contenders = {"functional": runner(pure_step)}
    first_call = {}
    if compiled:
        torch._dynamo.reset()  # each algorithm's step is a new closure of one code object
        contenders["compiled"] = runner(torch.compile(pure_step))
        t0 = time.perf_counter()
        contenders["compiled"]()
        first_call["compile"] = time.perf_counter() - t0
    for label, foreach in (("torch", False), ("torch foreach", True)):
        ps = [p.clone().requires_grad_() for p in params]
        for p, g in zip(ps, grads):
            p.grad = g.clone()
        contenders[label] = getattr(torch.optim, name)(ps, lr=LR, foreach=foreach).step
    if name == "Adamax":
        contenders["floor"] = adamax_floor(params, grads)
        contenders["pytree floor"] = adamax_pytree_floor(params, grads)
    times: dict[str, list[float]] = {label: [] for label in contenders}
    for r in range(rounds + rounds // 10):
        for label, step in contenders.items():
            t0 = time.perf_counter()
            step()
            if r >= rounds // 10:  # warm-up rounds are not counted
                times[label].append(time.perf_counter() - t0)
    return {**{label: statistics.median(ts) for label, ts in times.items()}, **first_call}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2000)
    parser.add_argument("--algorithms", default=",".join(default_algorithms()))
    parser.add_argument("--skip-compile", action="store_true", help="leave out the compiled step")
    parser.add_argument("--write-table", metavar="PATH", help="also write the table as Markdown to PATH")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = []
    floors = ""
    for name in args.algorithms.split(","):
        t = timed(name, args.rounds, not args.skip_compile)
        best = min(t["torch"], t["torch foreach"])
        us = {label: f"{seconds * 1e6:.1f}" for label, seconds in t.items()}
        row = [name, us["torch"], us["torch foreach"], us["functional"], f"**{t['functional'] / best:.2f}x**"]
        line = (
            f"{name:10} torch {us['torch']:>7}us  foreach {us['torch foreach']:>7}us  "
            f"functional {us['functional']:>7}us  functional / torch {t['functional'] / best:.2f}x"
        )
        if "compiled" in t:
            row += [us["compiled"], f"**{t['compiled'] / best:.2f}x**", f"{t['compile']:.1f}"]
            line += f"  compiled {us['compiled']:>7}us  {t['compiled'] / best:.2f}x (first call {t['compile']:.1f}s)"
        if "floor" in t:
            line += f"   floor (bare foreach ops) {us['floor']}us, as a pytree API {us['pytree floor']}us"
            floors = (
                f" {name}'s floor: {us['floor']} µs as bare foreach ops ({t['floor'] / best:.2f}x torch), "
                f"{us['pytree floor']} µs as a pytree API with no checks ({t['pytree floor'] / best:.2f}x)."
            )
        rows.append(row)
        print(line, flush=True)
    header = ["algorithm", "torch µs", "torch foreach µs", "functional µs", "functional / torch"]
    if not args.skip_compile:
        header += ["compiled µs", "compiled / torch", "first compiled call s"]
    if args.write_table:
        write_table(
            args.write_table, markdown_table(header, rows), note=f"8-64-1 MLP, {args.rounds} rounds.{floors}"
        )


if __name__ == "__main__":
    main()
