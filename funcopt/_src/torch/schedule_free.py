"""Schedule-Free drop-in classes: `SGDScheduleFree`, `AdamWScheduleFree` and
`RAdamScheduleFree`, with the constructors, ``train()``/``eval()`` and ``state_dict`` of
the authors' ``schedulefree`` package (Defazio et al., 2024), and its numbers.

The math, per param group, at step ``t = k + 1``: a learning rate ``lr_t`` (the warmup's,
or RAdam's rectified one), ``lr_max = max(lr_max, lr_t)``, the averaging weight
``c = w_t / sum(w)`` with ``w_t = t ** r * lr_max ** weight_lr_power`` (0 while the sum
is 0), and a direction ``d`` (the gradient, normalized by Adam's second moment for AdamW
and RAdam, plus ``weight_decay * y``). Then

    y <- lerp(y, z, c) + lr_t * (b1 * (1 - c) - 1) * d      z <- z - lr_t * d

where ``y`` is the params (where gradients are taken) and ``z`` the base iterate, in the
state. The average ``x = (y - (1 - b1) * z) / b1`` is what ``eval()`` puts in the params;
``train()`` puts ``y`` back. The functional face of the same math is `schedule_free`.

One difference from the package: the gradients are left as they are, where its step
overwrites each ``p.grad`` with the normalized direction.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor
from torch.optim.optimizer import ParamsT

from ..transforms.schedule_free_math import FOREACH, averaging, interpolate
from .distance_classes import _parts as _split

__all__ = ["AdamWScheduleFree", "RAdamScheduleFree", "SGDScheduleFree"]


def _check(who: str, ok: bool, what: str, value: Any) -> None:
    if not ok:
        raise ValueError(f"{who}: {what}, got {value!r}")


def _check_common(
    who: str, lr: float | Tensor, weight_decay: float, betas: tuple[float, float] | None
) -> None:
    _check(who, float(lr) >= 0.0, "lr must be >= 0", lr)
    _check(who, weight_decay >= 0.0, "weight_decay must be >= 0", weight_decay)
    if betas is not None:
        _check(who, 0.0 < betas[0] < 1.0, "betas[0] must be in (0, 1) (eval() divides by it)", betas[0])
        _check(who, 0.0 <= betas[1] < 1.0, "betas[1] must be in [0, 1)", betas[1])


class _ScheduleFree(torch.optim.Optimizer):
    """What the three classes share: train()/eval(), the averaging weight, the y and z step.
    A subclass gives `_b1`, `_lr` (the step's learning rate) and `_direction`."""

    def _b1(self, group: dict[str, Any]) -> float:
        return group["betas"][0]

    def _lr(self, group: dict[str, Any], step: int) -> float:
        raise NotImplementedError

    def _init_state(self, p: Tensor) -> dict[str, Tensor]:
        return {"z": torch.clone(p, memory_format=torch.preserve_format)}

    def _direction(self, group: dict[str, Any], params: list[Tensor], step: int) -> list[Tensor]:
        """The direction before weight decay (may be the gradients themselves: not changed)."""
        raise NotImplementedError

    @torch.no_grad()
    def eval(self) -> None:
        """Put the average ``x`` in the params: evaluate, or save a checkpoint, in this mode."""
        self._switch(train=False)

    @torch.no_grad()
    def train(self) -> None:
        """Put ``y`` back in the params: call before the first step and after each eval()."""
        self._switch(train=True)

    def _switch(self, train: bool) -> None:
        for group in self.param_groups:
            if group["train_mode"] == train:
                continue
            b1 = self._b1(group)
            weight = 1 - b1 if train else 1 - 1 / b1
            for p in group["params"]:
                if "z" in self.state[p]:
                    p.lerp_(end=self.state[p]["z"].to(p.device), weight=weight)
            group["train_mode"] = train

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        """One step; `closure` (optional) recomputes the loss, which is returned."""
        if not self.param_groups[0]["train_mode"]:
            raise RuntimeError(
                f"{type(self).__name__}.step: the optimizer is in eval mode; call optimizer.train() before "
                "training (and optimizer.eval() before evaluating or saving a checkpoint)"
            )
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            self._step_group(group)
        return loss

    def _step_group(self, group: dict[str, Any]) -> None:
        k = group["k"]
        lr = group["scheduled_lr"] = self._lr(group, k + 1)
        ckp1, group["lr_max"], group["weight_sum"] = averaging(
            k + 1, lr, group["lr_max"], group["weight_sum"], group["r"], group["weight_lr_power"]
        )
        active = [p for p in group["params"] if p.grad is not None]
        for p in active:
            if p.grad.is_sparse:
                raise RuntimeError(f"{type(self).__name__} does not support sparse gradients")
            if "z" not in self.state[p]:
                self.state[p].update(self._init_state(p))
        # foreach: params in parts of bounded size; else one at a time
        for params in _parts(active) if group["foreach"] else [[p] for p in active]:
            d = self._direction(group, params, k + 1)
            if group["weight_decay"] != 0:  # at y
                if d[0] is params[0].grad:  # the gradients themselves: left as they are
                    d = list(torch._foreach_add(d, params, alpha=group["weight_decay"]))
                else:  # the step's own tensors
                    torch._foreach_add_(d, params, alpha=group["weight_decay"])
            z = [self.state[p]["z"] for p in params]
            interpolate(FOREACH, params, params, z, d, lr, ckp1, self._b1(group))
        group["k"] = k + 1


def _parts(params: list[Tensor]) -> list[list[Tensor]]:
    """`params` in parts of bounded size (see distance_classes.PART): a step's temporaries
    are then reused, not mapped anew from the OS each step."""
    return [list(part[0]) for part in _split([params])] if params else []


class SGDScheduleFree(_ScheduleFree):
    """Schedule-Free SGD, as ``schedulefree.SGDScheduleFree`` (same arguments, state_dict
    and numbers). Call ``train()`` before training and ``eval()`` before evaluating or
    saving a checkpoint. The functional form is `schedule_free_sgd`.

    Args:
        params: tensors or param-group dicts, as for any torch optimizer.
        lr: the learning rate (schedule-free SGD takes larger ones than SGD: 1.0 to 10.0).
        momentum: the interpolation weight ``b1`` between ``x`` and ``z``, in (0, 1).
        weight_decay: L2 penalty, added to the gradient at ``y``.
        warmup_steps: a linear warmup, ``lr * t / warmup_steps`` at step t (0: none).
        r: the power of the step in the averaging weights (polynomial weighting).
        weight_lr_power: the power of the largest learning rate so far in the weights.
        foreach: step all params at once with foreach ops, else one at a time.

    Example:
        >>> import torch, funcopt as fo
        >>> w = torch.nn.Parameter(torch.tensor([4.0]))
        >>> opt = fo.SGDScheduleFree([w], lr=0.1, warmup_steps=2)
        >>> opt.train()
        >>> for _ in range(3):  # minimize w ** 2
        ...     opt.zero_grad()
        ...     (w**2).sum().backward()
        ...     opt.step()
        >>> opt.eval()
        >>> w.data
        tensor([2.6925])
    """

    def __init__(
        self,
        params: ParamsT,
        lr: float | Tensor = 1.0,
        momentum: float = 0.9,
        weight_decay: float = 0,
        warmup_steps: int = 0,
        r: float = 0.0,
        weight_lr_power: float = 2,
        foreach: bool | None = True,
    ) -> None:
        who = "SGDScheduleFree"
        _check_common(who, lr, weight_decay, None)
        _check(who, 0.0 < momentum < 1.0, "momentum must be in (0, 1)", momentum)
        _check_warmup(who, warmup_steps)
        defaults = dict(
            lr=lr, momentum=momentum, r=r, k=0, warmup_steps=warmup_steps, train_mode=False, weight_sum=0.0,
            lr_max=-1.0, scheduled_lr=0.0, weight_lr_power=weight_lr_power, weight_decay=weight_decay,
            foreach=foreach,
        )  # fmt: skip
        super().__init__(params, defaults)

    def _b1(self, group: dict[str, Any]) -> float:
        return group["momentum"]

    def _lr(self, group: dict[str, Any], step: int) -> float:
        return _warmed_up(group, step)

    def _direction(self, group: dict[str, Any], params: list[Tensor], step: int) -> list[Tensor]:
        return [p.grad for p in params]  # type: ignore[misc]


def _check_warmup(who: str, warmup_steps: int) -> None:
    ok = isinstance(warmup_steps, int) and not isinstance(warmup_steps, bool) and warmup_steps >= 0
    _check(who, ok, "warmup_steps must be an int >= 0 (0: no warmup)", warmup_steps)


def _warmed_up(group: dict[str, Any], step: int) -> float:
    """The learning rate at `step` (from 1) of a linear warmup: lr * step / warmup_steps."""
    warmup = group["warmup_steps"]
    return float(group["lr"]) * (step / warmup if step <= warmup else 1.0)


def _adam_direction(
    group: dict[str, Any], state: dict, params: list[Tensor], step: int, normalize: bool = True
) -> list[Tensor]:
    """Update Adam's second moment ``v``; the gradient over ``sqrt(v / (1 - beta2 ** step))
    + eps``, or the gradient itself if not `normalize`."""
    beta2 = group["betas"][1]
    grads: list[Tensor] = [p.grad for p in params]  # type: ignore[misc]
    v = [state[p]["exp_avg_sq"] for p in params]
    torch._foreach_mul_(v, beta2)
    torch._foreach_addcmul_(v, grads, grads, value=1 - beta2)
    if not normalize:
        return grads
    denom = torch._foreach_div(v, 1 - beta2**step)
    torch._foreach_sqrt_(denom)
    torch._foreach_add_(denom, group["eps"])
    return list(torch._foreach_div(grads, denom))


class AdamWScheduleFree(_ScheduleFree):
    """Schedule-Free AdamW, as ``schedulefree.AdamWScheduleFree`` (same arguments,
    state_dict and numbers). Call ``train()`` before training and ``eval()`` before
    evaluating or saving a checkpoint. The functional form is `schedule_free_adamw`.

    Args:
        params: tensors or param-group dicts, as for any torch optimizer.
        lr: the learning rate.
        betas: ``b1``, the interpolation weight between ``x`` and ``z`` (in (0, 1)), and
            the decay of the second moment.
        eps: added to the root of the second moment.
        weight_decay: decoupled weight decay, at ``y``.
        warmup_steps: a linear warmup, ``lr * t / warmup_steps`` at step t (0: none).
        r: the power of the step in the averaging weights (polynomial weighting).
        weight_lr_power: the power of the largest learning rate so far in the weights.
        foreach: step all params at once with foreach ops, else one at a time.

    Example:
        >>> import torch, funcopt as fo
        >>> model = torch.nn.Linear(2, 1)
        >>> opt = fo.AdamWScheduleFree(model.parameters(), lr=1e-2, warmup_steps=10)
        >>> opt.train()  # before training
        >>> model(torch.ones(1, 2)).sum().backward()
        >>> opt.step()
        >>> opt.eval()  # before evaluating, or saving a checkpoint
        >>> sorted(opt.state[model.weight])
        ['exp_avg_sq', 'z']
    """

    def __init__(
        self,
        params: ParamsT,
        lr: float | Tensor = 0.0025,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0,
        warmup_steps: int = 0,
        r: float = 0.0,
        weight_lr_power: float = 2.0,
        foreach: bool | None = True,
    ) -> None:
        who = "AdamWScheduleFree"
        _check_common(who, lr, weight_decay, betas)
        _check(who, eps >= 0.0, "eps must be >= 0", eps)
        _check_warmup(who, warmup_steps)
        defaults = dict(
            lr=lr, betas=betas, eps=eps, r=r, k=0, warmup_steps=warmup_steps, train_mode=False, weight_sum=0.0,
            lr_max=-1.0, scheduled_lr=0.0, weight_lr_power=weight_lr_power, weight_decay=weight_decay,
            foreach=foreach,
        )  # fmt: skip
        super().__init__(params, defaults)

    def _lr(self, group: dict[str, Any], step: int) -> float:
        return _warmed_up(group, step)

    def _init_state(self, p: Tensor) -> dict[str, Tensor]:
        return {
            **super()._init_state(p),
            "exp_avg_sq": torch.zeros_like(p, memory_format=torch.preserve_format),
        }

    def _direction(self, group: dict[str, Any], params: list[Tensor], step: int) -> list[Tensor]:
        return _adam_direction(group, self.state, params, step)


def _rectification(beta2: float, step: int) -> float | None:
    """RAdam's rectification of the learning rate at `step`, or None while the
    variance is not yet tractable (``rho_t <= 4``)."""
    bias_correction2 = 1 - beta2**step
    rho_inf = 2 / (1 - beta2) - 1
    rho_t = rho_inf - 2 * step * beta2**step / bias_correction2
    if rho_t <= 4.0:
        return None
    return ((rho_t - 4) * (rho_t - 2) * rho_inf / ((rho_inf - 4) * (rho_inf - 2) * rho_t)) ** 0.5


class RAdamScheduleFree(_ScheduleFree):
    """Schedule-Free RAdam, as ``schedulefree.RAdamScheduleFree`` (same arguments,
    state_dict and numbers): AdamW's schedule-free step with RAdam's rectified learning
    rate in place of a warmup. Call ``train()`` before training and ``eval()`` before
    evaluating or saving a checkpoint.

    Args:
        params: tensors or param-group dicts, as for any torch optimizer.
        lr: the learning rate.
        betas: ``b1``, the interpolation weight between ``x`` and ``z`` (in (0, 1)), and
            the decay of the second moment.
        eps: added to the root of the second moment.
        weight_decay: decoupled weight decay, at ``y``.
        r: the power of the step in the averaging weights (polynomial weighting).
        weight_lr_power: the power of the largest learning rate so far in the weights.
        foreach: step all params at once with foreach ops, else one at a time.
        silent_sgd_phase: in the first steps, while the variance is not tractable, take
            no step (True), or an SGD step with the gradient (False).

    Example:
        >>> import torch, funcopt as fo
        >>> w = torch.nn.Parameter(torch.tensor([1.0, -2.0]))
        >>> opt = fo.RAdamScheduleFree([w], lr=0.1)
        >>> opt.train()
        >>> def step():
        ...     opt.zero_grad()
        ...     (w**2).sum().backward()
        ...     opt.step()
        >>> for _ in range(4):  # with betas[1] = 0.999, the first 4 steps are silent
        ...     step()
        >>> w.data
        tensor([ 1., -2.])
        >>> step()
        >>> w.data
        tensor([ 0.9983, -1.9983])
    """

    def __init__(
        self,
        params: ParamsT,
        lr: float | Tensor = 0.0025,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0,
        r: float = 0.0,
        weight_lr_power: float = 2.0,
        foreach: bool | None = True,
        silent_sgd_phase: bool = True,
    ) -> None:
        who = "RAdamScheduleFree"
        _check_common(who, lr, weight_decay, betas)
        _check(who, eps >= 0.0, "eps must be >= 0", eps)
        defaults = dict(
            lr=lr, betas=betas, eps=eps, r=r, k=0, train_mode=False, weight_sum=0.0, lr_max=-1.0,
            scheduled_lr=0.0, weight_lr_power=weight_lr_power, weight_decay=weight_decay, foreach=foreach,
            silent_sgd_phase=silent_sgd_phase,
        )  # fmt: skip
        super().__init__(params, defaults)

    def _lr(self, group: dict[str, Any], step: int) -> float:
        rect = _rectification(group["betas"][1], step)
        return float(group["lr"]) * (rect if rect is not None else float(not group["silent_sgd_phase"]))

    def _init_state(self, p: Tensor) -> dict[str, Tensor]:
        return {
            **super()._init_state(p),
            "exp_avg_sq": torch.zeros_like(p, memory_format=torch.preserve_format),
        }

    def _direction(self, group: dict[str, Any], params: list[Tensor], step: int) -> list[Tensor]:
        # in the first steps (no rectification yet) v is kept, and the gradient is the direction
        adaptive = _rectification(group["betas"][1], step) is not None
        return _adam_direction(group, self.state, params, step, normalize=adaptive)
