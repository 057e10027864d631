"""A run's checkpoints through orbax's ``CheckpointManager``: saved asynchronously by policy,
the newest good one resumed, nothing guessed.

A checkpoint of step ``s`` is a folder ``<directory>/<s>/`` with three items: ``state`` (the
training state as :meth:`~deqjax._src.training.data_parallel.DataParallel.saveable` gives it:
global arrays, which orbax writes shard by shard from the processes that hold them and restores
onto the template's layout, or host values), ``data`` (the data iterator's position, JSON) and
``meta`` (the run's config and the state's layout), plus ``deqjax_manifest.json`` (size and
SHA-256 of every file of the items; :mod:`~deqjax._src.training.checkpoint_contents`).

**Asynchronous.** :meth:`Checkpoints.save` returns once the state is copied off the devices
(orbax's blocking part; the caller may then donate or overwrite its buffers); the files are
written by a background thread while training goes on. A save finishes before the next one
starts (``save`` waits for it first), before :meth:`Checkpoints.close` returns and before the
interpreter exits (a hook run before Python stops its thread pools closes an object its owner
did not). The manifest is written into the save's temporary folder after every process has
written its part and before orbax commits the folder (renames it into place), so a process
killed at any moment leaves either a committed, verifiable checkpoint or an uncommitted
temporary folder that is never listed (and is removed when the folder is opened again); older
checkpoints are deleted (keep-K) only after the new one has committed.

**Resume** (:mod:`~deqjax._src.training.checkpoint_restore`): the newest checkpoint that
verifies and fits the template; a corrupt newer one is renamed ``<s>.corrupt`` with a warning, an
incompatible one is left in place; if none restores, :class:`RestoreError` names each and nothing
is renamed.
"""

from __future__ import annotations

import atexit
import glob
import os
import shutil
import threading
from collections.abc import Callable, Mapping
from typing import Any

import jax

from deqjax._src.training.checkpoint_contents import (
    CheckpointError,
    RestoreError,
    all_finite,
    json_position,
    tree_layout,
    write_manifest,
)
from deqjax._src.training.checkpoint_policies import SavePolicy
from deqjax._src.training.checkpoint_restore import (
    Restored,
    host_template,
    restore_newest,
    sync_processes,
)
from deqjax._src.training.data_parallel import STATE_KINDS, DataParallel
from deqjax._src.training.metrics import to_python
from deqjax._src.training.nonfinite import NonFiniteError
from deqjax._src.training.run_policy import RunPolicy
from deqjax._src.training.train_state import TrainState

PyTree = Any
ITEMS = ("state", "data", "meta")


