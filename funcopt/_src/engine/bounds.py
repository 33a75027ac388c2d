"""torch.optim's checks of hyperparameters: the range of one (`Bound`), any other rule
(`Check`), and the checks of pairs (betas)."""

from __future__ import annotations

import numbers
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

from torch import Tensor

Hyperparams = dict[str, Any]


@dataclass(frozen=True)
class Bound:
    """torch.optim's range check of one hyperparameter:
    ``0.0 <= value``, and ``value <= high`` (or ``< high`` if not ``inclusive``)."""

    key: str
    message: str
    index: int | None = None
    high: float | None = None
    inclusive: bool = True
    # torch checks ``value < 0.0`` (SGD, ...), which NaN passes, not ``not 0.0 <= value``
    nan_passes: bool = False
    # torch checks ``not 0.0 < value``: zero is out of range too (SparseAdam's lr and eps)
    positive: bool = False

    def check(self, hyperparams: Hyperparams, tensors: bool) -> None:
        if self.key not in hyperparams:  # a funcopt extra (eps_root) the adapters lack
            return
        value = hyperparams[self.key]
        if self.index is not None:
            check_pair(self.key, value)
            value = value[self.index]
        if not (isinstance(value, Tensor) or _is_number(value)):
            # torch fails on the comparison below, with an error that names no hyperparameter
            name = self.key if self.index is None else f"{self.key}[{self.index}]"
            raise TypeError(f"{name} must be a number or a 0-d tensor; got {value!r}")
        if isinstance(value, Tensor) and not tensors:
            return  # may be batched or traced: never read in Python
        if self.nan_passes:
            ok = not value < 0.0
        else:
            ok = 0.0 < value if self.positive else 0.0 <= value
        if ok and self.high is not None:
            ok = value <= self.high if self.inclusive else value < self.high
        if not ok:
            raise ValueError(self.message.format(value))


@dataclass(frozen=True)
class Check:
    """A check of the hyperparameters that is no simple range (SGD's Nesterov rule, Rprop's
    etas), run in its place among an algorithm's bounds: ``rule(hyperparams)`` raises
    torch's exception. It reads Python numbers only (a tensor may be batched or traced).
    `pairs` names the hyperparameters it reads as pairs (Rprop's ``etas``), which, given
    as one tensor of 2 elements, become tuples of 0-d tensors."""

    rule: Callable[[Hyperparams], None]
    pairs: tuple[str, ...] = ()

    def check(self, hyperparams: Hyperparams, tensors: bool) -> None:
        self.rule(hyperparams)


def check_pair(key: str, value: Any) -> None:
    """Raise unless `value` is a pair of hyperparameters (betas, etas): torch indexes or
    unpacks one at its first step, failing there with an error that names none."""
    if not (isinstance(value, (tuple, list)) and len(value) == 2 or _is_pair_tensor(value)):
        raise ValueError(
            f"{key} must be a pair of numbers or 0-d tensors, or a tensor of 2 elements; got {value!r}"
        )


def _is_number(value: Any) -> bool:
    """A Python or NumPy real number (a bool too, as torch takes it)."""
    return isinstance(value, numbers.Real)


def _is_pair_tensor(value: Any) -> bool:
    """A pair of hyperparameters (betas) as one tensor of 2 elements, as torch.optim
    takes it: under vmap over a batch of pairs, each member is one."""
    return isinstance(value, Tensor) and value.shape == (2,)


def normalize(hyperparams: Hyperparams, pairs: Collection[str] = ()) -> Hyperparams:
    """1-element tensors become 0-d (so they broadcast like numbers); tuples stay tuples,
    and the `pairs` given as a tensor of 2 elements become tuples of 0-d tensors."""

    def one(key: str, v: Any) -> Any:
        if key in pairs and _is_pair_tensor(v):
            return tuple(v.unbind())
        if isinstance(v, Tensor):
            if v.numel() != 1:
                raise ValueError(f"Tensor {key} must be 1-element")
            return v.reshape(())
        if isinstance(v, (tuple, list)):
            return tuple(one(f"{key}[{i}]", x) for i, x in enumerate(v))
        return v

    return {k: one(k, v) for k, v in hyperparams.items()}


class Prepared(dict[str, Any]):
    """A transformation's hyperparameters (normalized), which also keep what its updates
    derive from them alone (`derived`), so that a repeated update derives it once. It
    pickles and copies as a plain dict."""

    __slots__ = ("derived",)
    derived: tuple[Any, ...]

    def __reduce__(self) -> tuple[Any, ...]:
        return (dict, (dict(self),))
