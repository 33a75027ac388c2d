"""``fused=True`` as one compiled graph per group and device: horizontally fused.

fused.py compiles each param's step as one kernel and calls it param by param. Here a
param group's params of one dtype and device step in ONE compiled call: the algorithm's
``elementwise`` math runs with `OnParamLists` (fused.py's `OnParam` ops, on each tensor
of the lists), on the lists of params, gradients and buffers, and its results are copied
back into them. torch.compile traces it into one graph, which inductor turns into a few
kernels: on the CPU, one loop for all the tensors of a shape; on a GPU, combo kernels
(inductor's ``combo_kernels``) that step many tensors per launch.

As in fused.py, the float hyperparameters and the schedule's coefficients reach the
graph in one float64 tensor (an input, not a constant): a scheduler's new lr or betas,
or the growing step count, never recompiles. The graph is specialised to its lists
(their length and each tensor's shape; ``dynamic=False``): a group whose set of params
changes compiles another graph, kept beside the first (each graph a code object of its
own, so dynamo's recompile limit is never reached).

Where it runs (`LISTS_ON_CPU`): off the CPU, where the step is bound by kernel launches
and fused=True otherwise ran the in-place foreach step. On the CPU, fused.py's kernels
stay the default: measured with 1 thread (benchmarks/fused_step.py --routes, 2 loaded
cores), the list graph was about as fast as a kernel per param on 10 params of 2.4M
elements (0.73x to 1.30x its time over RMSprop, Adamax, NAdam, RAdam, Adadelta, ASGD
and Rprop), no faster than the in-place step's chunks on 300 params of 3 elements
(0.89x to 1.34x their time: RMSprop, Adamax, ASGD, Adadelta, Rprop), where the
adapter's per-param Python around the step costs more than the graph, and its
compilation grows with the number of params (300: 80 to 450 s with an empty inductor
cache on the loaded machine, as long as torch.compile of torch's own step; 15-25 s with
a warm cache).
"""

from __future__ import annotations

import types
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from ..core.base import DEVICE, DTYPE, SHAPE
from ..engine import inplace
from ..engine.algorithm import Algorithm
from ..engine.bounds import Hyperparams
from ..engine.ops import Ops, TensorList
from . import fused
from .fused import OnParam
from .step import _step_in_place


def _on_each(op: Callable[..., Any]) -> Any:
    """`op` (an `OnParam` op) on lists: list arguments are taken tensor by tensor, the
    others (coefficients, Nones) passed to every call. Returns a `TensorList`."""

    def apply(*args: Any, **kwargs: Any) -> TensorList:
        n = next(len(a) for a in args if isinstance(a, list))
        return TensorList(op(*(a[i] if isinstance(a, list) else a for a in args), **kwargs) for i in range(n))

    return staticmethod(apply)


OnParamLists = type(
    "OnParamLists",
    (),
    {
        "__doc__": "`OnParam` on lists of tensors: each op applied to each tensor, in one traced graph.",
        **{name: _on_each(getattr(OnParam, name)) for name in vars(Ops) if not name.startswith("_")},
    },
)


LISTS_ON_CPU = False
"""Whether CPU params step in the list graph too; else as fused.py steps them (a kernel
per param, tiny ones in the in-place step's chunks). Off the CPU they always do."""

_OPTIONS: dict[str, Any] = {"size_asserts": False, "alignment_asserts": False, "scalar_asserts": False}
"""Inductor's options for the graphs: without its wrapper's checks of each input's size,
stride and alignment (dynamo's guards have checked them; with 300 params, 900 checks
took a third of a step). Off the CPU, also ``combo_kernels``: independent kernels (one
per shape) horizontally fused into few launches."""


_GRAPHS: dict[Any, Callable[..., None]] = {}
"""Compiled group steps by their structure (see `step_dense`)."""


def step(algorithm: Algorithm, hyperparams: Hyperparams, params: list[Tensor], grads: list[Tensor],
         states: list[dict[str, Any]]) -> None:  # fmt: skip
    """A fused group's step: the adapter's in-place step (its checks, counters and
    schedule), whose dense params step in one compiled graph per device (`step_dense`)."""
    _step_in_place(algorithm, hyperparams, params, grads, states, dense=step_dense)


