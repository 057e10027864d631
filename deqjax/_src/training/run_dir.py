"""A run's output folder: refuse to overwrite an earlier run, refuse to resume under other flags.

Every experiment's ``--out_dir`` holds one run: its ``config.json`` (the flags), ``metrics.jsonl``,
``ckpt/`` and its results. :func:`prepare_run_dir` is the one place the experiments' shared run
flags (:func:`add_run_flags`: ``--resume``, ``--overwrite``, ``--force``) are acted on:

* a new run (no ``--resume``) in a folder that holds an earlier run stops with
  :class:`RunDirError` unless ``--overwrite`` (which deletes that run's files, and only those);
* ``--resume`` compares the saved ``config.json`` with the current flags and stops naming every
  flag that changed; ``--force`` accepts the changes the experiment declares safe (e.g. a longer
  ``--epochs``), never the others (another ``--width`` or ``--seed`` would resume a different run);
* ``--resume`` in a folder with no run stops too: resuming never silently starts from step 0.

It also holds the argparse types that reject out-of-range values naming the flag
(:func:`positive_int`, :func:`nonnegative_int`, :func:`nonnegative_float`, :func:`positive_float`).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from deqjax._src.training.metrics import to_python

CONFIG_NAME = "config.json"
# Files and folders that make a folder "hold a run"; --overwrite deletes these (and the outputs
# the experiment names), nothing else.
RUN_FILES = (CONFIG_NAME, "metrics.jsonl", "ckpt", "results.json")
# Flags that never change what a run computes: not compared on resume.
IGNORED_KEYS = frozenset(
    {
        "resume",
        "overwrite",
        "force",
        "progress",
        "out_dir",
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


# --- argparse types ------------------------------------------------------------------------------


def _number(text: str, kind: type) -> Any:
    try:
        return kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {kind.__name__}, got {text!r}") from None


def positive_int(text: str) -> int:
    """argparse type: an int ``>= 1`` (argparse's error then names the flag)."""
    value = _number(text, int)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an int >= 1, got {value}")
    return value


def nonnegative_int(text: str) -> int:
    """argparse type: an int ``>= 0``."""
    value = _number(text, int)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be an int >= 0, got {value}")
    return value


def positive_float(text: str) -> float:
    """argparse type: a finite float ``> 0``."""
    value = _number(text, float)
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {value}")
    return value


def nonnegative_float(text: str) -> float:
    """argparse type: a finite float ``>= 0``."""
    value = _number(text, float)
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {value}")
    return value


def add_run_flags(parser: argparse.ArgumentParser, *, resume: bool = True) -> None:
    """Adds ``--overwrite`` and (with ``resume``) ``--resume`` and ``--force`` to ``parser``."""
    g = parser.add_argument_group("run folder")
    if resume:
        g.add_argument(
            "--resume",
            action="store_true",
            help="continue the run in --out_dir from its newest good checkpoint; stops with an\n"
            "error if there is none, or if a flag differs from the run's config.json",
        )
        g.add_argument(
            "--force",
            action="store_true",
            help="with --resume: accept changes of the flags that are safe to change\n"
            "(e.g. a longer --epochs); other changes are still refused",
        )
    g.add_argument(
        "--overwrite",
        action="store_true",
        help="start afresh in an --out_dir that holds an earlier run, deleting that run's\n"
        "config, metrics, checkpoints and results (without it such a folder is refused)",
    )


# --- the folder ----------------------------------------------------------------------------------


def _flag(key: str) -> str:
    return f"--{key}"


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


def write_config(
    out_dir: str | os.PathLike, config: Mapping[str, Any], *, name: str = CONFIG_NAME
) -> str:
    """Writes ``config`` to ``out_dir/name`` atomically; returns its path."""
    path = os.path.join(os.fspath(out_dir), name)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(to_python(dict(config)), f, indent=2, sort_keys=True)
    os.replace(tmp, path)
    return path


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
      config: the run's flags (JSON-able), e.g. ``vars(args)`` plus derived values.
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
    if resume and overwrite:
        raise RunDirError("--resume and --overwrite contradict each other: choose one.")
    present = holds_run(out_dir, (config_name, *outputs))
    config_path = os.path.join(out_dir, config_name)
    accepted: dict = {}
    if resume:
        if not os.path.exists(config_path):
            if not present:
                raise RunDirError(
                    f"--resume: {out_dir} holds no run to resume (no {config_name}); drop "
                    f"--resume to start a new run."
                )
            if not force:
                raise RunDirError(
                    f"--resume: {out_dir} holds run files ({', '.join(present)}) but no "
                    f"{config_name} to check the flags against; pass --force to resume anyway."
                )
        else:
            with open(config_path) as f:
                saved = json.load(f)
            changes = config_changes(saved, config, ignore=ignore_keys)
            safe = set(safe_keys)
            unsafe = {k: v for k, v in changes.items() if k not in safe}
            if unsafe or (changes and not force):
                lines = []
                for key, (a, b) in changes.items():
                    note = " (safe: accepted with --force)" if key in safe else ""
                    lines.append(f"  {_flag(key)}: {a!r} in {config_name}, now {b!r}{note}")
                hint = (
                    "these flags cannot change on resume: start a new run in another --out_dir"
                    if unsafe
                    else "pass --force to accept these changes"
                )
                raise RunDirError(
                    f"--resume: the flags differ from the run in {out_dir} "
                    f"({len(changes)} changed):\n" + "\n".join(lines) + f"\n{hint}."
                )
            accepted = changes
    elif present and not overwrite:
        raise RunDirError(
            f"{out_dir} holds an earlier run ({', '.join(present)}); pass --resume to "
            f"continue it, --overwrite to delete it and start afresh, or choose another "
            f"--out_dir."
        )
    if multi:  # every process has checked the folder before any process changes it
        _barrier("deqjax_run_dir_checked")
    if not resume and present and write:
        for name in present:
            path = os.path.join(out_dir, name)
            if os.path.isdir(path):
                shutil.rmtree(path)
            else:
                os.remove(path)
    # A resumed run keeps its config.json unless --force accepted changes (then it records them).
    if write and (not resume or accepted):
        os.makedirs(out_dir, exist_ok=True)
        write_config(out_dir, config, name=config_name)
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
