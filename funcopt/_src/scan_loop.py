"""`scan_inner_loop`: `inner_loop` as one ``torch._higher_order_ops.scan`` over
stacked batches, so that ``torch.compile`` traces one step, not K (its compile time
does not grow with K).

torch 2.13's scan is a prototype, and this wrapper refuses what it gets wrong or cannot
run, rather than return a wrong number:

- ``torch.func`` transforms over scan fail inside torch ("Expected FakeTensor"): an
  error names `inner_loop` instead.
- A double backward through scan gave a wrong second derivative (1701.8 against
  1393.7 by finite differences): the inputs and outputs pass through an identity whose
  backward refuses ``create_graph=True``, so differentiating a gradient raises an error.
- A tensor that requires grad and that the steps read from a closure (a tensor
  hyperparameter held by the transform) would escape that guard: the loop refuses it
  (put it in the state with ``fo.inject_hyperparams``).
- The carry's structure must stay the same from step to step.
- Eagerly, scan traces its body at every call (seconds). Under ``torch.compile`` the
  initial carry must not alias itself (Adam's one step count shared by all params is
  copied here), and even so inductor fails in torch 2.13 ("DataDependentOutputException:
  aten._local_scalar_dense", forward alone included): its lowering of scan to a
  ``while_loop`` reads the loop counter with ``.item()``. With
  ``torch._dynamo.config.capture_scalar_outputs = True`` it compiles, as one graph
  (``fullgraph=True`` works): there the probing step is traced, not run (`_traced_probe`);
  docs/long-inner-loops.md has the numbers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import optree
import torch
import torch.utils._pytree as pytree
from torch import Tensor

from .core.base import GradientTransformation, Params, State, apply_updates, check_transformation
from .long_loops import _refuse_foreign_leaves


class _FirstOrderOnly(torch.autograd.Function):
    """The identity, whose backward refuses to build a graph (``create_graph=True``):
    a gradient through torch's scan cannot be differentiated again correctly."""

    @staticmethod
    def forward(ctx: Any, *xs: Tensor) -> tuple[Tensor, ...]:
        return tuple(x.view_as(x) for x in xs)

    @staticmethod
    def backward(ctx: Any, *grads: Tensor) -> tuple[Tensor, ...]:
        if torch.is_grad_enabled():
            raise RuntimeError(
                "scan_inner_loop: a backward pass with create_graph=True (to differentiate a gradient again) "
                "cannot go through torch's scan, whose double backward is wrong in torch 2.13. Use fo.inner_loop "
                "for higher-order derivatives (its second-order meta-gradient needs no double backward)"
            )
        # (standard strides: under one compiled graph, torch's scan backward refuses a gradient
        # whose strides differ from its body's, even in a dimension of size 1)
        return tuple(g.clone(memory_format=torch.contiguous_format) for g in grads)


def _distinct(xs: list[Tensor]) -> list[Tensor]:
    """`xs` with a copy of each tensor seen before: a compiled scan refuses an initial
    carry whose tensors alias each other (one step count shared by all the params)."""
    # (`is`, not `id`: TorchDynamo guards an `id` on the object, recompiling at every call)
    out: list[Tensor] = []
    for i, x in enumerate(xs):
        out.append(x.clone() if any(x is y for y in xs[:i]) else x)
    return out


def _carried(x: Tensor) -> Tensor:
    return x if x.is_floating_point() or x.is_complex() else x.to(torch.float64)


def _stacked(xs: Any) -> tuple[Any, int]:
    if isinstance(xs, Tensor) or not isinstance(xs, (tuple, list)):
        raise TypeError(
            "scan_inner_loop: xs is a tuple of loss_fn's arguments after params, each stacked along a "
            f"leading dimension of length K (such as (x, y) with x of shape (K, batch, ...)), got {type(xs).__name__}"
        )
    tree: Any = tuple(xs)
    leaves: list[Any] = optree.tree_leaves(tree)
    if not leaves or not all(isinstance(x, Tensor) and x.dim() >= 1 for x in leaves):
        raise TypeError(
            "scan_inner_loop: every leaf of xs must be a tensor with a leading dimension of length K"
        )
    k = leaves[0].shape[0]
    if k < 1 or any(x.shape[0] != k for x in leaves):
        raise ValueError(
            f"scan_inner_loop: the leaves of xs must share a leading dimension K >= 1, got {[x.shape[0] for x in leaves]}"
        )
    return tuple(xs), k


