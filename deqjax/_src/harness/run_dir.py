"""A run's output folder: refuse to overwrite an earlier run, refuse to resume under other flags.

Every experiment's ``--out_dir`` holds one run: its ``config.json`` (the flags), ``metrics.jsonl``,
``ckpt/`` and its results. :func:`prepare_run_dir` is where the run flags ``--resume``,
``--overwrite`` and ``--force`` are acted on for the folder, by the overwrite/resume policy of
:mod:`~deqjax._src.training.run_policy` (which ``fit`` follows for the checkpoints and metrics
file inside it):

* a new run (no ``--resume``) in a folder that holds an earlier run stops with
  :class:`RunDirError` unless ``--overwrite`` (which deletes that run's files, and only those);
* ``--resume`` compares the saved ``config.json`` with the current flags and stops naming every
  flag that changed; ``--force`` accepts the changes the experiment declares safe (e.g. a longer
  ``--epochs``), never the others (another ``--width`` or ``--seed`` would resume a different run);
* ``--resume`` in a folder with no run stops too: resuming never silently starts from step 0.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from deqjax._src.training.metrics import to_python
from deqjax._src.training.run_policy import RunPolicy

CONFIG_NAME = "config.json"
# Files and folders that make a folder "hold a run"; --overwrite deletes these (and the outputs
# the experiment names), nothing else.
RUN_FILES = (
    CONFIG_NAME,
    "metrics.jsonl",
    "ckpt",
    "results.json",
    "tensorboard",
    "profile",
    "wandb",
    "wandb_run_id.txt",
)
# Flags that never change what a run computes: not compared on resume.
IGNORED_KEYS = frozenset(
    {
        "resume",
        "overwrite",
        "force",
        "progress",
        "out_dir",
        "compilation_cache",
        "tensorboard",
        "wandb",
        "profile_steps",
        "coordinator_address",
        "num_processes",
        "process_id",
    }
)


class RunDirError(ValueError):
    """The output folder cannot be used as asked; the message says what to do instead."""


class RunDir(NamedTuple):
    """What :func:`prepare_run_dir` decided."""

    path: str  # the output folder
    resume: bool  # True: continue the run in ``path``
    accepted_changes: dict  # flag -> (saved, current) accepted with ``--force``


def write_json(path: str | os.PathLike, obj: Mapping[str, Any]) -> str:
    """Writes ``obj`` as indented, sorted JSON to ``path`` atomically (creating its folder);
    configuration objects field by field (:func:`~deqjax.harness.to_python`). Returns the
    path."""
    path = os.fspath(path)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(to_python(dict(obj)), f, indent=2, sort_keys=True)
    os.replace(tmp, path)
    return path


def _normalise(config: Mapping[str, Any]) -> dict:
    return json.loads(json.dumps(to_python(dict(config)), sort_keys=True))


def config_changes(
    saved: Mapping[str, Any], current: Mapping[str, Any], *, ignore: Iterable[str] = IGNORED_KEYS
) -> dict[str, tuple[Any, Any]]:
    """``{key: (saved, current)}`` for every key whose value differs (``ignore`` left out)."""
    saved, current, ignore = _normalise(saved), _normalise(current), set(ignore)
    missing = object()
    changes = {}
    for key in sorted(set(saved) | set(current)):
        if key in ignore:
            continue
        a, b = saved.get(key, missing), current.get(key, missing)
        if a != b:
            changes[key] = (
                "(absent)" if a is missing else a,
                "(absent)" if b is missing else b,
            )
    return changes


def holds_run(out_dir: str | os.PathLike, outputs: Iterable[str] = ()) -> list[str]:
    """The run files (of :data:`RUN_FILES` and ``outputs``) present in ``out_dir``."""
    out_dir = os.fspath(out_dir)
    found = []
    for name in dict.fromkeys((*RUN_FILES, *outputs)):
        path = os.path.join(out_dir, name)
        if os.path.isdir(path) and not os.listdir(path):
            continue  # an empty folder holds nothing
        if os.path.exists(path):
            found.append(name)
    return found


def _check_resume(
    out_dir: str,
    config: Mapping[str, Any],
    present: list[str],
    *,
    force: bool,
    safe_keys: Iterable[str],
    ignore_keys: Iterable[str],
    config_name: str,
) -> dict:
    """The changes ``--resume --force`` accepts; raises :class:`RunDirError` for the others."""
    config_path = os.path.join(out_dir, config_name)
    refuse = lambda: RunDirError(  # noqa: E731
        f"--resume: {out_dir} holds no run to resume (no {config_name}); drop --resume to start "
        f"a new run."
    )
    RunPolicy(resume=True).resume_from(present, refuse)
    if not os.path.exists(config_path):
        if not force:
            raise RunDirError(
                f"--resume: {out_dir} holds run files ({', '.join(present)}) but no "
                f"{config_name} to check the flags against; pass --force to resume anyway."
            )
        return {}
    with open(config_path) as f:
        changes = config_changes(json.load(f), config, ignore=ignore_keys)
    safe = set(safe_keys)
    unsafe = [key for key in changes if key not in safe]
    if not unsafe and (force or not changes):
        return changes
    lines = []
    for key, (a, b) in changes.items():
        note = " (safe: accepted with --force)" if key in safe else ""
        lines.append(f"  --{key}: {a!r} in {config_name}, now {b!r}{note}")
    hint = (
        "these flags cannot change on resume: start a new run in another --out_dir"
        if unsafe
        else "pass --force to accept these changes"
    )
    raise RunDirError(
        f"--resume: the flags differ from the run in {out_dir} ({len(changes)} changed):\n"
        + "\n".join(lines)
        + f"\n{hint}."
    )


def _delete(out_dir: str, names: Iterable[str]) -> None:
    for name in names:
        path = os.path.join(out_dir, name)
        if os.path.isdir(path):
            shutil.rmtree(path)
        else:
            os.remove(path)


def prepare_run_dir(
    out_dir: str | os.PathLike,
    config: Mapping[str, Any],
    *,
    resume: bool = False,
    overwrite: bool = False,
    force: bool = False,
    safe_keys: Iterable[str] = (),
    ignore_keys: Iterable[str] = IGNORED_KEYS,
    outputs: Iterable[str] = (),
    config_name: str = CONFIG_NAME,
    write: bool | None = None,
) -> RunDir:
    """Checks ``out_dir`` against the flags, then creates it and writes ``config.json``.

    A resumed run leaves ``config.json`` as it is, unless ``force`` accepted changes: then it is
    rewritten with the current flags (the next ``--resume`` compares against those).

    Args:
      out_dir: the run's output folder.
      config: the run's flags (JSON-able), e.g. the flat configuration plus derived values.
      resume: continue the run in ``out_dir`` (``--resume``).
      overwrite: a new run may delete the earlier run's files (``--overwrite``).
      force: with ``resume``, accept changed ``safe_keys`` (``--force``).
      safe_keys: config keys whose change a resumed run can absorb (more epochs, logging).
      ignore_keys: config keys never compared (default :data:`IGNORED_KEYS`).
      outputs: further files this experiment writes into ``out_dir`` (deleted by ``overwrite``).
      config_name: the file the flags are kept in (another name for another mode of a script).
      write: delete (``overwrite``) and write files; default: process 0 only. In a multi-host
        run every process must call this: all check the folder first, then (after a barrier)
        process 0 changes it, then all continue together.

    Returns:
      A :class:`RunDir`.

    Raises:
      RunDirError: ``resume`` with no run in ``out_dir`` or with changed flags (each named with
        its saved and current value); a new run in a folder holding an earlier run without
        ``overwrite``; ``resume`` together with ``overwrite``.
    """
    out_dir = os.fspath(out_dir)
    multi = _process_count() > 1
    if write is None:
        write = _process_index() == 0
    policy = RunPolicy(resume, overwrite).check(flags=True, error=RunDirError)
    present = holds_run(out_dir, (config_name, *outputs))
    accepted: dict = {}
    if resume:
        accepted = _check_resume(
            out_dir,
            config,
            present,
            force=force,
            safe_keys=safe_keys,
            ignore_keys=ignore_keys,
            config_name=config_name,
        )
    refuse = lambda: RunDirError(  # noqa: E731
        f"{out_dir} holds an earlier run ({', '.join(present)}); pass --resume to continue it, "
        f"--overwrite to delete it and start afresh, or choose another --out_dir."
    )
    doomed = policy.to_delete(present, refuse)
    if multi:  # every process has checked the folder before any process changes it
        _barrier("deqjax_run_dir_checked")
    if write:
        _delete(out_dir, doomed)
    # A resumed run keeps its config.json unless --force accepted changes (then it records them).
    if write and (not resume or accepted):
        write_json(os.path.join(out_dir, config_name), config)
    if multi:
        _barrier("deqjax_run_dir_ready")
    return RunDir(out_dir, resume, accepted)


def _process_count() -> int:
    import jax

    return jax.process_count()


def _process_index() -> int:
    import jax

    return jax.process_index()


def _barrier(name: str) -> None:
    from jax.experimental import multihost_utils

    multihost_utils.sync_global_devices(name)
