"""When a periodic action of the training loop runs: every N steps, every T seconds, on given
steps, and once at the end.

Modelled on ``clu.periodic_actions.PeriodicAction`` (``every_steps``, ``every_secs``,
``on_steps``): the loop, not the action, asks :meth:`Schedule.due` after each step, and calls the
action's ``end`` once after the last step when ``at_end`` is set.
"""

from __future__ import annotations

import dataclasses
import math

from deqjax._src import checks


@dataclasses.dataclass(frozen=True)
class Schedule:
    """The steps after which an action runs (any rule that holds makes it due).

    Attributes:
      every_steps: after each step that is a multiple of this (None: no such rule).
      every_seconds: after the first step at least this long (wall clock) since the action last
        ran, or since the loop started (None: no such rule).
      at_steps: after exactly these steps.
      at_end: also once after the last step, whether or not the run stopped early.

    Raises:
      ValueError: naming the field: ``every_steps`` or a step of ``at_steps`` not an int >= 1,
        ``every_seconds`` not a finite number > 0.

    Example:
      >>> Schedule(every_steps=100, at_end=True).due(200, now=0.0, last_run=0.0)
      True
    """

    every_steps: int | None = None
    every_seconds: float | None = None
    at_steps: tuple[int, ...] = ()
    at_end: bool = False

    def __post_init__(self) -> None:
        checks.check_int(self.every_steps, "every_steps", allow_none=True)
        seconds = checks.check_real(self.every_seconds, "every_seconds", allow_none=True)
        if seconds is not None and not (seconds > 0 and math.isfinite(seconds)):
            raise ValueError(f"every_seconds must be a finite number > 0, got {seconds!r}.")
        steps = tuple(self.at_steps)
        for step in steps:
            checks.check_int(step, "at_steps (each step)")
        object.__setattr__(self, "at_steps", tuple(sorted(set(int(s) for s in steps))))
        if not isinstance(self.at_end, bool):
            raise ValueError(f"at_end must be a bool, got {self.at_end!r}.")

    def due(self, step: int, now: float, last_run: float) -> bool:
        """Whether the action runs after ``step`` (just taken), at wall-clock time ``now``, having
        last run (or the loop having started) at ``last_run`` (both ``time.monotonic()``)."""
        return (
            (self.every_steps is not None and step % self.every_steps == 0)
            or (self.every_seconds is not None and now - last_run >= self.every_seconds)
            or step in self.at_steps
        )

    def also_at(self, *steps: int) -> Schedule:
        """This schedule, also due after ``steps`` (e.g. a run's last step)."""
        return dataclasses.replace(self, at_steps=(*self.at_steps, *steps))

    @property
    def periodic(self) -> bool:
        """True if a rule makes the action due after some steps (``at_end`` aside)."""
        return bool(self.every_steps or self.every_seconds or self.at_steps)
