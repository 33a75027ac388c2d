"""transforms: optax's building blocks, clipping, masking, schedules and wrappers.
They import `core`, `engine` and `algorithms` (`moments.py`'s `scale_by_adam` runs
``algorithms/adam.py``'s math, through `from_algorithm.py`).

A transformation pickled before this package existed names its helpers in the module
``funcopt._src.transforms`` (today `blocks`, `moments` and `clipping`): `__getattr__`
finds them there (`_moved.MOVED`; tests/test_pickles.py).
"""

from __future__ import annotations

from typing import Any

from .._moved import MOVED, find


def __getattr__(name: str) -> Any:
    return find(__name__, MOVED["transforms"], name)
