"""Stateless building blocks for `chain`."""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from .base import GradientTransformation, Params, State, Updates, empty_init, flatten_together, real_dtype


def clip_by_global_norm(max_norm: float | Tensor) -> GradientTransformation:
    """Scale the updates so that their global L2 norm is at most `max_norm`.

    Same rule as ``torch.nn.utils.clip_grad_norm_``: updates are multiplied by
    ``min(1, max_norm / (total_norm + 1e-6))``. ``None`` leaves are ignored.
    The coefficient stays a tensor, so this works under ``vmap``, ``grad`` and
    ``torch.compile``.

    Example:
        >>> import torch, funcopt as fo
        >>> clipped, _ = fo.clip_by_global_norm(1.0).update([torch.tensor([3.0, 4.0])], fo.EmptyState())
        >>> clipped[0]
        tensor([0.6000, 0.8000])
    """
    if not isinstance(max_norm, Tensor) and not max_norm >= 0:
        raise ValueError(f"max_norm must be non-negative, got {max_norm}")

    # module-level functions, not closures, so that the transformation pickles
    return GradientTransformation(empty_init, functools.partial(_clip_update, max_norm))


def _clip_update(
    max_norm: float | Tensor, updates: Updates, state: State, params: Params | None = None
) -> tuple[Updates, State]:
    (leaves,), unflatten = flatten_together(updates)
    present = [u for u in leaves if u is not None]
    if not present:
        return updates, state
    device = present[0].device
    norms = [torch.linalg.vector_norm(u).to(device) for u in present]
    total = torch.linalg.vector_norm(torch.stack(norms))
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    clipped = [None if u is None else u * coef.to(real_dtype(u)) for u in leaves]
    return unflatten(clipped), state
