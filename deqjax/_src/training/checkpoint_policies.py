"""When a checkpoint is due: every N steps, every T minutes, and on preemption (SIGTERM).

The policies of :class:`~deqjax.training.Checkpoints`, as MaxText and Levanter combine them over
orbax's ``CheckpointManager``: a step interval, a wall-clock interval (a cluster's preemption
takes the work since the last save, whatever the step rate) and a save when the scheduler sends
SIGTERM before it kills the job. In a run of several processes every process must decide the same
way: the step rule does by itself, the clock and the signal are agreed on at each decision (the
clock of process 0, the signal of any process; one small all-gather, so every process asks at
every step).
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from deqjax._src import checks


class SavePolicy:
    """Whether step ``s`` is due for a checkpoint, and the SIGTERM handler that asks for one.

    Args:
      every_steps: save when the step is a multiple of this (None: no step rule).
      every_minutes: save when this long (wall clock) has passed since the last save, or since
        :meth:`restart` (None: no clock rule).
      on_preemption: install a SIGTERM handler (:meth:`install`) that asks for a save at the next
        decision; :attr:`preemption_requested` then tells the loop to stop after it (setting it
        asks the same, with or without the handler).
      clock: seconds, monotonic (a test's fake clock).

    Raises:
      ValueError: ``every_steps`` not a positive int, ``every_minutes`` not positive.
    """

    def __init__(
        self,
        *,
        every_steps: int | None = None,
        every_minutes: float | None = None,
        on_preemption: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ):
        if every_steps is not None:
            checks.check_positive_int(every_steps, "every_steps")
        checks.check_real(every_minutes, "every_minutes", allow_none=True)
        if every_minutes is not None and not every_minutes > 0:
            raise ValueError(f"every_minutes must be > 0, got {every_minutes}.")
        self.every_steps = every_steps
        self.every_minutes = every_minutes
        self.on_preemption = checks.check_bool(on_preemption, "on_preemption")
        self._clock = clock
        self._last_save = clock()
        self._signalled = False  # set by the handler, in this process
        self._agreed = False  # the processes' agreement at the last decision
        self._decision: tuple[int, bool] | None = None
        self._previous: Any = None
        self._installed = False

    @property
    def preemption_requested(self) -> bool:
        """A SIGTERM arrived (in a run of several processes: at any process, as agreed at the
        last :meth:`due`)."""
        return self._signalled if jax.process_count() == 1 else self._agreed

    @preemption_requested.setter
    def preemption_requested(self, value: bool) -> None:
        # As the handler does (e.g. on a cluster's own preemption notice): agreed at the next
        # decision. False withdraws a request not yet agreed on.
        self._signalled = bool(value)
        self._agreed = self._agreed and bool(value)

    def install(self) -> None:
        """Installs the SIGTERM handler (with ``on_preemption``, main thread only; elsewhere
        nothing is installed). A handler installed before it is still called after it."""
        if not self.on_preemption or self._installed:
            return
        if threading.current_thread() is not threading.main_thread():
            return
        self._previous = signal.signal(signal.SIGTERM, self._handle)
        self._installed = True

    def uninstall(self) -> None:
        """Puts the previous handler back (unless another one was installed after this one)."""
        if self._installed and signal.getsignal(signal.SIGTERM) == self._handle:
            signal.signal(signal.SIGTERM, self._previous)
        self._installed = False

    def _handle(self, signum: int, frame: Any) -> None:
        self._signalled = True
        if callable(self._previous):
            self._previous(signum, frame)

    def due(self, step: int) -> bool:
        """Whether ``step`` is due by any rule (the same answer for the same step)."""
        step = int(step)
        if self._decision is not None and self._decision[0] == step:
            return self._decision[1]
        by_steps = self.every_steps is not None and step >= 1 and step % self.every_steps == 0
        by_clock = (
            self.every_minutes is not None
            and self._clock() - self._last_save >= 60.0 * self.every_minutes
        )
        preempted = self._signalled  # by the handler (on_preemption) or set by the caller
        if jax.process_count() > 1 and (self.every_minutes is not None or self.on_preemption):
            by_clock, preempted = _agree(by_clock, preempted)
        self._agreed = preempted
        self._decision = (step, by_steps or by_clock or preempted)
        return self._decision[1]

    def saved(self) -> None:
        """A save started now: the clock rule counts from here."""
        self._last_save = self._clock()

    restart = saved  # the run (re)starts now: the clock rule counts from here


def _agree(by_clock: bool, preempted: bool) -> tuple[bool, bool]:
    """Process 0's clock decision and whether any process was signalled, on every process."""
    from jax.experimental import multihost_utils

    flags = np.asarray([by_clock, preempted], np.int32)
    gathered = np.asarray(multihost_utils.process_allgather(flags)).reshape(-1, 2)
    return bool(gathered[0, 0]), bool(np.any(gathered[:, 1]))