def step_dense(algorithm: Algorithm, coefficients: Any, hyperparams: Hyperparams, ps: Sequence[Tensor],
               gs: Sequence[Tensor], buffers: Sequence[Sequence[Any]]) -> None:  # fmt: skip
    """`inplace.step_dense` for a fused group (params sharing their schedule, dtype and
    the buffers present): the params on each device in one compiled call; by
    ``fused.step_dense`` where the group starts on the CPU and `LISTS_ON_CPU` is off, or
    where a gradient's dtype is not its param's. Raises (before anything changes) where
    a buffer's dtype is not its param's: the model was converted after the state was
    made."""
    if ps[0].is_cpu and not LISTS_ON_CPU:  # (fused.py steps any param of it off the CPU in place)
        fused.step_dense(algorithm, coefficients, hyperparams, ps, gs, buffers)
        return
    dtype = ps[0].dtype
    present = [column for column in buffers if column[0] is not None]
    # list-wise reads (map over an attrgetter): hundreds of tiny params
    if {d for column in present for d in map(DTYPE, column)} - {dtype}:  # the adapter names the cause
        raise RuntimeError("a state's dtype differs from its param's")
    devices = set(map(DEVICE, ps))
    if set(map(DTYPE, gs)) != {dtype} or (not present and len(devices) > 1):
        # (without buffers a group's params are not split by device, see `_by_device`)
        fused.step_dense(algorithm, coefficients, hyperparams, ps, gs, buffers)
        return
    static, names, values = fused._split(hyperparams)
    numbers = [float(c) for c in coefficients] + values
    choices = tuple(isinstance(c, bool) for c in coefficients)
    absent = tuple(column[0] is None for column in buffers)
    common = (algorithm, static, names, choices, absent, dtype, torch.get_num_threads())
    group = [list(ps), list(gs), *map(list, buffers)]
    for columns in [group] if len(devices) == 1 else inplace._by_device(group):
        device = columns[0][0].device
        if device.type == "cpu" and not LISTS_ON_CPU:
            fused.step_dense(algorithm, coefficients, hyperparams, columns[0], columns[1], columns[2:])
            continue
        structure = (*common, device, tuple(map(SHAPE, columns[0])))
        graph = _GRAPHS.get(structure)
        if graph is None:
            graph = _GRAPHS[structure] = _graph(
                algorithm, static, names, choices, absent, device.type != "cpu"
            )
        scalars = torch.tensor(numbers, dtype=torch.float64, device=device)
        with torch.no_grad():
            graph(columns[0], columns[1], *(c for c in columns[2:] if c[0] is not None), scalars)


def _graph(algorithm: Algorithm, static: tuple[tuple[str, Any], ...], names: tuple[Any, ...],
           choices: tuple[bool, ...], absent: tuple[bool, ...], combo: bool) -> Callable[..., None]:  # fmt: skip
    """A compiled group step: the math of `algorithm` on lists ``(ps, gs, *buffers)``
    and a float64 tensor of scalars (as fused.py's kernel takes them), its results
    copied into the lists' tensors."""

    def step(ps: list[Tensor], gs: list[Tensor], *lists: Any) -> None:
        *present, scalars = lists
        it = iter(present)
        buffers = [None if a else TensorList(next(it)) for a in absent]
        coefficients, hyperparams = fused._arguments(static, names, choices, scalars)
        p = TensorList(ps)
        out, new = algorithm.elementwise(
            OnParamLists, p, p, TensorList(gs), *buffers, coefficients, **hyperparams
        )
        torch._foreach_copy_(ps, list(out))
        for old, value in zip(buffers, new):
            if old is not None:
                torch._foreach_copy_(list(old), list(value))

    code = step.__code__.replace(co_name=f"fused_lists_{algorithm.name}_{len(_GRAPHS)}")
    fn = types.FunctionType(code, step.__globals__, code.co_name, step.__defaults__, step.__closure__)
    options = {**_OPTIONS, "combo_kernels": True} if combo else _OPTIONS
    return torch.compile(fn, dynamic=False, fullgraph=True, options=options)
