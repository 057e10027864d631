"""The run's checkpoints: restored (or an earlier run's claimed) at the start, saved on a
schedule and at the end, never with a non-finite state."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Mapping
from typing import Any

import jax

from deqjax._src.data.batching import state_dict
from deqjax._src.training.actions.action import Action, due
from deqjax._src.training.checkpoint import Checkpointer, RestoreError, all_finite
from deqjax._src.training.data_parallel import STATE_KINDS, DataParallel
from deqjax._src.training.metrics import to_python
from deqjax._src.training.nonfinite import NonFiniteError
from deqjax._src.training.run_policy import RunPolicy
from deqjax._src.training.train_loop import StepMetrics
from deqjax._src.training.train_state import TrainState

PyTree = Any


class SaveCheckpoints(Action):
    """Checkpoints every ``every_steps`` steps and at the end of the run (also when stopped
    early, e.g. by SIGTERM).

    Each checkpoint holds the state as the data parallelism saves it
    (:meth:`~deqjax._src.training.data_parallel.DataParallel.saveable`: sharded, the global
    arrays, which orbax writes shard by shard and restores onto any number of devices; pmap, the
    first replica with every local device's carry) and, as metadata, the training data's
    position and the run's ``config``: what :meth:`restore_or_claim` reads back.

    Args:
      checkpointer: where the checkpoints go (its owner closes it).
      parallel: how the train step runs over the devices (the state's placement).
      train_data: the training :class:`~deqjax.data.BatchIterator` (its position is saved).
      every_steps: steps between checkpoints (None: only at the end).
      config: JSON-able run configuration stored in every checkpoint's metadata.
      desc: the run's label in messages.
    """

    def __init__(
        self,
        checkpointer: Checkpointer,
        *,
        parallel: DataParallel,
        train_data: Any,
        every_steps: int | None = None,
        config: Mapping[str, Any] | None = None,
        desc: str = "train",
    ):
        self._ckpt = checkpointer
        self._parallel = parallel
        self._data = train_data
        self._every = every_steps
        self._config = to_python(dict(config or {}))
        self._desc = desc

    def restore_or_claim(
        self, state: TrainState, policy: RunPolicy, say: Callable[[str], None] | None = None
    ) -> tuple[TrainState, int | None]:
        """``(state, restored step)`` by the :class:`~deqjax._src.training.run_policy.RunPolicy`:
        resumed, the newest good checkpoint (the training data moved to its position); fresh,
        ``state`` as given once no earlier run's checkpoints remain.

        Args:
          state: the fresh host state (the template of a restore).
          policy: the run's ``resume`` and ``overwrite``.
          say: where the "resumed from" line goes (None: silent).

        Raises:
          FileExistsError: a fresh run finds checkpoints and ``overwrite`` is not set.
          RestoreError: ``resume`` and no checkpoint restores (nothing is renamed or deleted).
        """
        ckpt = self._ckpt
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
        parallel = self._parallel
        template = parallel.saveable(parallel.put(state, STATE_KINDS), STATE_KINDS)
        restored = policy.resume_from(ckpt.restore(template=template), refuse)
        self._data.restore(restored.meta["data"])
        if say is not None:
            say(f"resumed from {ckpt.path(restored.step)} (step {restored.step})")
        # Host values (pmap) or global arrays already laid out (sharded): put places the first.
        return TrainState(*restored.state), restored.step

    def __call__(self, step: int, state: PyTree, metrics: StepMetrics, batch: PyTree) -> None:
        if due(step, self._every):
            self.save(step, state)

    def end(self, step: int, state: PyTree, stopped: bool) -> None:
        self.save(step, state)

    def last_checkpoint(self) -> str:
        """The folder of the newest checkpoint on disk, or ``"none"``."""
        steps = self._ckpt.all_steps()
        return self._ckpt.path(steps[-1]) if steps else "none"

    def save(self, step: int, state: TrainState) -> None:
        """Checkpoints the placed ``state`` at ``step`` with the data position.

        Raises:
          NonFiniteError: the state holds a non-finite value (it is never checkpointed).
        """
        saved = self._parallel.saveable(state, STATE_KINDS)
        if not all_finite(saved):
            raise NonFiniteError(
                f"[{self._desc}] step {step}: the training state holds non-finite values (an "
                f"update overflowed); not checkpointed. Last finite checkpoint: "
                f"{self.last_checkpoint()}. Lower the learning rate or clip the gradients."
            )
        meta = {"data": state_dict(self._data.state), "config": self._config}
        self._ckpt.save(step, saved, meta)
