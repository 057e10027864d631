"""Reading a run's checkpoints back: the newest good one, each bad one classified, nothing guessed.

:func:`restore_newest` tries the newest step first and classifies each checkpoint before orbax
reads an array of it: *incompatible* (its layout differs from the template's: another model;
never renamed or deleted) or *corrupt* (a file missing, truncated or changed since its manifest
was written, or unreadable). If an older one restores, each corrupt newer one is renamed
``<step>.corrupt`` (with a warning naming it); if none does, :class:`RestoreError` names each and
why, and nothing is renamed.

A checkpoint written by the synchronous ``Checkpointer`` of deqjax 0.2 has two items, ``state``
and ``meta`` (the position as ``meta["data"]``, its layout and a digest of the state's bytes as
``"__layout__"`` and ``"__digest__"``; a manifest only if recent): it is read back too, so a run
started before asynchronous checkpoints resumes.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import numpy as np

from deqjax._src.training.checkpoint_contents import (
    CorruptCheckpoint,
    IncompatibleCheckpoint,
    RestoreError,
    layout_difference,
    tree_digest,
    tree_layout,
    verify_manifest,
)

PyTree = Any


class Restored(NamedTuple):
    """A checkpoint read back by :meth:`~deqjax.training.Checkpoints.restore`."""

    step: int  # the checkpoint's step number
    state: PyTree  # the template's structure: its global arrays' layouts, numpy elsewhere
    data: Any  # the data iterator's position, as JSON gives it back (``data.restore`` takes it)
    config: dict  # the run configuration given to :class:`~deqjax.training.Checkpoints`


def host_template(tree: PyTree) -> PyTree:
    """``tree`` as orbax restores it: global arrays of several devices stay (their layout is
    where they are restored), anything else becomes numpy."""

    def one(x):
        return x if isinstance(x, jax.Array) and len(x.sharding.device_set) > 1 else np.asarray(x)

    return jax.tree_util.tree_map(one, tree)


def sync_processes(name: str) -> None:
    """Every process waits here (a run of several processes; otherwise nothing)."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


def restore_newest(manager: Any, directory: str, steps: Sequence[int], template: PyTree):
    """The first of ``steps`` (newest first) that restores into ``template``, or None if there
    are no ``steps``.

    Args:
      manager: the ``orbax.checkpoint.CheckpointManager`` of ``directory``.
      directory: the checkpoints' folder.
      steps: the steps to try, in order.
      template: the state's template (:func:`host_template`).

    Raises:
      RestoreError: none restores (each named with the reason); nothing is renamed then.

    Warns:
      UserWarning: naming each corrupt checkpoint skipped for an older one (renamed
        ``<step>.corrupt``) and each incompatible one skipped (left in place).
    """
    path = lambda s: os.path.join(directory, str(s))  # noqa: E731
    failures: list[tuple[int, str, str]] = []
    for s in steps:
        try:
            restored = _restore_step(manager, path(s), s, template)
        except (CorruptCheckpoint, IncompatibleCheckpoint) as e:
            kind = "corrupt" if isinstance(e, CorruptCheckpoint) else "incompatible"
            failures.append((s, kind, str(e)))
            continue
        for bad, kind, why in failures:
            action = "renamed .corrupt" if kind == "corrupt" else "left in place"
            warnings.warn(
                f"skipping {kind} checkpoint {path(bad)}: {why}; {action}, falling back to "
                f"{path(s)}.",
                stacklevel=3,
            )
            if kind == "corrupt":
                _quarantine(path(bad))
        if any(kind == "corrupt" for _, kind, _ in failures):
            sync_processes("deqjax_checkpoint_quarantine")
            manager.reload()
        return restored
    if not failures:
        return None
    lines = "\n".join(f"  {path(s)}: {kind}: {why}" for s, kind, why in failures)
    raise RestoreError(
        f"no checkpoint in {directory} can be restored (nothing was renamed or deleted):\n{lines}"
    )


def _restore_step(manager: Any, root: str, step: int, template: PyTree) -> Restored:
    import orbax.checkpoint as ocp

    meta = _read(manager, step, meta=ocp.args.JsonRestore()).meta
    layout = meta.get("layout", meta.get("__layout__"))  # "__layout__": deqjax 0.2
    why = None if layout is None else layout_difference(layout, tree_layout(template))
    if why is not None:
        raise IncompatibleCheckpoint(why)
    legacy = not os.path.isdir(os.path.join(root, "data"))
    verify_manifest(root, required=not legacy)
    state_args = ocp.args.StandardRestore(template)
    if legacy:
        state, position = _read(manager, step, state=state_args).state, meta.get("data")
    else:
        out = _read(manager, step, state=state_args, data=ocp.args.JsonRestore())
        state, position = out.state, out.data["position"]
    state = host_template(state)
    if jax.tree_util.tree_structure(state) != jax.tree_util.tree_structure(template):
        raise IncompatibleCheckpoint("its tree structure differs from the template's")
    for got, want in zip(jax.tree_util.tree_leaves(state), jax.tree_util.tree_leaves(template)):
        if got.shape != want.shape or got.dtype != want.dtype:
            raise IncompatibleCheckpoint(
                f"leaf {got.dtype}{got.shape} does not match template {want.dtype}{want.shape}"
            )
    if legacy and meta.get("__digest__") != tree_digest(state):
        raise CorruptCheckpoint("content digest mismatch (corrupt or truncated data)")
    return Restored(step, state, position, dict(meta.get("config") or {}))


def _read(manager: Any, step: int, **items: Any) -> Any:
    import orbax.checkpoint as ocp

    try:
        return manager.restore(step, args=ocp.args.Composite(**items))
    except Exception as e:  # noqa: BLE001 - orbax raises many types for broken files
        raise CorruptCheckpoint(f"{type(e).__name__}: {str(e)[:300]}") from None


def _quarantine(path: str) -> None:
    # A bad checkpoint moved aside: later saves of its step and orbax's listing ignore it.
    if jax.process_index() == 0 and os.path.isdir(path):
        target, k = path + ".corrupt", 1
        while os.path.exists(target):
            target, k = f"{path}.corrupt{k}", k + 1
        try:
            os.rename(path, target)
        except OSError:
            pass
