"""A differentiable inner loop, the core of MAML-style meta-learning and of
hyperparameter optimization by gradient."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import optree
import torch
from torch import Tensor

from .core.base import GradientTransformation, Params, State, apply_updates, check_transformation
from .long_loops import run_long


def inner_loop(
    loss_fn: Callable[..., Tensor],
    params: Params,
    transform: GradientTransformation,
    batches: Iterable[tuple[Any, ...]],
    state: State | None = None,
    *,
    first_order: bool = False,
    checkpoint_every: int | None = None,
    truncate: int | None = None,
) -> tuple[Params, State, list[Tensor]]:
    """Take one step of `transform` on ``loss_fn(params, *batch)`` for each batch.

    Every step is pure (``torch.func.grad``, then ``update`` and `apply_updates`), so the
    returned params are a differentiable function of the initial params and of any
    tensor hyperparameter of `transform`: differentiate a loss of them with
    ``torch.func.grad`` or ``.backward()`` to get a second-order meta-gradient, or
    ``vmap`` the whole loop over tasks or hyperparameters.

    With ``first_order=True`` the inner gradients are detached (first-order MAML, as
    higher's ``track_higher_grads=False`` or learn2learn's ``first_order=True``), and no
    second-order graph is built. Without weight decay (which reads the params) each
    step's update is then a constant, so the meta-gradient is the gradient of the outer
    loss at the adapted params. Tensor hyperparameters stay differentiable, through the
    updates they scale.

    Args:
        loss_fn: ``loss_fn(params, *batch) -> scalar``. For a module, build it with
            ``torch.func.functional_call(model, params, (x,))``. A module with BatchNorm
            layers needs ``torch.func.replace_all_batch_norm_modules_(model)`` first:
            torch.func refuses their in-place updates of running statistics.
        params: the pytree of tensors to adapt (for a module: a dict of its parameters).
        transform: the inner optimizer, e.g. ``fo.nadam(lr=lr)``.
        batches: one tuple of extra ``loss_fn`` arguments per step, e.g.
            ``[(x, y)] * steps`` to take `steps` steps on the same batch.
        state: the transform's state to start from (default: ``transform.init(params)``).
        first_order: detach the inner gradients (first-order MAML).
        checkpoint_every: keep only every n-th step's params and state for the backward
            pass, and recompute the steps between them there: the same meta-gradient,
            with memory for about ``K / n + n`` steps instead of K. For ``.backward()``
            and ``torch.autograd.grad`` (not ``torch.func`` transforms, which raise an
            error); every tensor that requires grad must reach the steps through
            params, state or the batches (a tensor hyperparameter: by
            ``fo.inject_hyperparams``), else the backward pass raises an error.
        truncate: differentiate through the last `truncate` steps only (truncated
            backpropagation): the steps before run without a graph, and the loop
            continues from their detached params and state (their losses detached). A
            state tensor those steps pass on unchanged, such as a hyperparameter that
            ``fo.inject_hyperparams`` keeps in the state, keeps its graph.

    Returns:
        ``(params, state, losses)``: the adapted params, the final state, and the loss
        before each step.

    Example:
        >>> import torch, funcopt as fo
        >>> model = torch.nn.Linear(2, 1)
        >>> params = {k: v.detach() for k, v in model.named_parameters()}
        >>> def loss_fn(params, x, y):
        ...     out = torch.func.functional_call(model, params, (x,))
        ...     return torch.nn.functional.mse_loss(out, y)
        >>> x, y = torch.ones(4, 2), torch.full((4, 1), 2.0)  # far from any initial output
        >>> adapted, state, losses = fo.inner_loop(loss_fn, params, fo.adamax(lr=0.1), [(x, y)] * 5)
        >>> bool(losses[-1] < losses[0]), int(state.step["weight"])
        (True, 5)
    """
    check_transformation(transform, "inner_loop")
    if state is None:
        state = transform.init(params)
    grad_and_loss = torch.func.grad_and_value(loss_fn)

    def step(params: Params, state: State, batch: tuple[Any, ...]) -> tuple[Params, State, Tensor]:
        if isinstance(batch, Tensor):  # unpacked, its rows would pass as arguments
            raise TypeError(
                "inner_loop: each batch is a tuple of loss_fn's arguments after params, but got a "
                "Tensor: pass a list of tuples, such as [(x, y)] * steps, not (x, y)"
            )
        grads, loss = grad_and_loss(params, *batch)
        if first_order:
            grads = optree.tree_map(torch.Tensor.detach, grads)
        updates, state = transform.update(grads, state, params)
        return apply_updates(params, updates), state, loss

    if checkpoint_every is not None or truncate is not None:
        return run_long(step, params, state, list(batches), checkpoint_every, truncate)
    losses = []
    for batch in batches:
        params, state, loss = step(params, state, batch)
        losses.append(loss)
    return params, state, losses
