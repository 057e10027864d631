"""A profiler trace of a window of steps, written into the run folder."""

from __future__ import annotations

import os
from typing import Any

import jax

from deqjax._src import checks
from deqjax._src.training.actions.action import Action
from deqjax._src.training.loop_context import LoopContext
from deqjax._src.training.step_metrics import StepMetrics

PyTree = Any


class ProfileSteps(Action):
    """Traces steps ``first`` to ``last`` with ``jax.profiler`` into ``<run_dir>/profile``
    (TensorBoard's profile plugin or Perfetto read it); each step of the loop is annotated
    (``jax.profiler.StepTraceAnnotation``), so the trace shows them one by one.

    The trace starts before step ``first`` (after step ``first - 1``, or at the start of a run
    that begins inside the window) and stops after step ``last``, or at the end of a run that
    stops earlier, or at :meth:`close` after an error.

    Args:
      first: the first step traced (the first step of a run is 1).
      last: the last step traced, ``>= first``.
      perfetto: also write a Perfetto trace (``perfetto_trace.json.gz``).

    Raises:
      ValueError: ``first`` or ``last`` not an int >= 1, or ``last < first``; at :meth:`start`,
        a run without a folder (``ctx.run_dir``).
    """

    def __init__(self, first: int, last: int, *, perfetto: bool = False):
        first = checks.check_positive_int(first, "first")
        last = checks.check_positive_int(last, "last")
        if last < first:
            raise ValueError(f"last ({last}) must be >= first ({first}).")
        before = (first - 1,) if first > 1 else ()
        super().__init__(at_steps=(*before, last), at_end=True)
        self.first, self.last, self._perfetto = first, last, bool(perfetto)
        self._tracing = False

    def start(self, ctx: LoopContext) -> None:
        if ctx.run_dir is None:
            raise ValueError("ProfileSteps needs a run folder (fit's run_dir) for its trace.")
        if self.first - 1 <= ctx.start_step < self.last:
            self._start_trace()

    def _start_trace(self) -> None:
        folder = os.path.join(self.ctx.run_dir, "profile")
        jax.profiler.start_trace(folder, create_perfetto_trace=self._perfetto)
        self._tracing = True
        self.ctx.tell(f"profiling steps {self.first} to {self.last} into {folder}")

    def run(self, step: int, state: PyTree, metrics: StepMetrics, batch: PyTree) -> None:
        if step == self.first - 1 and not self._tracing:
            self._start_trace()
        elif step >= self.last:
            jax.block_until_ready(state)  # the traced steps' work, not only its dispatch
            self.close()

    def end(self, step: int, state: PyTree, stopped: bool) -> None:
        if self._tracing:  # a run that ended inside the window
            jax.block_until_ready(state)
            self.close()

    def close(self) -> None:
        """Stops the trace (if running), writing it."""
        if self._tracing:
            self._tracing = False
            jax.profiler.stop_trace()
