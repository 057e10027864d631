"""A run's checkpoints behind the interface :func:`~deqjax.training.fit` saves through: restored
(or an earlier run's claimed) at the start, saved by policy and at the end, never with a
non-finite state.

A thin adapter over today's synchronous :class:`~deqjax.training.Checkpointer` with the
interface of the orbax ``CheckpointManager``-based ``Checkpoints`` of issue 42 (which replaces it
by one import): :meth:`Checkpoints.restore_or_claim`, :meth:`~Checkpoints.should_save`,
:meth:`~Checkpoints.save`, :meth:`~Checkpoints.wait`, :meth:`~Checkpoints.last_checkpoint`,
:meth:`~Checkpoints.close` and :attr:`~Checkpoints.preemption_requested`. Here every save is
synchronous (``asynchronous`` is accepted and ignored) and a SIGTERM is caught by
:class:`~deqjax.training.StopOnSigterm`, after which ``fit`` saves at the end.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable, Mapping
from typing import Any

import jax

from deqjax._src import checks
from deqjax._src.data.batching import Batches, state_dict
from deqjax._src.training.checkpoint import Checkpointer, RestoreError, all_finite
from deqjax._src.training.data_parallel import STATE_KINDS, DataParallel
from deqjax._src.training.metrics import to_python
from deqjax._src.training.nonfinite import NonFiniteError
from deqjax._src.training.run_policy import RunPolicy
from deqjax._src.training.train_state import TrainState

PyTree = Any


class Checkpoints:
    """The checkpoints of one run under ``directory``: the state as the data parallelism saves it
    (:meth:`~deqjax._src.training.data_parallel.DataParallel.saveable`) and, as metadata, the
    data's position and the run's ``config``.

    Args:
      directory: the folder of the checkpoints (created if missing).
      every_steps: save after each multiple of this step (None: no such policy).
      every_minutes: save after the first step at least this long since the last save.
      on_preemption: save when a preemption is requested (here: never requested).
      keep: how many checkpoints to keep (the newest).
      config: JSON-able run configuration stored in every checkpoint's metadata.
      asynchronous: accepted for the interface; every save here is synchronous.

    Raises:
      ValueError: a policy or ``keep`` that is not a positive number.
    """

    def __init__(
        self,
        directory: str | os.PathLike,
        *,
        every_steps: int | None = None,
        every_minutes: float | None = None,
        on_preemption: bool = True,
        keep: int = 3,
        config: Mapping[str, Any] | None = None,
        asynchronous: bool = True,
    ):
        self._every_steps = checks.check_int(every_steps, "every_steps", allow_none=True)
        minutes = checks.check_real(every_minutes, "every_minutes", allow_none=True)
        if minutes is not None and not minutes > 0:
            raise ValueError(f"every_minutes must be > 0, got {minutes!r}.")
        self._every_seconds = None if minutes is None else 60.0 * minutes
        self._ckpt = Checkpointer(directory, max_to_keep=checks.check_positive_int(keep, "keep"))
        self.directory = self._ckpt.directory
        self._config = to_python(dict(config or {}))
        self._parallel: DataParallel | None = None
        self._last_save = time.monotonic()
        self.preemption_requested = False

    def restore_or_claim(
        self,
        state: TrainState,
        data: Batches,
        policy: RunPolicy,
        parallel: DataParallel,
        say: Callable[[str], None] | None = None,
    ) -> tuple[TrainState, int | None]:
        """``(state, restored step)`` by the :class:`~deqjax._src.training.run_policy.RunPolicy`:
        resumed, the newest good checkpoint (``data`` moved to its position); fresh, ``state``
        as given once no earlier run's checkpoints remain.

        Args:
          state: the fresh host state (the template of a restore; its carry one per local
            device).
          data: the training batches (moved to the restored position).
          policy: the run's ``resume`` and ``overwrite``.
          parallel: how the steps run over the devices (the state's placement).
          say: where the "resumed from" line goes (None: silent).

        Raises:
          FileExistsError: a fresh run finds checkpoints and ``overwrite`` is not set.
          RestoreError: ``resume`` and no checkpoint restores (nothing is renamed or deleted).
        """
        ckpt, self._parallel = self._ckpt, parallel
        if not policy.resume:
            steps = ckpt.all_steps()
            refuse = lambda: FileExistsError(  # noqa: E731
                f"{ckpt.directory} holds checkpoints of an earlier run (steps {steps}); resume "
                f"it, or pass overwrite=True (--overwrite) to delete them."
            )
            doomed = policy.to_delete(steps, refuse)
            if doomed and jax.process_index() == 0:
                for s in doomed:
                    shutil.rmtree(ckpt.path(s))
            ckpt.all_steps()  # reload the listing
            return state, None
        refuse = lambda: RestoreError(  # noqa: E731
            f"resume: {ckpt.directory} holds no checkpoint to resume from (nothing was changed); "
            f"start a fresh run instead."
        )
        template = parallel.saveable(parallel.put(state, STATE_KINDS), STATE_KINDS)
        restored = policy.resume_from(ckpt.restore(template=template), refuse)
        data.restore(restored.meta["data"])
        if say is not None:
            say(f"resumed from {ckpt.path(restored.step)} (step {restored.step})")
        # Host values (pmap) or global arrays already laid out (sharded): put places the first.
        return TrainState(*restored.state), restored.step

    def should_save(self, step: int) -> bool:
        """Whether a policy asks for a checkpoint after ``step``."""
        return (
            (self._every_steps is not None and step % self._every_steps == 0)
            or (
                self._every_seconds is not None
                and time.monotonic() - self._last_save >= self._every_seconds
            )
            or self.preemption_requested
        )

    def save(self, step: int, state: TrainState, data: Batches, *, force: bool = False) -> bool:
        """Checkpoints the placed ``state`` at ``step`` with ``data``'s position (when a policy
        asks, or ``force``); returns whether it saved (a step already saved is not again).

        Raises:
          NonFiniteError: the state holds a non-finite value (it is never checkpointed).
          RuntimeError: before :meth:`restore_or_claim` (the state's placement is unknown).
        """
        if not (force or self.should_save(step)) or step in self._ckpt.all_steps():
            return False
        if self._parallel is None:
            raise RuntimeError("Checkpoints.save before restore_or_claim.")
        saved = self._parallel.saveable(state, STATE_KINDS)
        if not all_finite(saved):
            raise NonFiniteError(
                f"step {step}: the training state holds non-finite values (an update "
                f"overflowed); not checkpointed. Last finite checkpoint: "
                f"{self.last_checkpoint()}. Lower the learning rate or clip the gradients."
            )
        self._ckpt.save(step, saved, {"data": state_dict(data.state), "config": self._config})
        self._last_save = time.monotonic()
        return True

    def wait(self) -> None:
        """Returns once the pending save is finished (at once: every save is synchronous)."""

    def last_checkpoint(self) -> str:
        """The folder of the newest checkpoint on disk, or ``"none"``."""
        steps = self._ckpt.all_steps()
        return self._ckpt.path(steps[-1]) if steps else "none"

    def close(self) -> None:
        """Waits for the pending save, then releases the checkpoint manager."""
        self.wait()
        self._ckpt.close()
