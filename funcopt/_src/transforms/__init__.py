"""transforms: optax's building blocks, clipping, masking, schedules and wrappers.
They import `core` and `engine`.

A transformation pickled before this package existed names its helpers in the module
``funcopt._src.transforms.blocks`` (today `blocks`): `__getattr__` finds them (tests/test_pickles.py).
"""

from __future__ import annotations

import importlib
from typing import Any


def __getattr__(name: str) -> Any:
    for module in ("blocks", "moments", "clipping"):
        found = getattr(importlib.import_module(f"{__name__}.{module}"), name, None)
        if found is not None:
            return found
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