class Checkpoints:
    """A run's checkpoints under ``directory``: saved asynchronously by policy (steps, minutes,
    SIGTERM), the newest ``keep`` kept, the newest good one resumed (the module says how).

    In a run of several processes every process makes the same calls at the same steps (the
    decisions of :meth:`should_save` are agreed on), and ``directory`` is on a file system they
    share; process 0 writes the JSON items and the manifest, orbax writes each process's shards.

    Call :meth:`close` (or use ``with``) before the process ends; :func:`~deqjax.training.fit`
    does. Left open, a save still in flight is finished at exit on Python 3.11, but lost on 3.12
    and newer, where no thread may start at interpreter shutdown and orbax's commit starts one
    (the error is printed; the newest committed checkpoint stays the one resumed).

    Args:
      directory: folder of the checkpoints (created if missing).
      every_steps: save every this many steps (None: no step rule).
      every_minutes: save when this long has passed since the last save (None: no clock rule).
      on_preemption: a SIGTERM asks for a save at the next step and sets
        :attr:`preemption_requested` (the loop then stops); the handler is installed here (main
        thread only) and removed by :meth:`close`; one installed before it is still called.
      keep: keep the newest ``keep`` checkpoints (``>= 1``).
      config: JSON-able run configuration stored in every checkpoint.
      asynchronous: write in the background (False: :meth:`save` returns once committed).

    Raises:
      ValueError: naming a bad argument.

    Example:
      >>> ckpt = Checkpoints("runs/x/checkpoints", every_steps=500, every_minutes=30, keep=3)
      >>> state, step = ckpt.restore_or_claim(state, data, RunPolicy(resume=True), parallel)
      >>> # in the loop, after step s:  ckpt.save(s, state, data)  (saves when a policy says so)
      >>> ckpt.save(num_steps, state, data, force=True); ckpt.close()
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
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
            raise ValueError(f"keep must be an int >= 1, got {keep!r}.")
        if not isinstance(asynchronous, bool):
            raise ValueError(f"asynchronous must be a bool, got {asynchronous!r}.")
        self._policy = SavePolicy(
            every_steps=every_steps, every_minutes=every_minutes, on_preemption=on_preemption
        )
        self._config = to_python(dict(config or {}))
        self._asynchronous = asynchronous
        self.directory = os.path.abspath(os.fspath(directory))
        # A slow import (BENCHMARKS.md, "Import and data-source times"): only when checkpointing.
        import orbax.checkpoint as ocp

        self._ocp = ocp
        self._pending: int | None = None  # the step of the save in flight
        self._parallel: DataParallel | None = None
        options = ocp.CheckpointManagerOptions(
            max_to_keep=keep,
            create=True,
            enable_async_checkpointing=True,  # synchronous: save, then wait
            cleanup_tmp_directories=False,  # done here, before the manager lists the steps
            async_options=ocp.AsyncOptions(post_finalization_callback=self._before_commit),
        )
        self._remove_temporary("*")  # saves an earlier process never finished
        self._manager = ocp.CheckpointManager(self.directory, options=options, item_names=ITEMS)
        self._policy.install()
        self._closed = False
        self._exit_hook = _ExitHook(self)

    @property
    def preemption_requested(self) -> bool:
        """A SIGTERM arrived (several processes: at any of them, agreed at :meth:`should_save`).
        Settable: ``True`` asks for a save and a stop as a SIGTERM does (e.g. on another notice)."""
        return self._policy.preemption_requested

    @preemption_requested.setter
    def preemption_requested(self, value: bool) -> None:
        self._policy.preemption_requested = value

    def path(self, step: int) -> str:
        """The folder of the checkpoint of ``step``."""
        return os.path.join(self.directory, str(int(step)))

    def all_steps(self) -> list[int]:
        """Steps of the committed checkpoints, ascending (a save in flight is not listed)."""
        if self._manager.is_saving_in_progress():
            return sorted(s for s in self._manager.all_steps() if s != self._pending)
        self._manager.reload()
        return sorted(self._manager.all_steps())

    def last_checkpoint(self) -> str:
        """The folder of the newest committed checkpoint, or ``"none"``."""
        steps = self.all_steps()
        return self.path(steps[-1]) if steps else "none"

    def should_save(self, step: int) -> bool:
        """Whether a policy asks for a checkpoint after ``step`` (steps, minutes, preemption).
        The same answer for the same step; several processes: a collective, ask at every step."""
        return self._policy.due(step)

    # --- save ------------------------------------------------------------------------------------

    def save(self, step: int, state: PyTree, data: Any, *, force: bool = False) -> bool:
        """Checkpoints ``state`` and the position of ``data`` at ``step`` if a policy asks for it
        (or ``force``), in the background; returns whether a save started.

        Waits for the previous save first. Skipped (False) when ``step`` is already saved.

        Args:
          step: the step number (the steps the state has taken).
          state: the placed state of the run :meth:`restore_or_claim` was told about (saved as
            its ``parallel.saveable`` gives it); without :meth:`restore_or_claim`, a state as it
            is to be saved (numpy, or global arrays of a mesh).
          data: the training batches: ``data.state`` (JSON-able) is saved.
          force: save whatever the policies say (the end of a run).

        Raises:
          NonFiniteError: the state holds a non-finite value (it is never checkpointed).
          CheckpointError: this or the previous save failed (e.g. a full disk), naming the
            folder; its temporary files are removed first.
          ValueError: ``data.state`` is not JSON-able.
        """
        step = int(step)
        if not force and not self.should_save(step):
            return False
        self.wait()
        if step in self.all_steps():
            return False
        saveable = state if self._parallel is None else self._parallel.saveable(state, STATE_KINDS)
        if not all_finite(saveable):
            raise NonFiniteError(
                f"step {step}: the training state holds non-finite values (an update "
                f"overflowed); not checkpointed. Last finite checkpoint: {self.last_checkpoint()}."
                f" Lower the learning rate or clip the gradients."
            )
        ocp = self._ocp
        args = ocp.args.Composite(
            state=ocp.args.StandardSave(saveable),
            data=ocp.args.JsonSave({"position": json_position(data)}),
            meta=ocp.args.JsonSave({"config": self._config, "layout": tree_layout(saveable)}),
        )
        self._pending = step
        try:
            self._manager.save(step, args=args, force=True)
        except Exception as e:
            self._pending = None
            raise self._failed(step, e) from e
        self._policy.saved()
        if not self._asynchronous:
            self.wait()
        return True

    def _before_commit(self) -> None:
        # orbax's post-finalization callback: process 0, every process's files written, the
        # folder not yet renamed into place. The manifest goes in with the commit.
        temporary = sorted(self._temporary(str(self._pending)), key=os.path.getmtime)
        write_manifest(temporary[-1] if temporary else self.path(self._pending), ITEMS)

    def wait(self) -> None:
        """Returns once the save in flight (if any) is committed.

        Raises:
          CheckpointError: it failed, naming its folder (its temporary files were removed).
        """
        try:
            self._manager.wait_until_finished()
        except Exception as e:
            raise self._failed(self._pending, e) from e
        finally:
            self._pending = None

    def _temporary(self, step: str) -> list[str]:
        """orbax's temporary folders of ``step`` ("*": of any step): saves not committed."""
        return glob.glob(os.path.join(glob.escape(self.directory), f"{step}.orbax-checkpoint-tmp*"))

    def _remove_temporary(self, step: str) -> None:
        if jax.process_index() == 0:
            for path in self._temporary(step):
                shutil.rmtree(path, ignore_errors=True)
        sync_processes("deqjax_checkpoint_temporary")

    def _failed(self, step: int | None, error: Exception) -> CheckpointError:
        if step is not None:
            self._remove_temporary(str(step))
        self._manager.reload()
        where = self.path(step) if step is not None else self.directory
        return CheckpointError(
            f"could not write checkpoint {where}: {type(error).__name__}: {str(error)[:300]} "
            f"(its temporary files were removed)"
        )

    def close(self) -> None:
        """Waits for the save in flight, then closes the manager and removes the handler."""
        if self._closed:
            return
        self._closed = True
        self._exit_hook.target = None
        self._policy.uninstall()
        try:
            self.wait()
        finally:
            self._manager.close()

    def __enter__(self) -> Checkpoints:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # --- restore ---------------------------------------------------------------------------------

    def restore(self, template: PyTree, *, step: int | None = None) -> Restored | None:
        """The newest good checkpoint (or exactly ``step``); ``None`` if there is none at all.

        Args:
          template: a pytree with the structure, shapes and dtypes of the saved state (e.g. a
            fresh state as ``saveable`` gives it). Its global ``jax.Array`` leaves (on a mesh of
            several devices) are restored onto their layouts, whatever the layout saved; every
            other leaf comes back as numpy.
          step: restore this step only (no fallback); default the newest good one.

        Raises:
          RestoreError: checkpoints exist but none can be restored (each named with the reason:
            corrupt or incompatible with ``template``); nothing is renamed then.

        Warns:
          UserWarning: naming each corrupt checkpoint skipped for an older one (renamed
            ``<step>.corrupt``) and each incompatible one skipped (left in place).
        """
        self.wait()
        steps = [int(step)] if step is not None else self.all_steps()[::-1]
        return restore_newest(self._manager, self.directory, steps, host_template(template))

    def restore_or_claim(
        self,
        state: TrainState,
        data: Any,
        policy: RunPolicy,
        parallel: DataParallel,
        say: Callable[[str], None] | None = None,
    ) -> tuple[TrainState, int | None]:
        """``(state, restored step)`` by the :class:`~deqjax._src.training.run_policy.RunPolicy`:
        resumed, the newest good checkpoint (``data`` moved to its position); fresh, ``state``
        as given once no earlier run's checkpoints remain. Remembers ``parallel`` for
        :meth:`save`.

        Args:
          state: the fresh host state (its carry stacked per local device): the template of a
            restore.
          data: the training batches (``data.restore(position)`` on resume).
          policy: the run's ``resume`` and ``overwrite``.
          parallel: how the state is placed (``parallel.put`` places what is returned).
          say: where the "resumed from" line goes (None: silent).

        Raises:
          FileExistsError: a fresh run finds checkpoints and ``overwrite`` is not set.
          RestoreError: ``resume`` and no checkpoint restores (nothing is renamed or deleted).
        """
        policy = RunPolicy(*policy).check()
        self._parallel = parallel
        if not policy.resume:
            steps = self.all_steps()
            refuse = lambda: FileExistsError(  # noqa: E731
                f"{self.directory} holds checkpoints of an earlier run (steps {steps}); resume "
                f"it, or pass overwrite=True (--overwrite) to delete them."
            )
            doomed = policy.to_delete(steps, refuse)
            if doomed and jax.process_index() == 0:
                for s in doomed:
                    shutil.rmtree(self.path(s))
            sync_processes("deqjax_checkpoint_claim")
            self._manager.reload()
            self._policy.restart()
            return state, None
        refuse = lambda: RestoreError(  # noqa: E731
            f"resume: {self.directory} holds no checkpoint to resume from (nothing was "
            f"changed); start a fresh run instead."
        )
        template = parallel.saveable(parallel.put(state, STATE_KINDS), STATE_KINDS)
        restored = policy.resume_from(self.restore(template), refuse)
        data.restore(restored.data)
        if say is not None:
            say(f"resumed from {self.path(restored.step)} (step {restored.step})")
        self._policy.restart()
        # Host values (pmap) or global arrays already laid out (sharded): put places the first.
        return TrainState(*restored.state), restored.step


class _ExitHook:
    """Closes its target when the interpreter exits, before Python stops its thread pools (on
    which orbax's background writes depend), and keeps the target alive until then."""

    def __init__(self, target: Checkpoints):
        self.target: Checkpoints | None = target
        try:  # CPython's hook run before non-daemon threads are joined (concurrent.futures')
            threading._register_atexit(self)  # type: ignore[attr-defined]
        except (AttributeError, RuntimeError):
            atexit.register(self)

    def __call__(self) -> None:
        if self.target is not None:
            self.target.close()
