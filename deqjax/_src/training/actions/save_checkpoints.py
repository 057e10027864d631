"""The run's checkpoints saved by their own policies, at the end, and on preemption."""

from __future__ import annotations

from typing import Any

from deqjax._src.training.actions.action import Action
from deqjax._src.training.loop_context import LoopContext
from deqjax._src.training.step_metrics import StepMetrics

PyTree = Any


class SaveCheckpoints(Action):
    """Saves through ``ctx.checkpoints`` (a :class:`~deqjax.training.Checkpoints`) after each
    step its policies ask for (``should_save``: every N steps, every T minutes, a preemption),
    and at the end of the run, also when it stopped early; stops the loop when a preemption is
    requested. :func:`~deqjax.training.fit` adds it last, after the caller's actions (a state
    that an action refuses, e.g. :class:`~deqjax.training.GuardNonFinite`, is never saved).

    Raises:
      ValueError: at :meth:`start`, a context without checkpoints.
    """

    def __init__(self):
        super().__init__(every_steps=1, at_end=True)

    def start(self, ctx: LoopContext) -> None:
        if ctx.checkpoints is None:
            raise ValueError("SaveCheckpoints needs the run's checkpoints (LoopContext).")

    def run(self, step: int, state: PyTree, metrics: StepMetrics, batch: PyTree) -> None:
        if self.ctx.checkpoints.should_save(step):
            self.ctx.checkpoints.save(step, state, self.ctx.data, force=True)

    def stop_requested(self) -> bool:
        return bool(self.ctx.checkpoints.preemption_requested)

    def end(self, step: int, state: PyTree, stopped: bool) -> None:
        self.ctx.checkpoints.save(step, state, self.ctx.data, force=True)  # once per step
        if stopped:
            self.ctx.tell(f"saved checkpoint at step {step}, stopping")
