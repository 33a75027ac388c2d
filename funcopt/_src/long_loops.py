"""Long inner loops: `inner_loop`'s ``truncate=k`` (backprop through the last k steps
only) and ``checkpoint_every=n`` (keep every n-th step's params and state, recompute
the steps between them in the backward pass).

Checkpointing is an ``autograd.Function`` per segment of n steps: its forward runs the
steps without a graph and keeps the segment's inputs; its backward recomputes them with
a graph (the random-number state restored, so dropout draws the same masks) and
differentiates them. Peak memory is then about K/n segment inputs plus one segment's
graph, instead of K steps' graphs.

Its gradients reach only the segment's inputs: the params, the state and the batches.
A tensor that requires grad and that a step reads from elsewhere (a tensor
hyperparameter the transform holds, a tensor `loss_fn` reads from a closure) would lose
its gradient, so the loop first runs one step with a graph and looks for one in it (the
backward pass looks again in each graph it recomputes) and raises an error that says
what to do. ``torch.func`` transforms cannot run this Function's
backward (it calls ``torch.autograd.grad``), so there checkpointing raises an error too.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import optree
import torch
from torch import Tensor

Step = Callable[[Any, Any, Any], tuple[Any, Any, Tensor]]
"""``step(params, state, batch) -> (params, state, loss)``: one step of the inner loop."""


def _count(value: Any, name: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"inner_loop: {name} must be a positive int (a number of steps), got {value!r}")
    return value


def run_long(
    step: Step,
    params: Any,
    state: Any,
    batches: Sequence[Any],
    checkpoint_every: int | None,
    truncate: int | None,
) -> tuple[Any, Any, list[Tensor]]:
    """`inner_loop`'s steps with truncation and/or checkpointing (`batches` a list)."""
    losses: list[Tensor] = []
    if truncate is not None and _count(truncate, "truncate") < len(batches):
        initial = optree.tree_leaves(state)  # (held, so that the ids stay theirs)
        kept = {id(x) for x in initial}  # tensors the steps pass on unchanged keep their graph
        with torch.no_grad():
            for batch in batches[: len(batches) - truncate]:
                params, state, loss = step(params, state, batch)
                losses.append(loss.detach())
        params = optree.tree_map(_detach, params)
        state = optree.tree_map(lambda x: x if id(x) in kept else _detach(x), state)
        batches = batches[len(batches) - truncate :]
    if checkpoint_every is None:
        for batch in batches:
            params, state, loss = step(params, state, batch)
            losses.append(loss)
        return params, state, losses
    n = _count(checkpoint_every, "checkpoint_every")
    if torch._C._functorch.peek_interpreter_stack() is not None:
        raise RuntimeError(
            "inner_loop(checkpoint_every=...) does not run under torch.func transforms (grad, vjp, vmap, "
            "jacrev): its backward pass recomputes steps with torch.autograd.grad, which they refuse. "
            "Differentiate it with .backward() or torch.autograd.grad (and loop over tasks instead of vmap), "
            "or use the plain loop (checkpoint_every=None), or truncate=k to bound its memory"
        )
    if batches and torch.is_grad_enabled():
        _probe(_Segment(step, params, state, batches[:1]))
    for start in range(0, len(batches), n):
        params, state, segment_losses = _Segment(step, params, state, batches[start : start + n]).run()
        losses.extend(segment_losses)
    return params, state, losses


def _probe(segment: _Segment) -> None:
    """Run one step with a graph (the random state restored after) and refuse a
    tensor that requires grad outside the step's inputs, before the loop runs."""
    inputs = [x.detach().requires_grad_(x.requires_grad) for x in segment.inputs()]
    with torch.random.fork_rng(devices=list(segment.rng[1])):
        outputs = segment(inputs)
    _refuse_foreign_leaves([y for y in outputs if y.requires_grad], [x for x in inputs if x.requires_grad])


def _detach(x: Any) -> Any:
    return x.detach() if isinstance(x, Tensor) else x


