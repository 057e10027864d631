"""The train record: the step's metrics fetched to the host every ``every_steps`` steps."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from deqjax._src import checks
from deqjax._src.training.actions.action import Action, due, epoch_fields
from deqjax._src.training.train_loop import Record, StepMetrics

PyTree = Any


class LogMetrics(Action):
    """Every ``every_steps`` steps and at the last step, the record ``{"split": "train", "step",
    "epoch" (when the data has epochs), the metrics, "examples_per_sec"}``.

    Fetching the metrics (``metrics.host()``) is the loop's only host sync; the other actions that
    read them on the same steps (:class:`~deqjax.training.GuardNonFinite`,
    :class:`~deqjax.training.ReportProgress`) reuse the fetch. ``examples_per_sec`` is measured
    since the previous record (the first one includes the compilation).

    Args:
      every_steps: steps between records.
      num_steps: the run's last step (always recorded).
      data: the training :class:`~deqjax.data.BatchIterator`, for ``epoch`` and ``batch_size``
        (None: neither; ``examples_per_sec`` is nan).
    """

    def __init__(self, *, every_steps: int, num_steps: int, data: Any = None):
        self._every = checks.check_positive_int(every_steps, "every_steps")
        self._last = num_steps
        self._data = data
        self._window = (time.perf_counter(), 0)

    def start(self, step: int, state: PyTree) -> None:
        self._window = (time.perf_counter(), step)

    def __call__(
        self, step: int, state: PyTree, metrics: StepMetrics, batch: PyTree
    ) -> Record | None:
        if not due(step, self._every, self._last):
            return None
        host = metrics.host()
        now, (then, start) = time.perf_counter(), self._window
        rate = (step - start) * (getattr(self._data, "batch_size", None) or np.nan)
        rate /= max(now - then, 1e-9)
        self._window = (now, step)
        record = {"split": "train", "step": step, **epoch_fields(step, self._data), **host}
        return {**record, "examples_per_sec": rate}
