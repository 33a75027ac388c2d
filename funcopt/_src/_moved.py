"""Where each module of funcopt's first, flat layout went, so that objects pickled by it
(a state names ``funcopt._src.adam.AdamState``, a transformation its private helpers)
still load: `install` puts a stand-in under each old name, which finds a name in the new
modules (tests/test_pickles.py loads pickles made before the move)."""

from __future__ import annotations

import importlib
import sys
import types
from typing import Any

import torch

_ALGORITHMS = (
    "adadelta adafactor adagrad adam adamax asgd lbfgs muon nadam radam rmsprop rprop sgd sparse_adam"
)

# old module (under funcopt._src) -> the modules, under funcopt._src, that hold its names now
MOVED: dict[str, tuple[str, ...]] = {
    **{name: (f"algorithms.{name}", "torch.classes", "torch.adam_classes") for name in _ALGORITHMS.split()},
    "lbfgs": ("algorithms.lbfgs", "algorithms.lbfgs_loop", "algorithms.lbfgs_search", "torch.lbfgs"),
    "base": ("core.base",),
    "algorithm": ("engine.algorithm", "engine.bounds", "engine.leaves"),
    "ops": ("engine.ops",),
    "inplace": ("engine.inplace",),
    "clipping": ("transforms.clipping",),
    "masking": ("transforms.masking",),
    "schedules": ("transforms.schedules", "transforms.schedule_math"),
    "wrappers": (
        "transforms.wrappers",
        "transforms.inject",
        "transforms.lookahead",
        "transforms.schedule_free",
        "core.hyperparams",
    ),
    "adapter": ("torch.adapter", "torch.factory", "torch.state", "torch.step"),
    "chain_inplace": ("torch.chain_inplace",),
    "fused": ("torch.fused",),
    "convert": ("torch.convert",),
    # a real package today, whose __getattr__ finds the old names (it is never replaced)
    "transforms": ("transforms.blocks", "transforms.moments", "transforms.clipping"),
}


class _Moved(types.ModuleType):
    """An old module's name: each attribute is looked up in the modules that hold it now."""

    def __init__(self, name: str, homes: tuple[str, ...]) -> None:
        super().__init__(name, f"funcopt moved this module's contents to {', '.join(homes)}")
        self._homes = homes

    def __getattr__(self, attr: str) -> Any:
        return find(self.__name__, self._homes, attr)


def find(old: str, homes: tuple[str, ...], attr: str) -> Any:
    """`attr` of the old module `old`, from the first of its `homes` that has it."""
    for home in homes:
        try:
            module = importlib.import_module(f"funcopt._src.{home}")
        except ModuleNotFoundError:
            continue
        if hasattr(module, attr):
            return getattr(module, attr)
    raise AttributeError(f"module {old!r} (moved to {', '.join(homes)}) has no {attr!r}")


def install() -> None:
    """Register each old module name (once; the real modules never take these names), and
    allow torch.load's default (weights_only) the old names of the classes it may load."""
    for old, homes in MOVED.items():
        sys.modules.setdefault(f"funcopt._src.{old}", _Moved(f"funcopt._src.{old}", homes))
    old_of: dict[str, str] = {}
    for old, homes in MOVED.items():  # (a module that two old ones fed keeps the first's name)
        for home in homes:
            old_of.setdefault(f"funcopt._src.{home}", old)
    aliases: list[Any] = [
        (cls, f"funcopt._src.{old_of[cls.__module__]}.{cls.__qualname__}")
        for cls in torch.serialization.get_safe_globals()
        if isinstance(cls, type) and cls.__module__ in old_of
    ]
    torch.serialization.add_safe_globals(aliases)
