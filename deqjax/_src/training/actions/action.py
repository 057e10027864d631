"""What a periodic action of :func:`~deqjax.training.train_loop` is.

Modelled on ``clu.periodic_actions.PeriodicAction``: the base class owns the schedule
(:class:`~deqjax.training.Schedule`) and its bookkeeping; the loop asks the schedule after each
step and calls :meth:`Action.run` when it is due, so a subclass writes only what it does. A new
action is one file::

    class EvaluateEverySeconds(Action):
        def __init__(self, evaluate, seconds):
            super().__init__(every_seconds=seconds, at_end=True)
            self._evaluate = evaluate

        def run(self, step, state, metrics, batch):
            return {"split": "eval", "step": step, **self._evaluate(state.params)}
"""

from __future__ import annotations

from typing import Any

from deqjax._src.training.loop_context import LoopContext
from deqjax._src.training.schedule import Schedule
from deqjax._src.training.step_metrics import Record, StepMetrics

PyTree = Any


class Action:
    """One thing :func:`~deqjax.training.train_loop` does after the steps its schedule names.

    Subclass it and override what the action needs; each hook's default does nothing (``end``'s
    runs the action once more at the end). The hooks, in the order the loop calls them:

    1. :meth:`start` once before the first step, with the run's :class:`LoopContext`;
    2. after each step, :meth:`run` when ``schedule.due(...)``, then :meth:`stop_requested`;
    3. :meth:`end` once after the last step when ``schedule.at_end``;
    4. :meth:`close` always (also after an error), in reverse order of the actions.

    Args:
      schedule: when :meth:`run` is called (default: never); or its shorthand:
      every_steps, every_seconds, at_steps, at_end: the fields of a :class:`Schedule`.

    Attributes:
      schedule: when the loop calls :meth:`run`.
      ctx: the run's :class:`LoopContext`, set by the loop before :meth:`start`.
      last_run: the ``time.monotonic()`` of the last :meth:`run` (or of the loop's start), kept
        by the loop for ``every_seconds``.
      last_step: the step of the last :meth:`run` (None: not yet in this loop).

    Raises:
      ValueError: both ``schedule`` and its shorthand given, or a field invalid (see
        :class:`Schedule`).
    """

    schedule: Schedule = Schedule()
    ctx: LoopContext = LoopContext()
    last_run: float = 0.0
    last_step: int | None = None

    def __init__(
        self,
        schedule: Schedule | None = None,
        *,
        every_steps: int | None = None,
        every_seconds: float | None = None,
        at_steps: tuple[int, ...] = (),
        at_end: bool = False,
    ):
        shorthand = Schedule(every_steps, every_seconds, tuple(at_steps), at_end)
        if schedule is not None and shorthand != Schedule():
            raise ValueError("pass schedule or its shorthand (every_steps=, ...), not both.")
        self.schedule = schedule if schedule is not None else shorthand

    def start(self, ctx: LoopContext) -> None:
        """Before the first step (``ctx`` is also ``self.ctx``): e.g. compile a program in the
        background, or adjust the schedule to the run (its last step, its epochs)."""

    def run(self, step: int, state: PyTree, metrics: StepMetrics, batch: PyTree) -> Record | None:
        """After step ``step`` (the first is 1) when the schedule is due: its new ``state``, its
        ``metrics`` (on the device until ``metrics.host()``) and the placed ``batch`` (None at
        the end). Returns a record (a flat dict with ``"split"`` and ``"step"``) or None."""
        return None

    def stop_requested(self) -> bool:
        """Asked after each step's actions: True ends the loop there (``stopped``)."""
        return False

    def end(self, step: int, state: PyTree, stopped: bool) -> Record | None:
        """After the last step when ``schedule.at_end`` (``stopped``: the loop ended early):
        :meth:`run` with that step's metrics, unless it just ran on that step."""
        if self.last_step == step or self.ctx.last_metrics is None:
            return None
        return self.run(step, state, self.ctx.last_metrics, None)

    def close(self) -> None:
        """Always after the loop (also after an error): release what :meth:`start` took."""


def epoch_fields(step: int, data: Any) -> dict[str, float]:
    """``{"epoch": step / steps_per_epoch}`` for a record, or ``{}`` when ``data`` (a
    :class:`~deqjax.data.Batches`) is an endless stream or absent."""
    if data is None or data.steps_per_epoch is None:
        return {}
    return {"epoch": step / data.steps_per_epoch}
