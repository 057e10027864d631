"""Reports skipped (non-finite) updates, and stops a run whose updates stay non-finite."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from deqjax._src import checks
from deqjax._src.training.actions.action import Action, due
from deqjax._src.training.nonfinite import NonFiniteError
from deqjax._src.training.train_loop import StepMetrics

PyTree = Any


class GuardNonFinite(Action):
    """Reads ``skipped_updates`` and ``nonfinite_streak`` (the metrics of a
    :func:`~deqjax.training.skip_nonfinite` optimizer) every ``every_steps`` steps and at the last
    step: says when more updates were skipped, and stops the run when the streak reaches
    ``max_steps``.

    Args:
      max_steps: the streak of skipped updates that stops the run (None: report only).
      every_steps: steps between checks (give it the logging schedule: the fetch is shared).
      num_steps: the run's last step (always checked).
      desc: the run's label in messages.
      say: where the skip reports go (None: silent).
      last_checkpoint: ``() -> folder`` named in the error (e.g.
        :meth:`~deqjax.training.SaveCheckpoints.last_checkpoint`).
    """

    def __init__(
        self,
        max_steps: int | None,
        *,
        every_steps: int,
        num_steps: int,
        desc: str = "train",
        say: Callable[[str], None] | None = None,
        last_checkpoint: Callable[[], str] = lambda: "none",
    ):
        self._max_steps = checks.check_int(max_steps, "max_steps", allow_none=True)
        self._every = checks.check_positive_int(every_steps, "every_steps")
        self._last = num_steps
        self._desc = desc
        self._say = say
        self._last_checkpoint = last_checkpoint
        self._skipped_seen = 0

    def __call__(self, step: int, state: PyTree, metrics: StepMetrics, batch: PyTree) -> None:
        """Raises:
        NonFiniteError: the streak of skipped updates reached ``max_steps``.
        """
        if not due(step, self._every, self._last):
            return
        host = metrics.host()
        skipped = int(host.get("skipped_updates", 0))
        if skipped != self._skipped_seen and self._say is not None:
            self._say(
                f"[{self._desc}] step {step}: {skipped} update(s) skipped so far "
                f"(non-finite loss or gradient; loss {host['loss']})"
            )
        self._skipped_seen = skipped
        streak = int(host.get("nonfinite_streak", 0))
        if self._max_steps is not None and streak >= self._max_steps:
            raise NonFiniteError(
                f"[{self._desc}] stopped at step {step}: the loss or gradient was non-finite for "
                f"the last {streak} steps (>= max_nonfinite_steps={self._max_steps}); each of "
                f"those updates was skipped, so the state stays finite. Last checkpoint: "
                f"{self._last_checkpoint()}. Lower the learning rate or clip the gradients."
            )