def scan_inner_loop(
    loss_fn: Callable[..., Tensor],
    params: Params,
    transform: GradientTransformation,
    xs: Sequence[Any],
    state: State | None = None,
    *,
    first_order: bool = False,
) -> tuple[Params, State, Tensor]:
    """`inner_loop` as one ``scan``: step k takes ``loss_fn(params, *[x[k] for x in xs])``.

    The same numbers as ``inner_loop(loss_fn, params, transform, batches)`` with
    ``batches[k] = tuple(x[k] for x in xs)``, differentiable by ``.backward()`` and
    ``torch.autograd.grad`` (second-order meta-gradients included). Under
    ``torch.compile`` the step is traced once, whatever K, but torch 2.13's inductor
    needs ``torch._dynamo.config.capture_scalar_outputs = True`` for it (see the
    module's notes); eagerly, torch's scan traces the step at every call, which takes
    seconds.

    Args:
        loss_fn: ``loss_fn(params, *batch) -> scalar``.
        params: the pytree of tensors to adapt.
        transform: the inner optimizer. Its state must keep its structure from step
            to step (SGD with momentum and a nonzero dampening, whose buffer is made at
            its first step, cannot be scanned), and a differentiable tensor
            hyperparameter must be in the state (``fo.inject_hyperparams``).
        xs: a tuple of loss_fn's arguments after params, each stacked along a leading
            dimension of length K.
        state: the state to start from (default: ``transform.init(params)``).
        first_order: detach the inner gradients (first-order MAML).

    Returns:
        ``(params, state, losses)``, `losses` a tensor of K losses (before each step).

    Raises:
        RuntimeError: under ``torch.func`` transforms (``grad``, ``vmap``), which torch's
            scan does not support (use `inner_loop`), for a differentiable tensor the
            steps read from a closure, and on differentiating a gradient (a double
            backward, which torch's scan gets wrong).
    """
    check_transformation(transform, "scan_inner_loop")
    # (TorchDynamo keeps a transform stack of its own while it traces: no torch.func transform)
    if not torch.compiler.is_compiling() and torch._C._functorch.peek_interpreter_stack() is not None:
        raise RuntimeError(
            "scan_inner_loop does not run under torch.func transforms (grad, vjp, vmap, jacrev): torch's scan "
            "does not support them. Use fo.inner_loop there, or differentiate with torch.autograd.grad"
        )
    stacked, k = _stacked(xs)
    if state is None:
        state = transform.init(params)
    leaves, spec = pytree.tree_flatten((params, state))
    if not all(isinstance(x, Tensor) for x in leaves):
        raise TypeError("scan_inner_loop: params and state must hold tensors only (scan carries tensors)")
    step = _step(loss_fn, transform, spec, first_order)
    final, losses = _scan(step, leaves, stacked)
    params, state = pytree.tree_unflatten(final, spec)
    return params, state, losses


def _step(
    loss_fn: Callable[..., Tensor], transform: GradientTransformation, spec: Any, first_order: bool
) -> Callable[[list[Tensor], tuple[Any, ...]], tuple[list[Tensor], Tensor]]:
    """One inner step on the flat leaves of ``(params, state)`` (of structure `spec`):
    the new leaves and the loss before the step."""
    grad_and_loss = torch.func.grad_and_value(loss_fn)

    def step(leaves: list[Tensor], x: tuple[Any, ...]) -> tuple[list[Tensor], Tensor]:
        params, state = pytree.tree_unflatten(leaves, spec)
        grads, loss = grad_and_loss(params, *x)
        if first_order:
            grads = optree.tree_map(torch.Tensor.detach, grads)
        updates, state = transform.update(grads, state, params)
        new = pytree.tree_leaves((apply_updates(params, updates), state))
        if len(new) != len(leaves):
            raise ValueError(
                "scan_inner_loop: the transform's state changed its structure during a step; scan needs the "
                "same structure at every step (use fo.inner_loop for this transform)"
            )
        return new, loss

    return step


