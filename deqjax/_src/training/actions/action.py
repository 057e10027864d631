"""What a periodic action of :func:`~deqjax.training.train_loop` is, and the schedule it keeps.

Modelled on Flax's ``clu.periodic_actions``: an action is called after every step and decides by
its own schedule (``every_steps``) whether to act.
"""

from __future__ import annotations

from typing import Any

from deqjax._src.training.train_loop import Record, StepMetrics

PyTree = Any


class Action:
    """One thing :func:`~deqjax.training.train_loop` does after some steps.

    Subclass it and override what the action needs; each method's default does nothing. Any
    callable ``(step, state, metrics, batch) -> record or None`` is an action too (the hooks are
    looked up by name).
    """

    def start(self, step: int, state: PyTree) -> None:
        """Before the first step: ``step`` is the steps already taken, ``state`` the placed state
        (e.g. compile a program in the background)."""

    def __call__(
        self, step: int, state: PyTree, metrics: StepMetrics, batch: PyTree
    ) -> Record | None:
        """After step ``step`` (the first is 1): its new ``state``, its ``metrics`` (on the device
        until ``metrics.host()``) and the placed ``batch``. Returns a record or None."""
        return None

    def stop_requested(self) -> bool:
        """Asked after each step's actions: True ends the loop there (``stopped``)."""
        return False

    def end(self, step: int, state: PyTree, stopped: bool) -> Record | None:
        """After the last step (``stopped``: an action asked to stop early). Returns a record or
        None."""
        return None


def due(step: int, every_steps: int | None, last_step: int | None = None) -> bool:
    """Whether ``step`` is a multiple of ``every_steps`` (None: never) or is ``last_step``."""
    return (every_steps is not None and step % every_steps == 0) or step == last_step


def epoch_fields(step: int, data: Any) -> dict[str, float]:
    """``{"epoch": step / steps_per_epoch}`` for a record, or ``{}`` when ``data`` (a
    :class:`~deqjax.data.BatchIterator`) has no ``steps_per_epoch``."""
    steps_per_epoch = getattr(data, "steps_per_epoch", None)
    return {} if steps_per_epoch is None else {"epoch": step / steps_per_epoch}
