"""Eager argument checks shared by the modules (bad arguments raise ``ValueError`` naming them)."""

from __future__ import annotations

from typing import Any


def check_positive_int(value: Any, name: str) -> int:
    """Returns ``value`` if it is an ``int >= 1`` (``bool`` refused); else raises ``ValueError``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}.")
    return value
