"""The logging section: how often a run records metrics, evaluates, diagnoses and checkpoints.

Flags ``--log_every --eval_every --diagnostics_every --checkpoint_every --keep_checkpoints``;
:meth:`LoggingConfig.fit_kwargs` gives the :func:`~deqjax.training.fit` keywords they set. None of
them changes what a run computes, so a resumed run may change them all (with ``--force``).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from deqjax._src.harness.flag_types import NonNegativeInt, PositiveInt


@dataclasses.dataclass(frozen=True)
class LoggingConfig:
    """Logging and checkpoints: metric records, evaluations, diagnostics, checkpoints."""

    # Settings a resumed run may change (with --force): all of them.
    SAFE_ON_RESUME: ClassVar[tuple[str, ...]] = (
        "log_every",
        "eval_every",
        "diagnostics_every",
        "checkpoint_every",
        "keep_checkpoints",
    )

    log_every: PositiveInt = 50  # steps between metric records
    eval_every: NonNegativeInt = 0  # steps between evaluations (0: at each epoch end)
    diagnostics_every: NonNegativeInt = 200
    """steps between backward/Jacobian diagnostics (0 disables)"""
    checkpoint_every: NonNegativeInt = 500  # steps between checkpoints (0: only at the end)
    keep_checkpoints: PositiveInt = 3  # newest checkpoints kept on disk

    def fit_kwargs(self) -> dict[str, Any]:
        """The :func:`~deqjax.training.fit` keywords these flags set."""
        return {
            "log_every": self.log_every,
            "eval_every": self.eval_every or None,
            "checkpoint_every": self.checkpoint_every or None,
            "keep_checkpoints": self.keep_checkpoints,
            "diagnostics_every": self.diagnostics_every or None,
        }
