"""The in-place driver: torch.optim's step of an `Algorithm` on a param group's lists, in place
(the usual step, and `fused=True` with compiled kernels as its `dense`), or as the pure update
written back (capturable, differentiable and compiled steps)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import optree
import torch
from torch import Tensor
from torch.optim.optimizer import _device_dtype_check_for_fused

from ..core.base import (
    DEVICE,
    DTYPE,
    IS_SPARSE,
    MaskedNode,
    as_complex,
    as_real,
)
from ..engine import inplace
from ..engine.algorithm import Algorithm
from ..engine.bounds import Hyperparams
from ..engine.leaves import group_by
from .state import _assign, _clone, _converted, _fields, _missing_entry

try:
    from torch.distributed.tensor import DTensor
except ImportError:  # a torch build without torch.distributed

    class DTensor:  # type: ignore[no-redef]
        """Stands in for torch.distributed.tensor.DTensor: nothing is an instance."""


def _to_python(value: Any) -> Any:
    """Tensor hyperparameters as Python numbers, for the in-place fast path."""
    if isinstance(value, Tensor):
        return value.item()
    if isinstance(value, (tuple, list)):
        return type(value)(_to_python(v) for v in value)
    return value


def _listings(params: list[Tensor], grads: list[Tensor]) -> list[tuple[list[Tensor], list[Tensor]]]:
    """A group that lists a param more than once (torch warns that this is deprecated)
    steps as torch's default step does: that param once per listing, one after another.
    Its k-th listing steps in the k-th of these lists of (params, grads), which step in
    turn. An algorithm steps each param by itself, so the order of the others does not
    matter (a transformation that reads all params, such as a global-norm clip, sees
    each list apart)."""
    listings: list[tuple[list[Tensor], list[Tensor]]] = []
    seen: dict[int, int] = {}
    for p, g in zip(params, grads):
        k = seen[id(p)] = seen.get(id(p), -1) + 1
        if k == len(listings):
            listings.append(([], []))
        listings[k][0].append(p)
        listings[k][1].append(g)
    return listings


def _step_in_place(
    algorithm: Algorithm,
    hyperparams: Hyperparams,
    params: list[Tensor],
    grads: list[Tensor],
    states: list[dict[str, Any]],
    tried: bool = False,
    dense: Callable[..., None] = inplace.step_dense,
) -> None:
    """torch.optim's step, in place. The counters are read as Python floats and the
    schedule runs in double precision, once per group of params with the same counter
    values; the elementwise math runs on segments on the CPU, and with foreach ops over
    each group of params elsewhere (see ``inplace.py``). The schedule gets the
    hyperparameters as given: torch's default step computes its coefficients from a
    tensor ``lr`` (or betas) in tensor arithmetic, which rounds in the tensor's dtype,
    and so does the schedule; the coefficients, then the hyperparameters, reach the ops
    as Python numbers.

    The state is read column by column (one list per key), and the params are grouped
    by what their math shares before any runs: each per-param read costs about as much
    as a small op, which counts with hundreds of tiny params. The dense params of a
    group step by `dense` (``inplace.step_dense``, or fused.py's compiled kernels)."""
    k = len(algorithm.counters)
    given, hyperparams = hyperparams, {name: _to_python(v) for name, v in hyperparams.items()}
    try:
        columns: list[list[Any]] = [
            [s[name] for s in states] if required else [s.get(name) for s in states]
            for name, required in _fields(algorithm, hyperparams)
        ]
    except KeyError as e:
        raise _missing_entry(e) from None
    counters, buffer_columns = columns[:k], columns[k:]
    # every check comes before any param changes
    sparse = any(map(IS_SPARSE, grads))
    if sparse:
        algorithm.check_sparse_grad(hyperparams)
    # which buffers are absent, per buffer: all of them (SGD's without momentum), none, or some
    absent = [[b is None for b in column] for column in buffer_columns]
    present = [column for column, nones in zip(buffer_columns, absent) if not all(nones)]
    _check_all_shapes(algorithm, params, grads, buffer_columns, present)
    dtypes = list(map(DTYPE, params))
    if not tried and not all(
        [d if b is None else b.dtype for b, d in zip(column, dtypes)] == dtypes for column in present
    ):
        # the model was converted after its state was made: where the math then fails
        # (torch's Adamax does; its Adagrad steps on), it fails on copies first, changing nothing
        copies = [{name: _clone(value) for name, value in s.items()} for s in states]
        _step_in_place(algorithm, given, [p.clone() for p in params], grads, copies, tried=True, dense=dense)
    # what a group shares: the counters' values and dtypes (torch updates a counter in its
    # dtype), the param's dtype, and which buffers are absent
    shared = [_counter_values(column) for column in counters] + [
        [c.dtype for c in column] for column in counters
    ]
    creating = algorithm.creating(hyperparams)
    sharded = any(issubclass(t, DTensor) for t in set(map(type, params)))
    written: list[tuple[list[list[Tensor]], tuple[Any, ...]]] = []  # counters, their new values
    for key, indices in group_by([*shared, dtypes, *absent]).items():
        new_values, coefficients = _to_python(
            algorithm.schedule(*key[:k], counter_dtypes=key[k : 2 * k], **given)
        )
        written.append(([[column[i] for i in indices] for column in counters], new_values))
        # a param whose math looks across elements, or that has a buffer to create, steps
        # by itself; so does a DTensor whose buffers are not all sharded as it is
        alone = not algorithm.per_element or creating([column[indices[0]] for column in buffer_columns])
        if not (alone or sparse or sharded or key[2 * k].is_complex):  # as usual
            ps, gs, *columns_picked = inplace.pick((params, grads, *buffer_columns), indices)
            dense(algorithm, coefficients, hyperparams, ps, gs, columns_picked)
        else:  # (a group with DTensors, complex or sparse gradients: no fused kernels)
            _step_apart(
                algorithm, coefficients, hyperparams, indices, alone, params, grads, states, buffer_columns
            )
    _write_counters(written)


def _write_counters(written: list[tuple[list[list[Tensor]], tuple[Any, ...]]]) -> None:
    """Each group's new counter values (Python numbers) into its counters' tensors."""
    for tensors, new_values in written:
        for column, value in zip(tensors, new_values):
            # made where the counters live (a group's are alike in dtype): no copy from the host
            source = torch.full((), value, dtype=column[0].dtype, device=column[0].device)
            torch._foreach_copy_(column, [source] * len(column))


def _step_apart(
    algorithm: Algorithm,
    coefficients: tuple[Any, ...],
    hyperparams: Hyperparams,
    indices: list[int],
    alone: bool,
    params: list[Tensor],
    grads: list[Tensor],
    states: list[dict[str, Any]],
    buffer_columns: list[list[Any]],
) -> None:
    """The step of a group (`indices`) that is not all dense and real: a param whose math
    looks across elements or creates a buffer (`alone`), or with a sparse gradient or a
    DTensor steps by itself (a sharded one on its local shards where it can); complex
    ones step as real views, with the rest of the group, by `inplace.step_dense`."""
    plain: tuple[list[Any], list[Any], list[Any]] = ([], [], [])  # params, grads, buffers
    for i in indices:
        p, g, buffers = params[i], grads[i], [column[i] for column in buffer_columns]
        if isinstance(p, DTensor) and not alone:  # its local shards, if sharded alike
            p, g, buffers = _local_shards(p, g, buffers) or (p, g, buffers)
        is_complex = p.is_complex()
        if is_complex:
            p, g, buffers = as_real(p), as_real(g), [as_real(b) for b in buffers]
        if alone or g.is_sparse or isinstance(p, DTensor):  # by itself (sparse or DTensor ops)
            new = inplace.run(algorithm, coefficients, hyperparams, p, p, g, buffers)
            for name, old, value in zip(algorithm.buffer_fields, buffers, new):
                if old is None and value is not None:  # created (SGD's momentum_buffer)
                    states[i][name] = as_complex(value) if is_complex else value
            continue
        for column, value in zip(plain, (p, g, buffers)):
            column.append(value)
    if plain[0]:
        by_buffer = [list(column) for column in zip(*plain[2])]
        inplace.step_dense(algorithm, coefficients, hyperparams, plain[0], plain[1], by_buffer)


def _counter_values(column: list[Tensor]) -> list[Any]:
    """The counters' values as Python numbers. Counters on a GPU (``fused``, ASGD's) are
    read in one transfer: each ``.item()`` waits for the device (160 params: 3 ms)."""
    first = column[0]
    if first.is_cpu or any([c.device != first.device or c.dtype != first.dtype for c in column]):
        return [c.item() for c in column]
    return torch.stack(column).tolist()


def _check_all_shapes(
    algorithm: Algorithm,
    params: list[Tensor],
    grads: list[Tensor],
    buffer_columns: list[list[Any]],
    present: list[list[Any]],
) -> None:
    """`_check_shapes` for every param: compared as lists first (per-param calls cost
    more, with hundreds of tiny params), then param by param for the error. `present`
    holds the columns of the buffers that some param has (SGD without momentum: none)."""
    shapes = [p.shape for p in params]
    same = [g.shape for g in grads] == shapes
    if same and algorithm.buffers_like_param:
        same = all(
            [s if b is None else b.shape for b, s in zip(column, shapes)] == shapes for column in present
        )
    if not same:
        for i, (p, g) in enumerate(zip(params, grads)):
            _check_shapes(algorithm, p, g, [column[i] for column in buffer_columns])


def _step_pure(
    algorithm: Algorithm,
    hyperparams: Hyperparams,
    params: list[Tensor],
    grads: list[Tensor],
    states: list[dict[str, Any]],
    capturable: bool,
) -> None:
    """The algorithm's pure update on the group's lists (traceable: for capturable,
    differentiable and compiled steps), its results then written into the state and
    the params. A capturable step reads no value on the host, so a CUDA graph can
    record it."""
    try:
        columns = [
            [state[name] if required else state.get(name, MaskedNode()) for state in states]
            for name, required in _fields(algorithm, hyperparams)
        ]
    except KeyError as e:
        raise _missing_entry(e) from None
    for p, g, state in zip(params, grads, states):
        _check_shapes(algorithm, p, g, [state.get(name) for name in algorithm.buffer_fields])
    converted = _converted(algorithm, params, states)  # the pure math takes one dtype
    if converted is not None:
        raise converted
    read_params, read_columns = _copies_for_autograd((params, columns))
    updates, new_columns = algorithm.update_leaves(
        hyperparams, read_params, grads, read_columns, capturable, written_back=True
    )
    # the new values are written into the state's own tensors (shaped as they are), in place
    _write_back(params, states, zip(algorithm.fields, new_columns), updates)


def _copies_for_autograd(tree: Any) -> Any:
    """What a pure step reads: the params and the state's tensors themselves, or copies
    where autograd records (a differentiable step). Autograd may save what the update
    reads (a weight_decay or betas that requires grad multiplies the params or the
    state), and the step then writes new values into the params and the state: a saved
    tensor written in place would fail the backward pass. torch's differentiable steps
    clone the param for a tensor weight_decay likewise."""
    if not torch.is_grad_enabled():
        return tree
    return optree.tree_map(_clone, tree, none_is_leaf=True)


def _write_back(
    params: list[Tensor],
    states: list[dict[str, Any]],
    columns: Iterable[tuple[str, Sequence[Any]]],
    updates: Sequence[Tensor | None],
) -> None:
    """A pure step's results, written where torch keeps them: each (name, values) column
    gives that entry of every param's state dict; the updates are added to the params."""
    for name, values in columns:
        for state, value in zip(states, values):
            if not isinstance(value, MaskedNode):  # absent: torch has no such key
                _assign(state, name, value)
    for p, u in zip(params, updates):
        if u is not None:  # None: a param the step skipped
            p.add_(u)


def _local_shards(
    p: Tensor, g: Tensor, buffers: list[Tensor | None]
) -> tuple[Tensor, Tensor, list[Tensor | None]] | None:
    """The local shards of a sharded (DTensor) param, its gradient and its buffers (an
    absent one stays None), when all are sharded alike (as FSDP2 shards them): for
    per-element math, each rank steps its own shard, with no communication."""
    spec = (p.device_mesh, p.placements)  # type: ignore[attr-defined]
    tensors = [g, *(b for b in buffers if b is not None)]
    if not all(isinstance(t, DTensor) and (t.device_mesh, t.placements) == spec for t in tensors):
        return None
    p_local, g_local = p.to_local(), g.to_local()  # type: ignore[attr-defined]
    return p_local, g_local, [None if b is None else b.to_local() for b in buffers]  # type: ignore[attr-defined]


def _check_fused(params: list[Tensor], grads: list[Tensor]) -> None:
    # torch's own check and message (its list of devices), once per device and dtype (it
    # costs microseconds: with hundreds of params, as much as a GPU's step); read list-wise
    if len(set(map(DTYPE, params))) == 1 and len(set(map(DEVICE, params))) == 1:
        _device_dtype_check_for_fused(params[0])
    else:
        for p in {(p.device.type, p.dtype): p for p in params}.values():
            _device_dtype_check_for_fused(p)
    if any(map(IS_SPARSE, grads)):
        raise RuntimeError("`fused` does not support sparse grad or complex param")


_CAPTURABLE_TENSORS = {
    "NAdam": "params, mu_products and state_steps",
    "ASGD": "params, mus, etas, and state_steps",
}
"""What torch's capturable check names, where it names more than the params and steps
(its single-tensor step's words)."""


def _check_capturable(params: list[Tensor], name: str = "") -> None:
    devices = ["cuda", "xpu", "hpu", torch._C._get_privateuse1_backend_name(), "xla"]
    if any(p.device.type not in devices for p in params):
        tensors = _CAPTURABLE_TENSORS.get(name, "params and state_steps")
        raise AssertionError(f"If capturable=True, {tensors} must be on supported devices: {devices}.")


def _check_shapes(algorithm: Algorithm, p: Tensor, g: Tensor, buffers: Sequence[Tensor | None]) -> None:
    """Raise if a param's gradient or state buffers are shaped unlike the param: the
    param was replaced or resized after they were made (``p.data = ...``). torch's step
    fails there on broadcasting, after changing some state; a step on segments would
    run where only the shape differs, not the size (a (3, 4) state for a (4, 3) param)."""
    shape = p.shape
    if not algorithm.buffers_like_param:
        buffers = []
    if g.shape == shape:  # a loop: any() over a generator costs more, per param
        for b in buffers:
            if b is not None and b.shape != shape:
                break
        else:
            return
    named = [("a gradient", g), *zip(algorithm.buffer_fields, buffers)]
    wrong = ", ".join(
        f"{name} of shape {tuple(t.shape)}" for name, t in named if t is not None and t.shape != shape
    )
    what = []
    if g.shape != shape:
        what.append("compute its gradient anew")
    if any(b is not None and b.shape != shape for b in buffers):
        what.append("clear its state (`del optimizer.state[param]`) to start it afresh")
    raise ValueError(
        f"{algorithm.name} step: a param of shape {tuple(shape)} has {wrong}: the param was "
        f"replaced or resized after they were made (`param.data = ...`). {' and '.join(what).capitalize()}."
    )
