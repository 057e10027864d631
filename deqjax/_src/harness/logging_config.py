"""The logging section: how often a run records metrics, evaluates, diagnoses and checkpoints.

Flags ``--log_every --eval_every --diagnostics_every --checkpoint_every --checkpoint_minutes
--keep_checkpoints``. The section builds what they describe for :func:`~deqjax.training.fit`, as
Flax's ``train.py`` builds its hooks: the evaluation (:meth:`LoggingConfig.evaluate`) and the
diagnostics (:meth:`~LoggingConfig.diagnostics`) among the run's actions
(:meth:`~deqjax.harness.ResumableRunConfig.actions`, every ``--log_every`` steps), and the
checkpoints (:meth:`LoggingConfig.checkpoints`). None of them changes what a run computes, so a
resumed run may change them all (with ``--force``).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from deqjax._src.harness.flag_types import NonNegativeFloat, NonNegativeInt, PositiveInt
from deqjax._src.training.actions.action import Action
from deqjax._src.training.actions.evaluate import Evaluate
from deqjax._src.training.actions.run_diagnostics import RunDiagnostics
from deqjax._src.training.checkpoints import Checkpoints
from deqjax._src.training.evaluation import DiagnosticsFn, EvalFn


@dataclasses.dataclass(frozen=True)
class LoggingConfig:
    """Logging and checkpoints: metric records, evaluations, diagnostics, checkpoints."""

    # Settings a resumed run may change (with --force): all of them.
    SAFE_ON_RESUME: ClassVar[tuple[str, ...]] = (
        "log_every",
        "eval_every",
        "diagnostics_every",
        "checkpoint_every",
        "checkpoint_minutes",
        "keep_checkpoints",
    )

    log_every: PositiveInt = 50  # steps between metric records
    eval_every: NonNegativeInt = 0  # steps between evaluations (0: at each epoch end)
    diagnostics_every: NonNegativeInt = 200
    """steps between backward/Jacobian diagnostics (0 disables)"""
    checkpoint_every: NonNegativeInt = 500  # steps between checkpoints (0: only at the end)
    checkpoint_minutes: NonNegativeFloat = 0.0  # minutes between checkpoints (0: by steps only)
    keep_checkpoints: PositiveInt = 3  # newest checkpoints kept on disk

    def evaluate(
        self,
        eval_fn: EvalFn,
        eval_data: Mapping[str, np.ndarray],
        *,
        batch_size: int | None = None,
        resident: bool = False,
    ) -> Evaluate:
        """The evaluation every ``--eval_every`` steps (0: at each epoch end) and at the end
        (:class:`~deqjax.training.Evaluate`; ``resident``: its batches kept on the devices)."""
        return Evaluate(
            eval_fn,
            eval_data,
            batch_size=batch_size,
            every_steps=self.eval_every or None,
            resident=resident,
        )

    def diagnostics(self, diagnostics_fn: DiagnosticsFn) -> list[Action]:
        """``[RunDiagnostics(diagnostics_fn)]`` every ``--diagnostics_every`` steps, or ``[]``
        when it is 0."""
        every = self.diagnostics_every
        return [RunDiagnostics(diagnostics_fn, every_steps=every)] if every else []

    def checkpoints(
        self, directory: str | os.PathLike, config: Mapping[str, Any] | None = None
    ) -> Checkpoints:
        """The run's asynchronous checkpoints in ``directory``
        (:class:`~deqjax.training.Checkpoints`): every ``--checkpoint_every`` steps and every
        ``--checkpoint_minutes`` minutes (0: not by that rule; neither: only at the end), on a
        SIGTERM, the newest ``--keep_checkpoints`` kept, ``config`` in each."""
        return Checkpoints(
            directory,
            every_steps=self.checkpoint_every or None,
            every_minutes=self.checkpoint_minutes or None,
            keep=self.keep_checkpoints,
            config=config,
        )
