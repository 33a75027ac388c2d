"""What the torch face does otherwise for some algorithms, as torch.optim's class of that name
does: a record per algorithm, by name, that the algorithms themselves never read."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..engine.algorithm import REGISTRY, Algorithm


@dataclass(frozen=True)
class TorchKnobs:
    eager_state: bool = False
    """torch makes the state at construction (Adagrad), not at the first step."""
    counters_on_device: bool = False
    """torch keeps the counters on the param's device (ASGD), not on the CPU."""
    initial_from_group: bool = False
    """A param's first state comes from its group's hyperparameters (torch's ``_init_group``
    reads ``group[...]``: Adam's amsgrad, Rprop's step_size and ASGD's eta start from the
    group), not from the constructor's defaults (which torch's Adagrad reads)."""


_DEFAULTS = TorchKnobs()
_FROM_GROUP = TorchKnobs(initial_from_group=True)
KNOBS: dict[str, TorchKnobs] = {
    "Adagrad": TorchKnobs(eager_state=True),
    "Adam": _FROM_GROUP,
    "AdamW": _FROM_GROUP,
    "ASGD": TorchKnobs(counters_on_device=True, initial_from_group=True),
    "RMSprop": _FROM_GROUP,
    "Rprop": _FROM_GROUP,
}


def knobs(algorithm: Algorithm) -> TorchKnobs:
    """`algorithm`'s record: the defaults, but for funcopt's own algorithm of a torch.optim
    class's name (the one registered under it). A user's algorithm that takes the same
    name does not inherit torch's habits for that class."""
    if REGISTRY.get(algorithm.name) is not algorithm:
        return _DEFAULTS
    return KNOBS.get(algorithm.name, _DEFAULTS)


def counters_on_device(algorithm: Algorithm, group: dict[str, Any]) -> bool:
    """Whether a group's counters live on the param's device: capturable or fused, as
    torch's classes keep them, or where torch keeps them there always (ASGD)."""
    return bool(group.get("capturable") or group.get("fused")) or knobs(algorithm).counters_on_device
