"""Wrappers around transformations: `inject_hyperparams`, `MultiSteps`,
`apply_if_finite`, `lookahead`, `schedule_free` (optax's names and math)."""

from __future__ import annotations

__all__: list[str] = []
