"""Checkpoints with orbax: atomic, keep the last K, resume from the latest GOOD one.

A checkpoint of step ``s`` is a folder ``<directory>/<s>/`` with two items: ``state`` (a pytree of
numpy arrays, e.g. an unreplicated :class:`~deqjax.training.TrainState`) and ``meta`` (JSON: the
data-iterator position, the run's config, and a SHA-256 digest of the state's bytes). orbax writes
each checkpoint into a temporary folder and renames it when complete, so a process killed while
saving leaves no half-written ``<s>/`` (temporary folders are cleaned up on the next start).

:meth:`Checkpointer.restore` tries the newest step first; a checkpoint that fails to load, whose
structure does not match the template, or whose digest differs (silent corruption, truncation) is
skipped with a warning naming its folder, renamed to ``<s>.corrupt``, and the previous one is tried.
"""

from __future__ import annotations

import hashlib
import os
import warnings
from collections.abc import Mapping
from typing import Any, NamedTuple

import jax
import numpy as np

PyTree = Any


class Restored(NamedTuple):
    """A checkpoint read back by :meth:`Checkpointer.restore`."""

    step: int  # the checkpoint's step number
    state: PyTree  # numpy pytree with the template's structure
    meta: dict  # the JSON metadata given to save (without the internal digest)


def tree_digest(tree: PyTree) -> str:
    """SHA-256 over every leaf's dtype, shape and bytes, in tree order (and the tree structure)."""
    h = hashlib.sha256(str(jax.tree_util.tree_structure(tree)).encode())
    for leaf in jax.tree_util.tree_leaves(tree):
        a = np.ascontiguousarray(np.asarray(leaf))
        h.update(f"{a.dtype.str}{a.shape}".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def _host(tree: PyTree) -> PyTree:
    return jax.tree_util.tree_map(np.asarray, jax.device_get(tree))


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
      >>> restored = ckpt.restore(template=host_state)   # None if there is no good checkpoint
    """

    def __init__(self, directory: str | os.PathLike, *, max_to_keep: int = 3):
        if max_to_keep < 1:
            raise ValueError(f"max_to_keep must be >= 1, got {max_to_keep}.")
        import orbax.checkpoint as ocp  # slow import (~3 s): only when checkpointing

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
          state: a pytree of arrays (fetched to the host here); NOT a replicated state.
          meta: JSON-serializable metadata, e.g. ``{"data": iterator.state._asdict()}``.
        """
        step = int(step)
        if step in self._manager.all_steps():
            return
        host = _host(state)
        meta = dict(meta or {})
        meta["__digest__"] = tree_digest(host)
        args = self._ocp.args.Composite(
            state=self._ocp.args.StandardSave(host), meta=self._ocp.args.JsonSave(meta)
        )
        self._manager.save(step, args=args, force=True)
        self._manager.wait_until_finished()

    def _restore_step(self, step: int, template: PyTree) -> Restored:
        args = self._ocp.args.Composite(
            state=self._ocp.args.StandardRestore(template), meta=self._ocp.args.JsonRestore()
        )
        out = self._manager.restore(step, args=args)
        state, meta = _host(out.state), dict(out.meta)
        if jax.tree_util.tree_structure(state) != jax.tree_util.tree_structure(template):
            raise ValueError("restored tree structure differs from the template")
        for got, want in zip(jax.tree_util.tree_leaves(state), jax.tree_util.tree_leaves(template)):
            want = np.asarray(want)
            if got.shape != want.shape or got.dtype != want.dtype:
                raise ValueError(
                    f"leaf {got.dtype}{got.shape} does not match template {want.dtype}{want.shape}"
                )
        digest = meta.pop("__digest__", None)
        if digest != tree_digest(state):
            raise ValueError("content digest mismatch (corrupt or truncated data)")
        return Restored(step, state, meta)

    def restore(self, template: PyTree, *, step: int | None = None) -> Restored | None:
        """The newest good checkpoint (or exactly ``step``), or ``None`` if there is none.

        Args:
          template: a pytree with the structure, shapes and dtypes of the saved state (e.g. a
            freshly initialized, unreplicated state).
          step: restore this step only (no fallback); default the newest good one.

        Warns:
          UserWarning: naming each checkpoint folder that is skipped as unreadable.
        """
        template = _host(template)
        steps = [int(step)] if step is not None else self.all_steps()[::-1]
        for s in steps:
            try:
                return self._restore_step(s, template)
            except Exception as e:  # orbax/tensorstore raise many types for broken files
                if step is not None:
                    raise
                path = self.path(s)
                warnings.warn(
                    f"skipping unreadable checkpoint {path}: {type(e).__name__}: "
                    f"{str(e)[:300]}; falling back to the previous checkpoint.",
                    stacklevel=2,
                )
                self._quarantine(path)
        return None

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
