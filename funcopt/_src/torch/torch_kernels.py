"""``fused=True`` for Adam, AdamW, SGD and Adagrad: torch's own fused kernels.

torch has hand-written fused kernels for these four (``torch._fused_adam_``,
``_fused_adamw_``, ``_fused_sgd_`` and ``_fused_adagrad_``), for the CPU and for GPUs. A
funcopt class of one of these names, given ``fused=True``, calls them with the arguments
torch's class gives them. So its params and state are those of torch's fused class, bit
for bit, and so is its ``state_dict``:
- the params are grouped by device and dtype;
- the step counters (float32, on the param's device) go up by one before the kernel runs;
- a GradScaler's scale and inf flag go to the kernel, which unscales the gradients in
  place, or skips the step on an inf (the counters are then set back);
- SGD's momentum buffers are made empty at their first step, and the kernel fills them.

One thing differs from torch. torch 2.13's CPU kernels walk each tensor's memory in
order. So a gradient or buffer laid out unlike its param (a transposed param with a
contiguous gradient set by hand) gets the wrong elements paired, with no error. Such
tensors reach the kernel as copies laid out as their param, and the results are copied
back. A param that does not fill its memory goes in as a contiguous copy, with all its
tensors.

Every other class's ``fused=True`` step is fused.py's (kernels compiled from the
algorithm's math). A compiled step (torch.compile) takes the adapter's traceable step.
"""

from __future__ import annotations

import functools
import itertools
import operator
from collections.abc import Callable, Mapping
from typing import Any, cast

import torch
from torch import Tensor
from torch.optim.optimizer import _device_dtype_check_for_fused

from ..core.base import DTYPE, IS_SPARSE, SHAPE
from ..engine.algorithm import Algorithm
from .adapter import Optimizer
from .fused import _dense
from .state import _converted

Kernel = Callable[..., None]
States = Mapping[Tensor, dict[str, Any]]


class KernelOptimizer(Optimizer):
    """An `Optimizer` whose groups with ``fused=True`` step by torch's fused kernel for
    its algorithm (`STEPS`, by the algorithm's name), as torch's class of that name does."""

    _sparse_refused = False
    """Whether the class's `_check_grads` refuses sparse gradients (Adam's): the fused step
    then reads no gradient's layout again."""

    def _kernels_take_amp(self) -> bool:
        """Whether the kernels take a GradScaler's scale and inf flag: where every group
        is fused (else the adapter unscales every gradient, see `_unscale_for_amp`)."""
        return not torch.compiler.is_compiling() and all(g.get("fused") for g in self.param_groups)

    def _unscale_for_amp(self) -> bool:
        if self._kernels_take_amp():
            return True  # the kernels unscale, or skip the step, themselves: no host sync
        return super()._unscale_for_amp()

    def _step_group(
        self,
        group: dict[str, Any],
        params: list[Tensor],
        grads: list[Tensor],
        states: list[Any] | None = None,
    ) -> None:
        if not group.get("fused") or torch.compiler.is_compiling():
            super()._step_group(group, params, grads, states)
            return
        if group.get("differentiable"):
            raise RuntimeError("`fused` does not support `differentiable`")
        # (the devices and dtypes are checked in `run`)
        if not self._sparse_refused and any(map(IS_SPARSE, grads)):
            raise RuntimeError("`fused` does not support sparse grad or complex param")
        amp = self._kernels_take_amp()
        grad_scale = getattr(self, "grad_scale", None) if amp else None
        found_inf = getattr(self, "found_inf", None) if amp else None
        algorithm = cast(Algorithm, self._transform)
        try:
            if states is None:
                states = list(map(self.state.get, params))
            STEPS[algorithm.name](
                group, params, grads, _States(self.state, params, states), grad_scale, found_inf
            )
        except RuntimeError as error:  # torch's error names no tensor and no cause
            converted = _converted(algorithm, params, [self.state.get(p, {}) for p in params])
            if converted is None:
                raise
            raise converted from error