class _Segment:
    """A few steps as a function of their input tensors, for `_Checkpoint`."""

    def __init__(self, step: Step, params: Any, state: Any, batches: Sequence[Any]):
        self.step, self.n_steps = step, len(batches)
        tree: Any = (params, state, list(batches))
        leaves, self.in_spec = optree.tree_flatten(tree, none_is_leaf=True)
        self.in_leaves = leaves
        self.in_tensors = [i for i, x in enumerate(leaves) if isinstance(x, Tensor)]
        self.out_spec: Any = None
        self.out_leaves: list[Any] = []
        self.out_tensors: list[int] = []
        self.rng = _rng_state([leaves[i] for i in self.in_tensors])

    def __call__(self, tensors: Sequence[Tensor]) -> tuple[Tensor, ...]:
        """The steps from the input tensors: the output tensors (params' and state's
        tensor leaves, then each step's loss)."""
        leaves = list(self.in_leaves)
        for i, x in zip(self.in_tensors, tensors):
            leaves[i] = x
        params, state, batches = optree.tree_unflatten(self.in_spec, leaves)
        losses = []
        for batch in batches:
            params, state, loss = self.step(params, state, batch)
            losses.append(loss)
        tree: Any = (params, state)
        out, self.out_spec = optree.tree_flatten(tree, none_is_leaf=True)
        self.out_leaves = out
        self.out_tensors = [i for i, x in enumerate(out) if isinstance(x, Tensor)]
        return (*[out[i] for i in self.out_tensors], *losses)

    def inputs(self) -> list[Tensor]:
        return [self.in_leaves[i] for i in self.in_tensors]

    def run(self) -> tuple[Any, Any, list[Tensor]]:
        outputs = _Checkpoint.apply(self, *self.inputs())
        n_carry = len(outputs) - self.n_steps
        leaves = list(self.out_leaves)
        for i, x in zip(self.out_tensors, outputs[:n_carry]):
            leaves[i] = x
        params, state = optree.tree_unflatten(self.out_spec, leaves)
        return params, state, list(outputs[n_carry:])


def _rng_state(tensors: Sequence[Tensor]) -> tuple[Tensor, dict[torch.device, Tensor]]:
    devices = {x.device for x in tensors if x.device.type == "cuda"}
    return torch.get_rng_state(), {d: torch.cuda.get_rng_state(d) for d in devices}


def _differentiable(x: Tensor) -> bool:
    return x.is_floating_point() or x.is_complex()


class _Checkpoint(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, segment: _Segment, *inputs: Tensor) -> tuple[Tensor, ...]:
        ctx.segment = segment
        ctx.save_for_backward(*inputs)
        with torch.no_grad():
            outputs = segment(inputs)
        ids = {id(x) for x in inputs}
        outputs = tuple(x.clone() if id(x) in ids else x for x in outputs)  # a new tensor for each output
        ctx.mark_non_differentiable(*[x for x in outputs if not _differentiable(x)])
        return outputs

    @staticmethod
    def backward(ctx: Any, *grads: Tensor) -> tuple[Tensor | None, ...]:
        if torch.is_grad_enabled():
            raise RuntimeError(
                "inner_loop(checkpoint_every=...): a backward pass with create_graph=True (to differentiate a "
                "gradient again) cannot recompute the segments; use the plain loop (checkpoint_every=None) "
                "for higher-order derivatives (its second-order meta-gradient needs no double backward)"
            )
        segment: _Segment = ctx.segment
        wanted = ctx.needs_input_grad[1:]
        inputs = [
            x.detach().requires_grad_(bool(need and _differentiable(x)))
            for x, need in zip(ctx.saved_tensors, wanted)
        ]
        cpu_rng, cuda_rng = segment.rng
        with torch.random.fork_rng(devices=list(cuda_rng)), torch.enable_grad():
            torch.set_rng_state(cpu_rng)
            for device, rng in cuda_rng.items():
                torch.cuda.set_rng_state(rng, device)
            outputs = segment(inputs)
        pairs = [(y, g) for y, g in zip(outputs, grads) if y.requires_grad and g is not None]
        leaves = [x for x in inputs if x.requires_grad]
        if not pairs or not leaves:
            return (None, *[None] * len(inputs))
        _refuse_foreign_leaves([y for y, _ in pairs], leaves)
        found = iter(
            torch.autograd.grad([y for y, _ in pairs], leaves, [g for _, g in pairs], allow_unused=True)
        )
        return (None, *[next(found) if x.requires_grad else None for x in inputs])


def _refuse_foreign_leaves(
    outputs: list[Tensor], own: list[Tensor], who: str = "inner_loop(checkpoint_every=...)"
) -> None:
    """Raise if the graph of `outputs` reaches a tensor that requires grad other than
    `own`: its gradient would be lost (the Function returns gradients for its inputs)."""
    own_ids = {id(x) for x in own}
    stack, seen = [y.grad_fn for y in outputs], set()
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        variable = getattr(node, "variable", None)  # an AccumulateGrad node: a leaf
        if variable is not None:
            if id(variable) not in own_ids:
                raise RuntimeError(
                    f"{who}: a step reads a tensor that requires grad but is not "
                    f"in params, state or the batches (shape {tuple(variable.shape)}, dtype {variable.dtype}), "
                    "such as a tensor hyperparameter given to the transform or a tensor loss_fn reads from "
                    "a closure. Its gradient would be lost or wrong. Put a differentiable "
                    "hyperparameter in the state (fo.inject_hyperparams(fo.adam)(lr=lr)), pass other tensors "
                    "in each batch, or use the plain fo.inner_loop"
                )
            continue
        stack.extend(fn for fn, _ in node.next_functions)
