"""Non-finite updates: the optimizer skips them, and a run in which they persist stops."""

from __future__ import annotations

import optax

# optax.apply_if_finite gives up and applies a non-finite update after this many consecutive
# ones; fit stops the run long before (``max_nonfinite_steps``), so it never gives up.
_NEVER = 2**31 - 1


class NonFiniteError(FloatingPointError):
    """Training stopped: the loss or gradient stayed non-finite (every such update skipped)."""


def skip_nonfinite(optimizer: optax.GradientTransformation) -> optax.GradientTransformation:
    """``optimizer`` that skips (zero update, state unchanged) any non-finite gradient.

    ``optax.apply_if_finite`` that never gives up: its state counts the skipped updates
    (``total_notfinite``) and the current streak (``notfinite_count``), which
    :func:`~deqjax.training.train_step` logs as ``skipped_updates`` and ``nonfinite_streak``.
    """
    return optax.apply_if_finite(optimizer, max_consecutive_errors=_NEVER)