class _States:
    """The state dicts of a group's params that have a gradient (`listed`: as
    `_init_group` found them, None where a param has none yet), and the optimizer's
    ``state``, where such a param's dict is made when a step asks for it."""

    def __init__(self, state: States, params: list[Tensor], listed: list[Any]) -> None:
        self.state, self.params, self.listed = state, params, listed

    def dicts(self) -> list[dict[str, Any]]:
        """Each param's state dict, made (empty) where it has none."""
        listed = self.listed
        if None in listed:  # (a list-wise test: hundreds of params)
            listed[:] = [self.state[p] if s is None else s for p, s in zip(self.params, listed)]
        return listed


def adam(group: dict[str, Any], params: list[Tensor], grads: list[Tensor], state: _States,
         grad_scale: Tensor | None, found_inf: Tensor | None) -> None:  # fmt: skip
    """torch's ``_fused_adam``: ``_fused_adamw_`` for decoupled weight decay (AdamW)."""
    states = state.dicts()
    amsgrad = group["amsgrad"]
    buffers = [
        [s["exp_avg"] for s in states],
        [s["exp_avg_sq"] for s in states],
        [s["max_exp_avg_sq"] for s in states] if amsgrad else [],
    ]
    beta1, beta2 = (b.squeeze() if isinstance(b, Tensor) else b for b in group["betas"])  # torch's _to_scalar
    kernel = torch._fused_adamw_ if group.get("decoupled_weight_decay") else torch._fused_adam_
    run(kernel, params, grads, buffers, [s["step"] for s in states], grad_scale, found_inf, group["lr"],
        move_lr=True, amsgrad=amsgrad, beta1=beta1, beta2=beta2, weight_decay=group["weight_decay"],
        eps=group["eps"], maximize=group["maximize"])  # fmt: skip


def adagrad(group: dict[str, Any], params: list[Tensor], grads: list[Tensor], state: _States,
            grad_scale: Tensor | None, found_inf: Tensor | None) -> None:  # fmt: skip
    """torch's ``_fused_adagrad``."""
    states = state.dicts()
    run(torch._fused_adagrad_, params, grads, [[s["sum"] for s in states]], [s["step"] for s in states],
        grad_scale, found_inf, group["lr"], move_lr=True, lr_decay=group["lr_decay"],
        weight_decay=group["weight_decay"], eps=group["eps"], maximize=group["maximize"])  # fmt: skip


def sgd(group: dict[str, Any], params: list[Tensor], grads: list[Tensor], state: _States,
        grad_scale: Tensor | None, found_inf: Tensor | None) -> None:  # fmt: skip
    """torch's ``_fused_sgd``. A momentum buffer is made at its param's first step, empty
    (the kernel's ``is_first_step`` fills it with the gradient). Where some params of the
    group have their buffers and others not yet (a param that got its first gradient
    late; torch's class fails there), each kind steps by its own call of the kernel."""
    momentum = group["momentum"]
    options = {
        "weight_decay": group["weight_decay"],
        "momentum": momentum,
        "dampening": group["dampening"],
        "nesterov": group["nesterov"],
        "maximize": group["maximize"],
    }
    if momentum == 0:
        run(torch._fused_sgd_, params, grads, [[]], None, grad_scale, found_inf, group["lr"], move_lr=False,
            is_first_step=False, **options)  # fmt: skip
        return
    states = state.dicts()  # (torch keeps no state without momentum)
    buffers: list[Tensor | None] = [s.get("momentum_buffer") for s in states]
    if all(map(operator.is_not, buffers, itertools.repeat(None))):  # as usual: all there
        run(torch._fused_sgd_, params, grads, [buffers], None, grad_scale, found_inf, group["lr"],  # type: ignore[list-item]
            move_lr=False, is_first_step=False, **options)  # fmt: skip
        return
    fresh = [i for i, b in enumerate(buffers) if b is None]
    for first, indices in ((False, [i for i, b in enumerate(buffers) if b is not None]), (True, fresh)):
        if not indices:
            continue
        if len(indices) == len(params):
            ps, gs = params, grads
        else:
            ps, gs = [params[i] for i in indices], [grads[i] for i in indices]
        bs = [torch.empty_like(p) for p in ps] if first else [buffers[i] for i in indices]
        run(torch._fused_sgd_, ps, gs, [bs], None, grad_scale, found_inf, group["lr"], move_lr=False,  # type: ignore[list-item]
            is_first_step=first, **options)  # fmt: skip
        if first:
            for i, b in zip(indices, bs):
                states[i]["momentum_buffer"] = b


