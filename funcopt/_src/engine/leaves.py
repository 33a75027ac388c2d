"""What the engine does per leaf: counters and buffers as torch.optim and `init` make them, the
checks of a param, and the rows of per-key columns."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from ..core.base import (
    MaskedNode,
    a_kind,
    dtype_name,
    real_dtype,
)


def scalar_dtype(fused: bool = False) -> torch.dtype:
    """The dtype torch.optim gives step counters: float32, or float64 when that is the
    default dtype (fused optimizers always use float32)."""
    if fused:
        return torch.float32
    return torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32


def torch_counter(value: Any, p: Tensor, *, on_device: bool, fused: bool) -> Tensor:
    """A param's counter (step, mu_product) as torch.optim holds it: a 0-d tensor of
    `scalar_dtype`, on the CPU (on the param's device if capturable or fused), also where
    another device is the default. A tensor `value` (ASGD's eta starts at the lr) keeps
    the autograd graph that records it (a differentiable step's tensor lr)."""
    device = p.device if on_device else "cpu"
    if isinstance(value, Tensor):
        return value.to(dtype=scalar_dtype(fused), device=device, copy=True)
    return torch.tensor(float(value), dtype=scalar_dtype(fused), device=device)


def same_batched(a: Any, b: Any) -> bool:
    """Whether counters `a` and `b` are ``vmap``'s views of one counter: batched tensors
    at the same level and batch dim, down to plain tensors that no autograd records and
    that view the same memory alike. ``vmap(init)`` gives each leaf such a view of the
    counter that its leaves share, which are then stepped (and their new counter
    shared) with one schedule, where identity would see one per leaf. Not where
    torch.compile traces (it holds no memory to compare; identity serves there)."""
    fx = torch._C._functorch
    if torch.compiler.is_compiling() or not fx.is_batchedtensor(a):
        return False
    while fx.is_batchedtensor(a):
        if not (
            fx.is_batchedtensor(b)
            and fx.maybe_get_level(a) == fx.maybe_get_level(b)
            and fx.maybe_get_bdim(a) == fx.maybe_get_bdim(b)
        ):
            return False
        a, b = fx.get_unwrapped(a), fx.get_unwrapped(b)
    if a is b:
        return True
    return (
        type(a) is Tensor
        and type(b) is Tensor
        and not (a.requires_grad or b.requires_grad or a.is_meta or fx.is_functorch_wrapped_tensor(b))
        and (a.dtype, a.device, a.shape, a.stride(), a.storage_offset())
        == (b.dtype, b.device, b.shape, b.stride(), b.storage_offset())
        and a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
    )


def rows(columns: Sequence[Sequence[Any]], n: int) -> list[tuple[Any, ...]]:
    """Per leaf, its entry of each column (``()`` for each of `n` leaves if no column)."""
    return list(zip(*columns)) if columns else [()] * n


def group_by(columns: Sequence[Sequence[Any]]) -> dict[tuple[Any, ...], list[int]]:
    """The leaves grouped by their key, the tuple of their entries in `columns` (one list
    per part of the key, a list's entry per leaf), in the order first seen. As usual
    every leaf has the same key, which is found column by column: a per-leaf tuple costs
    about as much as a small op, with hundreds of tiny params."""
    n = len(columns[0]) if columns else 0
    if not n:
        return {}
    if all(column.count(column[0]) == n for column in columns):
        return {tuple(column[0] for column in columns): list(range(n))}
    groups: dict[tuple[Any, ...], list[int]] = {}
    for i, key in enumerate(zip(*columns)):
        groups.setdefault(key, []).append(i)
    return groups


def _keep(updates: list[Any], buffer_columns: Sequence[list[Any]], i: int, out: Tensor,
          results: Sequence[Tensor | None]) -> None:  # fmt: skip
    """Leaf i's update and new buffers, into `updates` and the buffers' new columns."""
    updates[i] = out
    for column, value in zip(buffer_columns, results):
        column[i] = MaskedNode() if value is None else value


@dataclass(frozen=True)
class AtFirstStep:
    """What `Algorithm.initial` gives for a buffer that torch.optim makes at the first step
    (SGD's ``momentum_buffer``, a copy of the first gradient): the torch classes hold no
    such key before it (the math gets None there, and returns the new buffer), and a
    functional state holds `value` from ``init`` (a number, or a function of the param, as
    ``initial`` gives other buffers), so that its structure never changes. The first step
    from `value` must then give what torch's first step makes."""

    value: Any


AtFirstStep.__module__ = "funcopt"  # its public home


def torch_start(value: Any) -> Any:
    """An `initial` value as the torch classes start: None for a buffer made `AtFirstStep`."""
    return None if isinstance(value, AtFirstStep) else value


def functional_start(value: Any) -> Any:
    """An `initial` value as a functional state starts: the value of an `AtFirstStep`."""
    return value.value if isinstance(value, AtFirstStep) else value


def initial_buffer(p: Tensor, value: Any) -> Tensor | None:
    """A param's buffer as `Algorithm.initial` gives it: a number (or 0-d tensor) fills a
    buffer like `p`, a function of `p` makes one, None leaves it absent."""
    if value is None:
        return None
    if callable(value):
        return value(p)
    return full_like(p, value)


def full_like(p: Tensor, value: Any) -> Tensor:
    """A buffer like `p` filled with `value`; complex params get ``value + value*1j``,
    as torch.optim's Adagrad does."""
    if isinstance(value, Tensor):
        value = value.to(real_dtype(p))
        if p.is_complex():
            value = torch.complex(value, value)
        return torch.zeros_like(p, memory_format=torch.preserve_format) + value
    if p.is_complex():
        value = complex(value, value)
    return torch.full_like(p, value, memory_format=torch.preserve_format)


def check_param(name: str, i: int, p: Any) -> None:
    """Raise a TypeError that says what to pass where leaf `i` of the params given to
    `name`'s init is no tensor a gradient step can update."""
    if not isinstance(p, Tensor):
        must = "params must be a pytree of tensors"
        if isinstance(p, (torch.nn.Module, Iterator)):  # a model, or model.parameters()
            must += (
                ": for a module's, a dict or list of them, such as "
                "{name: p.detach() for name, p in model.named_parameters()}"
            )
        elif hasattr(p, "__dict__"):  # an object of a class of the user's (a dataclass, ...)
            must += (
                ", and its containers are those optree flattens without a namespace (dict, "
                "list, tuple, NamedTuple, OrderedDict, ...): pass this object's tensors in a dict"
            )
        raise TypeError(f"{name} init: leaf {i} of params is {a_kind(p)}; {must}")
    if not (p.is_floating_point() or p.is_complex()):
        raise TypeError(
            f"{name} init: leaf {i} of params is a tensor of dtype {dtype_name(p)}, which no "
            "gradient step can update; leave it out of the params (such as BatchNorm's "
            "num_batches_tracked), or put None in its place"
        )


def _named(
    fields: Sequence[str], g: Tensor | None, p: Tensor | None, buffers: Sequence[Any]
) -> list[tuple[str, Any]]:
    """A leaf's gradient, param and buffers, with the names the errors give them."""
    return [("gradient", g), ("param", p), *zip(fields, buffers)]


def mismatch_error(
    name: str, fields: Sequence[str], i: int, p: Tensor | None, g: Tensor, buffers: Sequence[Tensor | None]
) -> ValueError:
    """The error for leaf i of algorithm `name`, whose param or buffers (named by `fields`)
    are shaped or typed unlike its gradient. Shapes that differ would broadcast: the
    update, the new state and then the param would silently take another shape. Dtypes
    that differ would fail inside the math with an error that names no tensor, or
    promote the update."""
    what = "shapes" if any(t is not None and t.shape != g.shape for t in (p, *buffers)) else "dtypes"
    show = (lambda t: tuple(t.shape)) if what == "shapes" else dtype_name
    named = _named(fields, g, p, buffers)
    return ValueError(
        f"{name} update: the {what} of leaf {i} differ "
        f"({', '.join(f'{n} {show(t)}' for n, t in named if t is not None)}). "
        "Pass the gradients of these params, and a state that init made from them."
    )


def device_error(
    name: str,
    fields: Sequence[str],
    p_leaves: Sequence[Tensor | None],
    g_leaves: Sequence[Tensor | None],
    buffer_columns: Sequence[Sequence[Any]],
) -> ValueError | None:
    """The error for the first leaf whose gradient, param and buffers (named by `fields`)
    are on different devices (torch's own names no tensor), or None if there is none.
    The counters are not compared: they may live elsewhere (they are read on the host)."""
    for i, (p, g) in enumerate(zip(p_leaves, g_leaves)):
        named = _named(fields, g, p, [column[i] for column in buffer_columns])
        devices = {str(t.device) for _, t in named if isinstance(t, Tensor)}
        if g is not None and len(devices) > 1:
            return ValueError(
                f"{name} update: the tensors of leaf {i} are on different devices ("
                + ", ".join(f"{n} {t.device}" for n, t in named if isinstance(t, Tensor))
                + "). Put the gradients, params and state on one device: init a state from "
                "params already moved, or move a state with optree.tree_map(lambda t: t.to(device), state)."
            )
    return None
