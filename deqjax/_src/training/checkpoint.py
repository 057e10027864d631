"""Checkpoints with orbax: atomic, keep the last K, resume from the newest GOOD one, never guess.

A checkpoint of step ``s`` is a folder ``<directory>/<s>/`` with two items: ``state`` (a pytree of
arrays: numpy, e.g. an unreplicated :class:`~deqjax.training.TrainState`, or global arrays laid
out on a mesh, which orbax writes shard by shard from the processes that hold them and restores
onto the template's layout, e.g. onto another number of devices) and ``meta`` (JSON: the
data-iterator position, the run's config, the state's layout -- tree structure, dtypes, shapes --
and a SHA-256 digest of its bytes), plus ``deqjax_manifest.json`` (size and SHA-256 of every file
of the folder). orbax writes each checkpoint into a temporary folder and renames it when complete,
so a process killed while saving leaves no half-written ``<s>/``; a save that fails (a full disk)
removes its temporary folder before the error propagates.

:meth:`Checkpointer.restore` tries the newest step first and classifies each checkpoint before
orbax reads any array:

* **incompatible** -- its layout differs from the template's (another model width, another
  optimizer): never renamed or deleted;
* **corrupt** -- a file is missing, truncated or changed (manifest), or the restored bytes fail
  the digest.

If an older checkpoint restores, each corrupt newer one is renamed ``<s>.corrupt`` (with a
warning naming its folder) and the older one is returned. If none restores,
:class:`RestoreError` names every checkpoint and why, and nothing is renamed.
"""

from __future__ import annotations

import glob
import os
import shutil
import warnings
from collections.abc import Mapping
from typing import Any, NamedTuple

import jax

from deqjax._src.training.checkpoint_contents import (
    MANIFEST,
    CheckpointError,
    CorruptCheckpoint,
    IncompatibleCheckpoint,
    RestoreError,
    all_finite,
    tree_digest,
    tree_layout,
    verify_manifest,
    write_manifest,
)
from deqjax._src.training.checkpoint_contents import layout_difference as _layout_difference
from deqjax._src.training.checkpoint_restore import host_template as _host

__all__ = ["CheckpointError", "Checkpointer", "RestoreError", "all_finite", "tree_digest"]

PyTree = Any
# Shared with the asynchronous Checkpoints that replace this module (one definition of each).
_Corrupt, _Incompatible = CorruptCheckpoint, IncompatibleCheckpoint


class Restored(NamedTuple):
    """A checkpoint read back by :meth:`Checkpointer.restore`."""

    step: int  # the checkpoint's step number
    state: PyTree  # the template's structure: its global arrays' layouts, numpy elsewhere
    meta: dict  # the JSON metadata given to save (without the internal entries)


