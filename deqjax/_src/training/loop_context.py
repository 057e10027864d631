"""What the training loop hands each action before the first step: the run it is part of."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from deqjax._src.training.step_metrics import StepMetrics

if TYPE_CHECKING:
    from deqjax._src.data.batching import Batches
    from deqjax._src.training.data_parallel import DataParallel


@dataclasses.dataclass(frozen=True)
class LoopContext:
    """The run an action takes part in, given to its ``start`` (keep what you need).

    Built by :func:`~deqjax.training.fit`; :func:`~deqjax.training.train_loop` sets
    ``num_steps``, ``start_step`` and ``state_shapes`` from its own arguments.

    Attributes:
      parallel: how the steps run over the devices (None: a loop of one's own without one).
      data: the training batches (a :class:`~deqjax.data.Batches`; None: not one).
      num_steps: the step count at which the loop ends.
      start_step: the steps already taken when the loop starts (a resumed run's restored step).
      state_shapes: the state's shapes before the first step (``jax.ShapeDtypeStruct`` leaves,
        with their shardings), e.g. to compile a program in the background.
      run_dir: the run folder for an action's files (e.g. a profiler trace; None: no files).
      checkpoints: the run's checkpoints (a :class:`~deqjax.training.Checkpoints`), or None.
      say: process 0's printer (None: silent).
      desc: the run's label in messages.
    """

    parallel: DataParallel | None = None
    data: Batches | None = None
    num_steps: int = 0
    start_step: int = 0
    state_shapes: Any = None
    run_dir: str | None = None
    checkpoints: Any = None
    say: Callable[[str], None] | None = None
    desc: str = "train"
    # the latest step's metrics, set by the loop after each step (see last_metrics)
    _latest: list = dataclasses.field(
        default_factory=lambda: [None], init=False, repr=False, compare=False
    )

    @property
    def last_metrics(self) -> StepMetrics | None:
        """The metrics of the latest step taken (None before the first)."""
        return self._latest[0]

    def tell(self, line: str) -> None:
        """Says ``"[desc] line"`` through :attr:`say` (nothing when silent)."""
        if self.say is not None:
            self.say(f"[{self.desc}] {line}")
