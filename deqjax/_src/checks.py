"""Eager argument checks shared by the modules (bad arguments raise ``ValueError`` naming them).

Every integer and real-number hyper-parameter of deqjax goes through these, so that ``True``
is never taken for ``1``, numpy scalars are accepted like Python ones, and the messages read
alike: ``"<name> must be an int >= 1, got 0."``.
"""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np


def check_int(
    value: Any, name: str, *, minimum: int | None = 1, allow_none: bool = False
) -> int | None:
    """Returns ``value`` if it is an int (Python or numpy; ``bool`` refused) ``>= minimum``.

    Args:
      value: the argument to check.
      name: the argument's name, for the message.
      minimum: the smallest value allowed (``None``: no bound).
      allow_none: accept ``None`` too (returned unchanged).

    Raises:
      ValueError: naming ``name`` and the value.
    """
    if value is None and allow_none:
        return None
    bound = "" if minimum is None else f" >= {minimum}"
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, np.integer))
        or (minimum is not None and value < minimum)
    ):
        prefix = "None or " if allow_none else ""
        raise ValueError(f"{name} must be {prefix}an int{bound}, got {value!r}.")
    return value


def check_positive_int(value: Any, name: str) -> int:
    """Returns ``value`` if it is an ``int >= 1`` (``bool`` refused); else raises ``ValueError``."""
    return check_int(value, name, minimum=1)


def check_real(value: Any, name: str, *, allow_none: bool = False) -> float | None:
    """Returns ``value`` if it is a real number (Python or numpy; ``bool`` refused).

    Range checks (``> 0``, in ``[0, 1]``...) stay with the caller, whose message names the range.

    Raises:
      ValueError: naming ``name`` and the value.
    """
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (numbers.Real, np.floating, np.integer)):
        prefix = "None or " if allow_none else ""
        raise ValueError(f"{name} must be {prefix}a real number, got {value!r}.")
    return value


def check_bool(value: Any, name: str) -> bool:
    """Returns ``value`` if it is a ``bool``; else raises ``ValueError`` naming ``name``."""
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name} must be a bool, got {value!r}.")
    return bool(value)
