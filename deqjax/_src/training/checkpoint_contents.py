"""What a checkpoint must hold, and how its contents are checked before a run trusts them.

A checkpoint folder ``<directory>/<step>/`` holds orbax's items and ``deqjax_manifest.json``:
the size and SHA-256 of every file of the items, written by :func:`write_manifest` into the
save's temporary folder after every process wrote its part and before orbax commits (renames)
it, so a committed checkpoint carries its manifest and an asynchronous save is verified whenever
it is read back (:func:`verify_manifest`), however long after it was written. The state's layout
(:func:`tree_layout`: tree structure, dtypes, shapes) is compared with a template's before any
array is read (:func:`layout_difference`), so a checkpoint of another model is told apart from a
corrupt one. A state with a non-finite value is never saved (:func:`all_finite`); the data
iterator's position is saved as JSON (:func:`json_position`).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from deqjax._src.training.metrics import to_python

PyTree = Any
MANIFEST = "deqjax_manifest.json"


class CheckpointError(RuntimeError):
    """A checkpoint could not be written or read; the message names the folder."""


class RestoreError(CheckpointError):
    """Checkpoints exist but none can be restored; nothing was renamed or deleted."""


class CorruptCheckpoint(Exception):
    """A checkpoint's files are missing, truncated, changed or unreadable (private)."""


class IncompatibleCheckpoint(Exception):
    """A checkpoint's layout differs from the template's: another model (private)."""


def _readable(leaf: Any) -> np.ndarray | None:
    """``leaf`` on the host, or None for a global array this process holds only part of."""
    if isinstance(leaf, jax.Array) and not leaf.is_fully_addressable:
        if not leaf.is_fully_replicated:
            return None
        return np.asarray(leaf.addressable_shards[0].data)
    return np.asarray(leaf)


def tree_digest(tree: PyTree) -> str:
    """SHA-256 over every leaf's dtype, shape and bytes, in tree order (and the tree structure).

    A global array split over several processes adds its dtype and shape only."""
    h = hashlib.sha256(str(jax.tree_util.tree_structure(tree)).encode())
    for leaf in jax.tree_util.tree_leaves(tree):
        a = _readable(leaf)
        h.update(f"{np.dtype(leaf.dtype).str}{tuple(np.shape(leaf))}".encode())
        if a is not None:
            h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def tree_layout(tree: PyTree) -> dict:
    """The tree structure and each leaf's ``dtype[shape]``: what a checkpoint must match."""
    leaves = [x if hasattr(x, "dtype") else np.asarray(x) for x in jax.tree_util.tree_leaves(tree)]
    return {
        "structure": str(jax.tree_util.tree_structure(tree)),
        "leaves": [f"{np.dtype(a.dtype).str}{list(np.shape(a))}" for a in leaves],
    }


def layout_difference(saved: Mapping[str, Any], wanted: Mapping[str, Any]) -> str | None:
    """Why a checkpoint of layout ``saved`` cannot restore into ``wanted`` (None: it can)."""
    if saved.get("structure") != wanted["structure"]:
        return "its tree structure differs from the template's (another model or optimizer)"
    for i, (a, b) in enumerate(zip(saved.get("leaves", []), wanted["leaves"])):
        if a != b:
            return f"leaf {i} is {a}, the template's is {b} (another model size?)"
    return None


@jax.jit
def _finite(leaves: list[jax.Array]) -> jax.Array:
    return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in leaves]))


def all_finite(tree: PyTree) -> bool:
    """True if every floating-point leaf of ``tree`` is finite.

    Device arrays are checked where they live (a jitted reduction per set of devices, a scalar
    read back), so a global array is checked whole and every process gets the same answer (a
    collective then: every process calls it); other leaves on the host."""
    leaves = jax.tree_util.tree_leaves(tree)
    leaves = [x if isinstance(x, jax.Array) else np.asarray(x) for x in leaves]
    leaves = [x for x in leaves if jnp.issubdtype(x.dtype, jnp.inexact)]
    if any(not np.all(np.isfinite(x)) for x in leaves if not isinstance(x, jax.Array)):
        return False
    groups: dict[frozenset, list[jax.Array]] = {}
    for x in leaves:
        if isinstance(x, jax.Array):
            groups.setdefault(frozenset(x.sharding.device_set), []).append(x)
    return all(bool(np.asarray(_finite(g).addressable_data(0))) for g in groups.values())


def json_position(data: Any) -> Any:
    """``data.state`` (the iterator's position) as JSON keeps it (a NamedTuple as a dict).

    Raises:
      ValueError: ``data.state`` holds something JSON cannot represent.
    """
    position = data.state
    if hasattr(position, "_asdict"):
        position = position._asdict()
    position = to_python(position)
    try:
        json.dumps(position)
    except (TypeError, ValueError) as e:
        raise ValueError(
            f"data.state must be JSON-able (the iterator's position is a checkpoint item), got "
            f"{type(data.state).__name__}: {e}"
        ) from None
    return position


def _file_sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def write_manifest(root: str, items: Sequence[str]) -> None:
    """Writes ``root/deqjax_manifest.json``: size and SHA-256 of every file of the ``items``
    sub-folders (orbax's own step metadata, rewritten at commit, is left out)."""
    files = {}
    for item in items:
        for dirpath, _, names in os.walk(os.path.join(root, item)):
            for name in names:
                path = os.path.join(dirpath, name)
                files[os.path.relpath(path, root)] = [os.path.getsize(path), _file_sha256(path)]
    tmp = os.path.join(root, MANIFEST + ".tmp")
    with open(tmp, "w") as f:
        json.dump({"files": files}, f, sort_keys=True)
    os.replace(tmp, os.path.join(root, MANIFEST))


def verify_manifest(root: str, *, required: bool = True) -> None:
    """Checks every file the manifest of ``root`` lists (present, same size, same SHA-256).

    Args:
      root: a checkpoint folder.
      required: a missing manifest is corruption (False: checkpoints written before manifests).

    Raises:
      CorruptCheckpoint: naming the first file that differs, or the missing manifest.
    """
    manifest = os.path.join(root, MANIFEST)
    if not os.path.exists(manifest):
        if required:
            raise CorruptCheckpoint(f"its manifest {manifest} is missing")
        return
    try:
        with open(manifest) as f:
            files = json.load(f)["files"]
    except (OSError, ValueError, KeyError) as e:
        raise CorruptCheckpoint(f"unreadable manifest {manifest}: {e}") from None
    for rel, (size, sha) in sorted(files.items()):
        path = os.path.join(root, rel)
        if not os.path.isfile(path):
            raise CorruptCheckpoint(f"file {path} is missing")
        got = os.path.getsize(path)
        if got != size:
            written = f"{size} were written (truncated?)"
            raise CorruptCheckpoint(f"file {path} has {got} bytes, {written}")
        if _file_sha256(path) != sha:
            raise CorruptCheckpoint(f"file {path} changed since it was written (checksum mismatch)")
