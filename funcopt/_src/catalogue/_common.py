"""Helpers shared by the catalogue's blocks: leafwise maps that skip None updates,
tree reductions, counters, a branch-free pick, and a pure counter-based random source.

Every helper is pure (new tensors, nothing mutated) and branch-free, so that the blocks
built on them work under ``torch.func.grad``/``vmap`` and ``torch.compile``."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import optree
import torch
from torch import Tensor

from ..core.base import MaskedNode, Params, a_kind, flatten_together
from ..engine.ops import safe_sqrt
from ..transforms.blocks import _bias_correction, _check_state, _count, _increment
from ..transforms.clipping import coef
from ..transforms.wrappers import _highest_dtype, _lowest_dtype

__all__ = [
    "_bias_correction",
    "_check_state",
    "_count",
    "_increment",
    "_highest_dtype",
    "_lowest_dtype",
    "coef",
]


def leafwise(
    who: str,
    fn: Callable[..., tuple[Any, ...]],
    updates: Any,
    *trees: Any,
    n_out: int = 1,
) -> tuple[Any, ...]:
    """Map ``fn(u, *leaves) -> (new_u, *new_buffers)`` over the present leaves of
    `updates` and the matching leaves of `trees` (state fields or params mirroring the
    updates). Returns `n_out` trees: the new updates, then the new buffers. Where an
    update is None, the update stays None and each buffer keeps its value (the buffers
    are the first ``n_out - 1`` of `trees`)."""
    names = (f"{who}: updates", *(f"tree {i}" for i in range(1, len(trees) + 1)))
    columns, unflatten = flatten_together(
        updates,
        *trees,
        names=names,
        hint="Pass updates with the structure of the params given to init, and the state it returned.",
    )
    gs, others = columns[0], columns[1:]
    outs: list[list[Any]] = [list(gs)] + [list(others[k]) for k in range(n_out - 1)]
    for i, g in enumerate(gs):
        if g is None:
            continue
        row = [o[i] for o in others]
        for j, x in enumerate(row):
            if not isinstance(x, Tensor):
                raise ValueError(
                    f"{who}: leaf {i} has an update but {names[j + 1]} holds {a_kind(x)} for it; init with "
                    "a tensor in that place and pass the params to update"
                )
        result = fn(g, *row)
        for k in range(n_out):
            outs[k][i] = result[k]
    return tuple(unflatten(o) for o in outs)


def present(tree: Any) -> list[Tensor]:
    """The tensor leaves of `tree` (None and MaskedNode left out)."""
    return [x for x in optree.tree_leaves(tree, none_is_leaf=True) if isinstance(x, Tensor)]


def tree_sum(values: Sequence[Tensor], like: Tensor | None = None) -> Tensor:
    """The sum of 0-d tensors (zero if none), on the first one's device."""
    if not values:
        return torch.zeros((), dtype=like.dtype if like is not None else None)
    return functools.reduce(torch.add, values)


def sq_norm(tree: Any) -> Tensor:
    """The squared L2 norm of all tensors of `tree` (optax's ``tree.norm(squared=True)``)."""
    return tree_sum(
        [
            (x.real * x.real + x.imag * x.imag).sum() if x.is_complex() else (x * x).sum()
            for x in present(tree)
        ]
    )


def norm(tree: Any) -> Tensor:
    """The L2 norm of all tensors of `tree` (optax's ``tree.norm``), with a derivative of 0
    where it is 0 (`safe_sqrt`: a meta-gradient through DoG's first distance is finite)."""
    return safe_sqrt(sq_norm(tree))


def vdot(a: Any, b: Any) -> Tensor:
    """The sum over leaves of ``sum(a * b)`` (optax's ``tree.vdot`` for real trees)."""
    (xs, ys), _ = flatten_together(a, b, names=("vdot: a", "b"))
    return tree_sum([(x * y).sum() for x, y in zip(xs, ys) if x is not None and y is not None])


def l1(tree: Any) -> Tensor:
    """The sum of absolute values over all tensors of `tree`."""
    return tree_sum([x.abs().sum() for x in present(tree)])


def zeros(params: Params, dtype: torch.dtype | None = None) -> Params:
    """Zeros like each param (None and MaskedNode stay)."""
    return optree.tree_map(lambda p: torch.zeros_like(p, dtype=dtype), params)


def full(params: Params, value: Any) -> Params:
    """`value` in the shape and dtype of each param."""
    if isinstance(value, Tensor):
        return optree.tree_map(lambda p: torch.zeros_like(p) + coef(value, p), params)
    return optree.tree_map(lambda p: torch.full_like(p, value), params)


def copy(params: Params) -> Params:
    """A copy of `params`: new tensors (autograd history kept), so that a state never
    aliases the params that the caller may later change in place."""
    return optree.tree_map(lambda p: p.clone(), params)


def cast(tree: Any, dtype: torch.dtype | None) -> Any:
    """`tree` with its tensors cast to `dtype` (as it is for None)."""
    if dtype is None:
        return tree
    return optree.tree_map(lambda x: None if x is None else x.to(dtype), tree, none_is_leaf=True)


