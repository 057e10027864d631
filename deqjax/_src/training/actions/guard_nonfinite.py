"""Reports skipped (non-finite) updates, and stops a run whose loss or updates stay non-finite."""

from __future__ import annotations

import math
from typing import Any

from deqjax._src import checks
from deqjax._src.training.actions.action import Action
from deqjax._src.training.loop_context import LoopContext
from deqjax._src.training.nonfinite import NonFiniteError
from deqjax._src.training.step_metrics import StepMetrics

PyTree = Any


class GuardNonFinite(Action):
    """Every ``every_steps`` steps and at the run's last step: says when more updates were
    skipped, and stops the run (:class:`~deqjax.training.NonFiniteError`) once the loss or the
    updates have been non-finite for ``max_steps`` steps in a row.

    With an optimizer wrapped in :func:`~deqjax.training.skip_nonfinite` it reads the wrapper's
    counters (``skipped_updates``, ``nonfinite_streak``: each such update skipped, the state
    stays finite). Without them it counts the steps since the first non-finite ``loss`` it read
    (at least that many were non-finite; every later one read non-finite too): an all-NaN run
    stops either way. Give it the logging schedule: the fetch is shared.

    Args:
      max_steps: the streak of non-finite steps that stops the run (None: report only).
      every_steps: steps between checks.

    Raises:
      ValueError: ``max_steps`` or ``every_steps`` not an int >= 1.
    """

    def __init__(self, max_steps: int | None = 10, *, every_steps: int = 100):
        super().__init__(every_steps=checks.check_positive_int(every_steps, "every_steps"))
        self._asked = self.schedule  # start adds each run's last step to it
        self._max_steps = checks.check_int(max_steps, "max_steps", allow_none=True)
        self._skipped_seen = 0
        self._first_nonfinite: int | None = None  # without the wrapper: the streak's first read

    def start(self, ctx: LoopContext) -> None:
        self.schedule = self._asked.also_at(ctx.num_steps)
        self._skipped_seen, self._first_nonfinite = 0, None

    def run(self, step: int, state: PyTree, metrics: StepMetrics, batch: PyTree) -> None:
        """Raises:
        NonFiniteError: the streak of non-finite steps reached ``max_steps``.
        """
        host = metrics.host()
        skipped = int(host.get("skipped_updates", 0))
        if skipped != self._skipped_seen:
            self.ctx.tell(
                f"step {step}: {skipped} update(s) skipped so far "
                f"(non-finite loss or gradient; loss {host['loss']})"
            )
        self._skipped_seen = skipped
        if "nonfinite_streak" in host:
            streak, kept = int(host["nonfinite_streak"]), "each of those updates was skipped"
        else:
            if math.isfinite(host["loss"]):
                self._first_nonfinite = None
            elif self._first_nonfinite is None:
                self._first_nonfinite = step
            first = self._first_nonfinite
            streak = 0 if first is None else step - first + 1
            kept = "those updates were applied (skip_nonfinite would have skipped them)"
        if self._max_steps is not None and streak >= self._max_steps:
            checkpoints = self.ctx.checkpoints
            last = checkpoints.last_checkpoint() if checkpoints is not None else "none"
            raise NonFiniteError(
                f"[{self.ctx.desc}] stopped at step {step}: the loss or gradient was non-finite "
                f"for the last {streak} steps (>= max_nonfinite_steps={self._max_steps}); {kept}. "
                f"Last checkpoint: {last}. Lower the learning rate or clip the gradients."
            )
