"""Meta-learning over processes with torch.distributed (no layer of our own): average
meta-gradients over ranks, and use FSDP2-sharded params in a functional inner loop.

Each rank computes the meta-gradient of its share of the tasks; `all_reduce_mean`
averages them, which equals one process's meta-gradient over all tasks (equal shares)
up to round-off. With FSDP2 (``fully_shard``), a module's params are DTensor shards,
which ``torch.func.functional_call`` cannot use; `unshard` gathers them into plain
tensors whose gradients flow back to the shards, averaged over the ranks.
"""

from __future__ import annotations

from typing import Any

import optree
import torch
import torch.distributed as dist
from torch import Tensor


def _is_dtensor(x: Any) -> bool:
    return type(x).__name__ == "DTensor" and hasattr(x, "full_tensor")


def all_reduce_mean(tree: Any, group: Any = None) -> Any:
    """The mean of `tree` (a pytree of tensors, the same structure on every rank) over
    the ranks of `group` (default: all), as new tensors: `tree` is not modified.

    One ``all_reduce`` per dtype and device, on the leaves raveled into one buffer.
    Call it on every rank of the group, as any collective. Not differentiable (it is
    for gradients already computed)."""
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(
            "all_reduce_mean: torch.distributed is not initialized; call torch.distributed.init_process_group first"
        )
    leaves, spec = optree.tree_flatten(tree)
    for x in leaves:
        if not isinstance(x, Tensor) or _is_dtensor(x):
            kind = (
                "a DTensor (use its full_tensor(), or let FSDP reduce its gradients)"
                if _is_dtensor(x)
                else type(x).__name__
            )
            raise TypeError(f"all_reduce_mean: the leaves must be plain tensors, got {kind}")
    world = dist.get_world_size(group)
    out: list[Tensor | None] = [None] * len(leaves)
    buckets: dict[tuple[torch.dtype, torch.device], list[int]] = {}
    for i, x in enumerate(leaves):
        buckets.setdefault((x.dtype, x.device), []).append(i)
    for indices in buckets.values():
        flat = torch.cat([leaves[i].detach().reshape(-1) for i in indices])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group)
        flat = flat / world if flat.is_floating_point() or flat.is_complex() else flat // world
        for i, part in zip(indices, torch.split(flat, [leaves[i].numel() for i in indices])):
            out[i] = part.reshape(leaves[i].shape)
    return optree.tree_unflatten(spec, out)


def unshard(tree: Any, *, average: bool = True) -> Any:
    """`tree` with each DTensor leaf (an FSDP2 shard) gathered into a plain tensor,
    other leaves as they are, for ``functional_call`` and `funcopt.inner_loop`.

    The gathered tensors stay in the graph: a backward pass sends their gradients to the
    shards, reduced over the ranks (the ``Partial`` placement): averaged with
    ``average=True``, as FSDP2 averages a data-parallel gradient, so that each rank's
    meta-loss over its own tasks gives the meta-gradient of all tasks. (Without
    ``grad_placements``, ``full_tensor`` takes each rank's gradient as the whole one,
    which is silently wrong.)"""
    from torch.distributed.tensor import Partial

    def gather(x: Any) -> Any:
        if not _is_dtensor(x):
            return x
        return x.full_tensor(grad_placements=[Partial("avg" if average else "sum")] * x.device_mesh.ndim)

    return optree.tree_map(gather, tree)
