"""Building blocks for `chain` (optax's names and math)."""

from __future__ import annotations

__all__: list[str] = []
