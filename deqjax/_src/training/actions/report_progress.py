"""A progress bar over the steps, showing the latest logged loss and accuracy."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax

from deqjax._src import checks
from deqjax._src.training.actions.action import Action, due
from deqjax._src.training.metrics import format_metrics, progress_bar
from deqjax._src.training.train_loop import StepMetrics

PyTree = Any


class ReportProgress(Action):
    """A tqdm bar over the steps (process 0 only), advanced every step; every ``every_steps``
    steps and at the last step its postfix shows ``keys`` of the metrics (read on the host, so
    give it the logging schedule: the fetch is shared).

    A context manager (closing the bar on exit, also after an error); :meth:`end` closes it too.

    Args:
      num_steps: the run's last step.
      every_steps: steps between postfix updates.
      desc: the bar's label.
      enabled: False shows nothing.
      keys: the metrics shown.
    """

    def __init__(
        self,
        *,
        num_steps: int,
        every_steps: int,
        desc: str = "train",
        enabled: bool = True,
        keys: Sequence[str] = ("loss", "accuracy"),
    ):
        self._num_steps = num_steps
        self._every = checks.check_positive_int(every_steps, "every_steps")
        self._desc = desc
        self._enabled = enabled and jax.process_index() == 0
        self._keys = tuple(keys)
        self._bar = None

    def start(self, step: int, state: PyTree) -> None:
        self.close()
        self._bar = progress_bar(
            total=self._num_steps, initial=step, enabled=self._enabled, desc=self._desc
        )

    def __call__(self, step: int, state: PyTree, metrics: StepMetrics, batch: PyTree) -> None:
        self._bar.update(1)
        if due(step, self._every, self._num_steps):
            self._bar.set_postfix_str(format_metrics(metrics.host(), keys=self._keys))

    def end(self, step: int, state: PyTree, stopped: bool) -> None:
        self.close()

    def close(self) -> None:
        """Closes the bar (if open)."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> ReportProgress:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