def _scan(
    step: Callable[[list[Tensor], tuple[Any, ...]], tuple[list[Tensor], Tensor]],
    leaves: list[Tensor],
    stacked: Any,
) -> tuple[list[Tensor], Tensor]:
    """`step` scanned over the batches `stacked` from `leaves`: the final leaves and the
    K losses, guarded against a double backward (`_FirstOrderOnly`)."""
    constant = (_traced_probe if torch.compiler.is_compiling() else _probe)(step, leaves, stacked)
    guarded = list(_FirstOrderOnly.apply(*_distinct(leaves), *_distinct(optree.tree_leaves(stacked))))
    leaves, stacked = (
        guarded[: len(leaves)],
        optree.tree_unflatten(optree.tree_structure(stacked), guarded[len(leaves) :]),
    )
    varying = [i for i in range(len(leaves)) if i not in constant]
    constants, dtypes = {i: leaves[i] for i in constant}, [x.dtype for x in leaves]

    def body(carry: list[Tensor], x: tuple[Any, ...]) -> tuple[list[Tensor], Tensor]:
        """A step on the leaves that change; the others (such as hyperparameters in
        the state) are constants, read from here rather than carried."""
        carried = iter(carry)  # (the body reads no varying leaf of `leaves`: scan would take it as an input)
        full = [constants[i] if i in constants else next(carried).to(dtypes[i]) for i in range(len(dtypes))]
        new, loss = step(full, x)
        # clones: scan refuses a carry aliasing its input; an integer carry (a step count)
        # goes as float64 (exact below 2**53), which scan's backward needs
        return [_carried(new[i]).clone() for i in varying], loss

    from torch._higher_order_ops.scan import scan

    out, losses = scan(body, [_carried(leaves[i]) for i in varying], stacked)
    final = list(leaves)
    for i, c in zip(varying, out):
        final[i] = c.to(leaves[i].dtype)
    *final, losses = _FirstOrderOnly.apply(*final, losses)
    return final, losses


def _traced_probe(step: Callable[..., Any], leaves: list[Tensor], xs: Any) -> set[int]:
    """`_probe` while TorchDynamo traces: the step is traced, not run, and its outputs,
    read only for their identity, are dead code that the compiler drops, so no eager
    step runs at each call (it cost more than the compiled loop at K=5). Nothing
    requires a foreign-leaf check here: TorchDynamo passes a tensor the steps read from
    a closure to the scan as an input, which gets its gradient, and a compiled backward
    refuses ``create_graph=True``."""
    out, _ = step(leaves, optree.tree_map(lambda x: x[0], xs))
    return {i for i, (a, b) in enumerate(zip(leaves, out)) if a is b}


def _probe(step: Callable[..., Any], leaves: list[Tensor], xs: Any) -> set[int]:
    """One eager step (the random state restored after): the indices of the leaves it
    passes on unchanged. With a graph, it refuses a tensor that requires grad outside
    the carry and xs (its gradient would bypass the double-backward guard)."""
    inputs = [x.detach().requires_grad_(x.requires_grad) for x in leaves]
    x_leaves = [x.detach()[0].requires_grad_(x.requires_grad) for x in optree.tree_leaves(xs)]
    first = optree.tree_unflatten(optree.tree_structure(xs), x_leaves)
    with torch.random.fork_rng(devices=[]):
        out, loss = step(inputs, first)
    if torch.is_grad_enabled():
        own = [x for x in [*inputs, *x_leaves] if x.requires_grad]
        _refuse_foreign_leaves([y for y in [*out, loss] if y.requires_grad], own, who="scan_inner_loop")
    return {i for i, (a, b) in enumerate(zip(inputs, out)) if a is b}