class Checkpointer:
    """Saves and restores ``(state, meta)`` under ``directory`` with orbax's CheckpointManager.

    In a multi-host run every process must call :meth:`save` and :meth:`restore` at the same steps
    with the same (replicated) state; ``directory`` must be on a file system all processes share.

    Args:
      directory: folder of the checkpoints (created if missing).
      max_to_keep: keep the newest ``max_to_keep`` checkpoints (``>= 1``), delete older ones.

    Raises:
      ValueError: if ``max_to_keep < 1``.

    Example:
      >>> ckpt = Checkpointer("runs/x/checkpoints", max_to_keep=3)
      >>> ckpt.save(100, unreplicate(state), {"data": it.state._asdict()})
      >>> restored = ckpt.restore(template=host_state)   # None if there is no checkpoint at all
    """

    def __init__(self, directory: str | os.PathLike, *, max_to_keep: int = 3):
        if max_to_keep < 1:
            raise ValueError(f"max_to_keep must be >= 1, got {max_to_keep}.")
        # A slow import (BENCHMARKS.md, "Import and data-source times"): only when checkpointing.
        import orbax.checkpoint as ocp

        self._ocp = ocp
        self.directory = os.path.abspath(os.fspath(directory))
        options = ocp.CheckpointManagerOptions(
            max_to_keep=max_to_keep,
            create=True,
            enable_async_checkpointing=False,
            cleanup_tmp_directories=True,
        )
        self._manager = ocp.CheckpointManager(
            self.directory, options=options, item_names=("state", "meta")
        )

    def all_steps(self) -> list[int]:
        """Steps of the complete checkpoints on disk, ascending."""
        self._manager.reload()
        return sorted(self._manager.all_steps())

    def path(self, step: int) -> str:
        """The folder of the checkpoint of ``step``."""
        return os.path.join(self.directory, str(int(step)))

    def save(self, step: int, state: PyTree, meta: Mapping[str, Any] | None = None) -> None:
        """Writes the checkpoint of ``step`` (blocking; skipped if that step is already saved).

        Args:
          step: the step number (usually ``state.step``).
          state: a pytree of arrays: global ``jax.Array`` values on a mesh of several devices are
            written as laid out (each process its shards), anything else is fetched to the
            host. Not a ``jax.pmap`` state (its leading per-device axis would tie the checkpoint
            to the device count): save its first replica.
          meta: JSON-serializable metadata, e.g. ``{"data": iterator.state._asdict()}``.

        Raises:
          CheckpointError: if writing fails (e.g. a full disk), naming the folder; the temporary
            folder of the failed save is removed first.
        """
        step = int(step)
        if step in self._manager.all_steps():
            return
        host = _host(state)
        meta = dict(meta or {})
        meta["__digest__"] = tree_digest(host)
        meta["__layout__"] = tree_layout(host)
        args = self._ocp.args.Composite(
            state=self._ocp.args.StandardSave(host), meta=self._ocp.args.JsonSave(meta)
        )
        try:
            self._manager.save(step, args=args, force=True)
            self._manager.wait_until_finished()
            self._write_manifest(step)
        except Exception as e:
            self._remove_partial(step)
            raise CheckpointError(
                f"could not write checkpoint {self.path(step)}: {type(e).__name__}: "
                f"{str(e)[:300]} (its temporary files were removed)"
            ) from e

    def _remove_partial(self, step: int) -> None:
        if jax.process_index() != 0:
            return
        pattern = os.path.join(glob.escape(self.directory), f"{step}.orbax-checkpoint-tmp*")
        partial = glob.glob(pattern)
        final = self.path(step)
        if os.path.isdir(final) and not os.path.exists(os.path.join(final, MANIFEST)):
            partial.append(final)  # renamed into place, but its manifest never got written
        for path in partial:
            shutil.rmtree(path, ignore_errors=True)
        try:
            self._manager.reload()
        except Exception:  # noqa: BLE001 - best effort after a failed write
            pass

    def _write_manifest(self, step: int) -> None:
        if jax.process_index() == 0:
            write_manifest(self.path(step), ("state", "meta"))

    def _verify_files(self, step: int) -> None:
        # no manifest: an older checkpoint, the digest after restoring still guards it
        verify_manifest(self.path(step), required=False)

    def _restore_step(self, step: int, template: PyTree) -> Restored:
        try:
            meta_only = self._manager.restore(
                step, args=self._ocp.args.Composite(meta=self._ocp.args.JsonRestore())
            )
            meta = dict(meta_only.meta)
        except Exception as e:  # noqa: BLE001 - orbax raises many types for broken files
            raise _Corrupt(f"unreadable metadata: {type(e).__name__}: {str(e)[:200]}") from None
        layout = meta.pop("__layout__", None)
        if layout is not None:
            why = _layout_difference(layout, tree_layout(template))
            if why is not None:
                raise _Incompatible(why)
        self._verify_files(step)
        args = self._ocp.args.Composite(
            state=self._ocp.args.StandardRestore(template), meta=self._ocp.args.JsonRestore()
        )
        try:
            out = self._manager.restore(step, args=args)
        except Exception as e:  # noqa: BLE001 - orbax raises many types for broken files
            raise _Corrupt(f"{type(e).__name__}: {str(e)[:300]}") from None
        state = _host(out.state)
        if jax.tree_util.tree_structure(state) != jax.tree_util.tree_structure(template):
            raise _Incompatible("its tree structure differs from the template's")
        for got, want in zip(jax.tree_util.tree_leaves(state), jax.tree_util.tree_leaves(template)):
            if got.shape != want.shape or got.dtype != want.dtype:
                raise _Incompatible(
                    f"leaf {got.dtype}{got.shape} does not match template {want.dtype}{want.shape}"
                )
        digest = meta.pop("__digest__", None)
        if digest != tree_digest(state):
            raise _Corrupt("content digest mismatch (corrupt or truncated data)")
        return Restored(step, state, meta)

    def restore(self, template: PyTree, *, step: int | None = None) -> Restored | None:
        """The newest good checkpoint (or exactly ``step``); ``None`` if there is no checkpoint.

        Args:
          template: a pytree with the structure, shapes and dtypes of the saved state (e.g. a
            freshly initialized, unreplicated state). Its global ``jax.Array`` leaves (on a mesh
            of several devices) are restored onto their layouts, whatever the layout saved; every
            other leaf comes back as numpy.
          step: restore this step only (no fallback); default the newest good one.

        Raises:
          RestoreError: if checkpoints exist but none can be restored (each named with the
            reason: corrupt or incompatible with ``template``); nothing is renamed then.

        Warns:
          UserWarning: naming each corrupt checkpoint skipped in favour of an older one (it is
            renamed ``<step>.corrupt``) and each incompatible one skipped (left in place).
        """
        template = _host(template)
        steps = [int(step)] if step is not None else self.all_steps()[::-1]
        if not steps:
            return None
        failures: list[tuple[int, str, str]] = []
        for s in steps:
            try:
                restored = self._restore_step(s, template)
            except (_Corrupt, _Incompatible) as e:
                kind = "corrupt" if isinstance(e, _Corrupt) else "incompatible"
                failures.append((s, kind, str(e)))
                continue
            for bad, kind, why in failures:
                action = "renamed .corrupt" if kind == "corrupt" else "left in place"
                warnings.warn(
                    f"skipping {kind} checkpoint {self.path(bad)}: {why}; {action}, "
                    f"falling back to {self.path(s)}.",
                    stacklevel=2,
                )
                if kind == "corrupt":
                    self._quarantine(self.path(bad))
            return restored
        lines = "\n".join(f"  {self.path(s)}: {kind}: {why}" for s, kind, why in failures)
        raise RestoreError(
            f"no checkpoint in {self.directory} can be restored (nothing was renamed or "
            f"deleted):\n{lines}"
        )

    def _quarantine(self, path: str) -> None:
        # Move a bad checkpoint aside so later saves of that step and orbax's listing ignore it.
        if jax.process_index() != 0 or not os.path.isdir(path):
            return
        target, k = path + ".corrupt", 1
        while os.path.exists(target):
            target, k = f"{path}.corrupt{k}", k + 1
        try:
            os.rename(path, target)
        except OSError:
            pass
        self._manager.reload()

    def close(self) -> None:
        self._manager.close()

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
