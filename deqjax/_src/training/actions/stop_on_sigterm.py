"""SIGTERM asks the loop to stop at the next step boundary (after which the run checkpoints)."""

from __future__ import annotations

import signal
import threading
from typing import Any

import jax
import numpy as np

from deqjax._src import checks
from deqjax._src.training.actions.action import Action
from deqjax._src.training.loop_context import LoopContext
from deqjax._src.training.step_metrics import StepMetrics

PyTree = Any


class StopOnSigterm(Action):
    """Stops the loop after the step during which a SIGTERM arrived (checked every
    ``every_steps`` steps).

    :meth:`start` installs its handler (main thread only; elsewhere nothing is installed) and
    :meth:`close` puts the previous one back. In a multi-host run the processes agree to stop at
    the same step: each is asked every ``every_steps`` steps whether any process got the signal
    (a collective, so give every process the same schedule). :func:`~deqjax.training.fit` saves
    a checkpoint at the step it stopped at.

    Args:
      every_steps: steps between checks (between the processes' agreements, multi-host).

    Raises:
      ValueError: ``every_steps`` not an int >= 1.
    """

    def __init__(self, *, every_steps: int = 1):
        every_steps = checks.check_positive_int(every_steps, "every_steps")
        super().__init__(every_steps=every_steps, at_end=True)
        self._signalled = False  # set by the handler
        self._stop = False  # what the processes agreed on
        self._previous: Any = None
        self._installed = False

    def _handle(self, signum: int, frame: Any) -> None:
        self._signalled = True

    def start(self, ctx: LoopContext) -> None:
        self.close()
        self._signalled = self._stop = False
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._handle)
            self._installed = True

    def run(self, step: int, state: PyTree, metrics: StepMetrics, batch: PyTree) -> None:
        if jax.process_count() == 1:
            self._stop = self._signalled
        else:
            from jax.experimental import multihost_utils

            flags = multihost_utils.process_allgather(np.asarray(self._signalled, np.int32))
            self._stop = bool(np.any(flags))

    def stop_requested(self) -> bool:
        return self._stop

    def end(self, step: int, state: PyTree, stopped: bool) -> None:
        if self._stop:
            self.ctx.tell(f"SIGTERM: stopping at step {step}")

    def close(self) -> None:
        """Puts the previous SIGTERM handler back (if this one is installed)."""
        if self._installed:
            signal.signal(signal.SIGTERM, self._previous)
            self._installed = False
