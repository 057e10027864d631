"""SIGTERM asks the loop to stop at the next step boundary (after which the run checkpoints)."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from deqjax._src import checks
from deqjax._src.training.actions.action import Action, due
from deqjax._src.training.train_loop import StepMetrics

PyTree = Any


class StopOnSigterm(Action):
    """Stops the loop after the step during which a SIGTERM arrived.

    A context manager: it installs its handler on entry (main thread only; elsewhere nothing is
    installed) and puts the previous one back on exit. In a multi-host run the processes agree
    to stop at the same step: each is asked every ``every_steps`` steps whether any process got
    the signal (a collective, so give every process the same schedule). Put it after the
    checkpointing action: :meth:`end` says the run stopped once the final checkpoint is saved.

    Args:
      every_steps: steps between the processes' agreement (multi-host runs only).
      desc: the run's label in messages.
      say: where the stop is said (None: silent).
    """

    def __init__(
        self,
        *,
        every_steps: int = 1,
        desc: str = "train",
        say: Callable[[str], None] | None = None,
    ):
        self._every = checks.check_positive_int(every_steps, "every_steps")
        self._desc, self._say = desc, say
        self._signalled = False  # set by the handler
        self._stop = False  # what the processes agreed on
        self._previous: Any = None
        self._installed = False

    def _handle(self, signum: int, frame: Any) -> None:
        self._signalled = True

    def __enter__(self) -> StopOnSigterm:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._handle)
            self._installed = True
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._installed:
            signal.signal(signal.SIGTERM, self._previous)
            self._installed = False

    def __call__(self, step: int, state: PyTree, metrics: StepMetrics, batch: PyTree) -> None:
        if jax.process_count() == 1:
            self._stop = self._signalled
        elif due(step, self._every):
            from jax.experimental import multihost_utils

            flags = multihost_utils.process_allgather(np.asarray(self._signalled, np.int32))
            self._stop = bool(np.any(flags))

    def stop_requested(self) -> bool:
        return self._stop

    def end(self, step: int, state: PyTree, stopped: bool) -> None:
        if self._stop and self._say is not None:
            self._say(f"[{self._desc}] SIGTERM: saved checkpoint at step {step}, stopping")