def pick(cond: Tensor, new: Any, old: Any) -> Any:
    """`new` where the 0-d bool `cond` holds, else `old`, leaf by leaf over two trees of
    one structure (branch-free, as ``lax.cond`` over states)."""
    return optree.tree_map(
        lambda n, o: (
            None if n is None else torch.where(cond, n, o.to(n.dtype) if isinstance(o, Tensor) else o)
        ),
        new,
        old,
        none_is_leaf=True,
    )


def scalar(value: Any, dtype: torch.dtype, device: torch.device | None = None) -> Tensor:
    """`value` (a number or a tensor) as a 0-d tensor of `dtype`."""
    if isinstance(value, Tensor):
        return value.to(dtype=dtype, device=device if device is not None else value.device)
    return torch.tensor(value, dtype=dtype, device=device)


def device_of(tree: Any) -> torch.device:
    leaves = present(tree)
    return leaves[0].device if leaves else torch.device("cpu")


def check_params(who: str, params: Any) -> None:
    if params is None:
        raise ValueError(f"{who} needs the params: call update(grads, state, params)")


def require_value(who: str, value: Any) -> Any:
    """The loss `value` extra argument, else a clear error."""
    if value is None:
        raise ValueError(
            f"{who} needs the loss: call update(grads, state, params, value=loss) (fo.Optimizer's "
            "step(closure) passes it)"
        )
    return value


# ------------------------------------------------------------------------ random numbers
# A pure, counter-based source (splitmix64 over int64 tensors): the state holds a 0-d
# int64 key, each use derives new keys from it. It runs under vmap and torch.compile,
# where torch.Generator cannot be carried in a state.

_GOLDEN = 0x9E3779B97F4A7C15 - (1 << 64)
_M1 = 0xBF58476D1CE4E5B9 - (1 << 64)
_M2 = 0x94D049BB133111EB - (1 << 64)


def _shr(x: Tensor, s: int) -> Tensor:
    """A logical right shift of int64 `x` by `s` bits."""
    return (x >> s) & ((1 << (64 - s)) - 1)


def mix(x: Tensor) -> Tensor:
    """splitmix64's finalizer: int64 to well-mixed int64 bits."""
    z = x + _GOLDEN
    z = (z ^ _shr(z, 30)) * _M1
    z = (z ^ _shr(z, 27)) * _M2
    return z ^ _shr(z, 31)


def make_key(seed: int | Tensor, device: torch.device | None = None) -> Tensor:
    """A 0-d int64 key from a seed."""
    if isinstance(seed, Tensor):
        return seed.to(torch.int64)
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise TypeError(f"a random key must be an int seed or an int64 tensor, got {a_kind(seed)}")
    return torch.tensor(seed, dtype=torch.int64, device=device)


def split(key: Tensor) -> tuple[Tensor, Tensor]:
    """Two new keys from `key` (the next state key, and a key to sample with)."""
    return mix(key * 2 + 1), mix(key * 2 + 2)


def _wrap(v: int) -> int:
    """A Python int as the int64 that holds its low 64 bits."""
    return ((v + (1 << 63)) % (1 << 64)) - (1 << 63)


def _bits(key: Tensor, stream: int, n: int, device: torch.device) -> Tensor:
    """`n` random int64s of stream `stream` of `key`."""
    idx = torch.arange(n, dtype=torch.int64, device=device)
    return mix(mix(key + _wrap(stream * 0x632BE59BD9B4E019)) + idx)


def _uniform53(key: Tensor, stream: int, n: int, device: torch.device) -> Tensor:
    """`n` float64 numbers in (0, 1] from `key`."""
    bits = _bits(key, stream, n, device)
    return (_shr(bits, 11) + 1).to(torch.float64) / float(1 << 53)


def normal_like(key: Tensor, leaves: Sequence[Tensor]) -> list[Tensor]:
    """Standard normal noise like each of `leaves` (Box-Muller), from `key`."""
    out = []
    for i, t in enumerate(leaves):
        n = t.numel()
        u1 = _uniform53(key, 2 * i + 1, n, t.device)
        u2 = _uniform53(key, 2 * i + 2, n, t.device)
        z = torch.sqrt(-2.0 * torch.log(u1)) * torch.cos(2.0 * torch.pi * u2)
        out.append(z.reshape(t.shape).to(t.real.dtype if t.is_complex() else t.dtype))
    return out


def rademacher_like(key: Tensor, leaves: Sequence[Tensor]) -> list[Tensor]:
    """Random signs (+1 or -1, equally likely) like each of `leaves`, from `key`."""
    out = []
    for i, t in enumerate(leaves):
        bits = _bits(key, i + 1, t.numel(), t.device)
        sign = 1.0 - 2.0 * (_shr(bits, 63) & 1).to(t.dtype)
        out.append(sign.reshape(t.shape))
    return out


def is_masked(x: Any) -> bool:
    return isinstance(x, MaskedNode)
