"""Schedules: functions ``count -> value`` (optax's names and arguments)."""

from __future__ import annotations

__all__: list[str] = []
