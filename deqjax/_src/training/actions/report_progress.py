"""A progress bar over the steps, showing the latest metrics read on the host."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax

from deqjax._src import checks
from deqjax._src.training.actions.action import Action
from deqjax._src.training.loop_context import LoopContext
from deqjax._src.training.metrics import format_metrics, progress_bar
from deqjax._src.training.step_metrics import StepMetrics

PyTree = Any


class ReportProgress(Action):
    """A tqdm bar over the steps (process 0 only; ``ctx.desc`` its label), moved to the step
    every ``every_steps`` steps; its postfix shows ``keys`` of the latest metrics another action
    read on the host (e.g. :class:`~deqjax.training.LogMetrics`: it reads none itself, so it
    adds no host sync). Put it after the actions that read the metrics. :meth:`close` closes
    the bar.

    Args:
      every_steps: steps between moves of the bar.
      keys: the metrics shown.

    Raises:
      ValueError: ``every_steps`` not an int >= 1.
    """

    def __init__(self, *, every_steps: int = 1, keys: Sequence[str] = ("loss", "accuracy")):
        every_steps = checks.check_positive_int(every_steps, "every_steps")
        super().__init__(every_steps=every_steps, at_end=True)  # the bar ends on the last step
        self._keys = tuple(keys)
        self._bar = None

    def start(self, ctx: LoopContext) -> None:
        self.close()
        self._bar = progress_bar(
            total=ctx.num_steps,
            initial=ctx.start_step,
            enabled=jax.process_index() == 0,
            desc=ctx.desc,
        )

    def run(self, step: int, state: PyTree, metrics: StepMetrics, batch: PyTree) -> None:
        self._bar.update(step - self._bar.n)
        if metrics.fetched:
            self._bar.set_postfix_str(format_metrics(metrics.host(), keys=self._keys))

    def close(self) -> None:
        """Closes the bar (if open)."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None