STEPS: dict[str, Callable[..., None]] = {"Adam": adam, "AdamW": adam, "Adagrad": adagrad, "SGD": sgd}
"""The kernel step of each algorithm (by name) whose torch class has a fused kernel."""


def run(kernel: Kernel, params: list[Tensor], grads: list[Tensor], buffers: list[list[Tensor]],
        steps: list[Tensor] | None, grad_scale: Tensor | None, found_inf: Tensor | None,
        lr: float | Tensor, *, move_lr: bool, **options: Any) -> None:  # fmt: skip
    """Call `kernel` on the params, gradients, buffers (an empty list for one that is
    absent, Adam's ``max_exp_avg_sq`` without amsgrad) and step counters (None: SGD's
    kernel takes none), once per device and dtype, as torch's ``_fused_*`` functions do.
    A tensor lr on a GPU goes to each device (`move_lr`; torch's SGD leaves it as is)."""
    columns = [list(params), list(grads), *(list(column) for column in buffers)]
    _check_shapes(columns)
    written = [True, grad_scale is not None] + [True] * len(buffers)
    back = _lay_out(columns, written)
    lists: list[list[Tensor]] = columns if steps is None else [*columns, steps]
    on_device: dict[str, dict[torch.device, Tensor]] = {"scale": {}, "inf": {}, "lr": {}}
    if move_lr and isinstance(lr, Tensor) and lr.device.type != "cpu":
        on_device["lr"][lr.device] = lr
    grouped = torch.optim.Optimizer._group_tensors_by_device_and_dtype(lists)  # type: ignore[arg-type]
    for _, (tensors_, _) in grouped.items():  # torch's check and message, before any param changes
        _device_dtype_check_for_fused(cast(Tensor, tensors_[0][0]))
    for (device_, dtype), (tensors_, _) in grouped.items():
        device, tensors = cast(torch.device, device_), cast(list[list[Tensor]], tensors_)
        device_scale = _to(on_device["scale"], grad_scale, device)
        device_inf = _to(on_device["inf"], found_inf, device)
        device_lr = _to(on_device["lr"], lr, device) if on_device["lr"] else lr
        if steps is not None:
            _count(tensors[-1], device)
        kwargs = {"lr": device_lr, "grad_scale": device_scale, "found_inf": device_inf, **options}
        if kernel is torch._fused_sgd_ and device.type == "cpu" and not _sgd_sound_on_cpu(dtype):
            _widened(kernel, tensors, written, kwargs)
        else:
            kernel(*tensors, **kwargs)
        if steps is not None and device_inf is not None:
            torch._foreach_sub_(tensors[-1], [device_inf] * len(tensors[-1]))
    for original, copy in back:
        original.copy_(copy)


def _count(steps: list[Tensor], device: torch.device) -> None:
    """Add one to each step counter, as torch's ``torch._foreach_add_(steps, 1)``. On the
    CPU with a tensor one: the same sums (one is exact in every float dtype), but torch's
    CPU foreach ops wrap a Python number into a new tensor per counter, 10 times the
    time of the op (300 counters: 2.5 ms against 0.2 ms), about the whole of a fused step
    of tiny params."""
    if device.type != "cpu" or len(dtypes := set(map(DTYPE, steps))) != 1:
        torch._foreach_add_(steps, 1)
        return
    one = torch.ones((), dtype=dtypes.pop())
    torch._foreach_add_(steps, [one] * len(steps))


