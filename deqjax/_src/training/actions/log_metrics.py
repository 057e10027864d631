"""The train record: the step's metrics fetched to the host on a schedule and at the last step."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from deqjax._src.training.actions.action import Action, epoch_fields
from deqjax._src.training.loop_context import LoopContext
from deqjax._src.training.step_metrics import Record, StepMetrics

PyTree = Any


class LogMetrics(Action):
    """Every ``every_steps`` steps (or ``every_seconds``) and at the run's last step
    (``ctx.num_steps``), the record ``{"split": "train", "step", "epoch" (when the data has
    epochs), the metrics, "examples_per_sec"}``.

    Fetching the metrics (``metrics.host()``) is the loop's only host sync; the actions that
    read them on the same steps (:class:`~deqjax.training.GuardNonFinite`,
    :class:`~deqjax.training.ReportProgress`) reuse the fetch. ``examples_per_sec`` is measured
    since the previous record (the first one includes the compilation; nan when the data is not
    a :class:`~deqjax.data.Batches`).

    Args:
      every_steps: steps between records.
      every_seconds: instead, or as well, seconds between records.

    Raises:
      ValueError: a schedule field invalid (see :class:`~deqjax.training.Schedule`).
    """

    def __init__(self, every_steps: int | None = 100, *, every_seconds: float | None = None):
        super().__init__(every_steps=every_steps, every_seconds=every_seconds)
        self._asked = self.schedule  # start adds each run's last step to it
        self._window = (time.perf_counter(), 0)

    def start(self, ctx: LoopContext) -> None:
        self.schedule = self._asked.also_at(ctx.num_steps)
        self._window = (time.perf_counter(), ctx.start_step)

    def run(self, step: int, state: PyTree, metrics: StepMetrics, batch: PyTree) -> Record:
        host = metrics.host()
        now, (then, start) = time.perf_counter(), self._window
        data = self.ctx.data
        rate = (step - start) * (data.batch_size if data is not None else np.nan)
        rate /= max(now - then, 1e-9)
        self._window = (now, step)
        record = {"split": "train", "step": step, **epoch_fields(step, data), **host}
        return {**record, "examples_per_sec": rate}
