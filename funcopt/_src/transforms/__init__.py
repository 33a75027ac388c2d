"""transforms: optax's building blocks, clipping, masking, schedules and wrappers.
They import `core` and `engine`.

A transformation pickled before this package existed names its helpers in the module
``funcopt._src.transforms.blocks`` (today `blocks`): `__getattr__` finds them (tests/test_pickles.py).
"""

from __future__ import annotations

import importlib
from typing import Any


def __getattr__(name: str) -> Any:
    blocks = importlib.import_module(f"{__name__}.blocks")
    try:
        return getattr(blocks, name)
    except AttributeError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