@functools.cache
def _sgd_sound_on_cpu(dtype: torch.dtype) -> bool:
    """Whether torch's CPU SGD kernel steps params of `dtype` right. torch 2.13's leaves
    the vectorized part of a float16 or bfloat16 param as it was (it steps only the
    elements past the last whole vector), silently; float32 and float64 are right."""
    if dtype in (torch.float32, torch.float64):
        return True
    p, g = torch.zeros(64, dtype=dtype), torch.ones(64, dtype=dtype)
    torch._fused_sgd_([p], [g], [], weight_decay=0.0, momentum=0.0, lr=1.0, dampening=0.0, nesterov=False,
                      maximize=False, is_first_step=False)  # fmt: skip
    return bool((p == -1).all())


def _widened(
    kernel: Kernel, tensors: list[list[Tensor]], written: list[bool], kwargs: dict[str, Any]
) -> None:
    """`kernel` on float32 copies of `tensors` (params, gradients, buffers of a reduced
    precision), its results rounded back into those it writes: as a sound kernel steps
    them (it computes in float32, and rounds once per stored tensor)."""
    wide = [[t.float() for t in column] for column in tensors]
    kernel(*wide, **kwargs)
    for column, wide_column, write in zip(tensors, wide, written):
        if write and column:
            torch._foreach_copy_(column, wide_column)


def _to(cache: dict[torch.device, Tensor], t: Any, device: torch.device) -> Any:
    """`t` (a tensor or None) on `device`, copied there once per step."""
    if not isinstance(t, Tensor):
        return t
    if device not in cache:
        cache[device] = t.to(device, non_blocking=True)
    return cache[device]


def _check_shapes(columns: list[list[Tensor]]) -> None:
    """Raise where a gradient or buffer is shaped unlike its param (the param replaced or
    resized after they were made: ``param.data = ...``). torch's fused kernels check no
    shape: they would read a smaller tensor out of its bounds. Compared as lists (hundreds
    of tiny params), then param by param for the message."""
    shapes = list(map(SHAPE, columns[0]))
    for j, column in enumerate(columns[1:]):
        if not column or list(map(SHAPE, column)) == shapes:
            continue
        i = next(i for i, (t, shape) in enumerate(zip(column, shapes)) if t.shape != shape)
        wrong, fix = (
            ("a gradient", "Compute its gradient anew")
            if j == 0
            else ("a state buffer", "Clear its state (`del optimizer.state[param]`) to start it afresh")
        )
        raise ValueError(
            f"fused step: a param of shape {tuple(shapes[i])} has {wrong} of shape {tuple(column[i].shape)}: "
            f"the param was replaced or resized after that was made (`param.data = ...`). {fix}."
        )


def _lay_out(columns: list[list[Tensor]], written: list[bool]) -> list[tuple[Tensor, Tensor]]:
    """Put in `columns` (the params, then their gradients, then each buffer: a list per
    param, or an empty one for an absent buffer) a copy of each tensor laid out in
    memory unlike its param, laid out as it; for a param that does not fill its memory
    (a strided view), contiguous copies of it and all its tensors. Returns the (tensor,
    copy) pairs to copy back after the kernel: those of the columns the kernel writes."""
    params = columns[0]
    present = [(column, write) for column, write in zip(columns[1:], written[1:]) if column]
    # as usual, every tensor contiguous: laid out as its param (of its shape). One read a
    # tensor (hundreds of tiny params): a stride costs more
    if all(map(Tensor.is_contiguous, params)) and all(
        all(map(Tensor.is_contiguous, column)) for column, _ in present
    ):
        return []
    strides = list(map(Tensor.stride, params))
    if all(list(map(Tensor.stride, column)) == strides for column, _ in present) and all(
        map(Tensor.is_contiguous, params)
    ):
        return []  # (size-1 dimensions aside, as the above)
    back = []
    for i, p in enumerate(params):
        dense = p.is_contiguous() or _dense(p)
        for column, write in [(params, written[0]), *present]:
            t = column[i]
            if dense and t.stride() == strides[i]:
                continue
            if dense:
                copy = torch.empty_strided(p.shape, strides[i], dtype=t.dtype, device=t.device).copy_(t)
            else:
                copy = t.contiguous()
            if copy is not t:
                column[i] = copy
                if write:
                    back.append((t, copy))
    return back
