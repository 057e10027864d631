"""JAX's persistent compilation cache for the duration of a run (``--compilation_cache``).

A run compiles its train, evaluation and diagnostics programs before its first step: a good part
of a short run on a CPU (BENCHMARKS.md, "The main job's wall time outside the train steps"),
and on an accelerator a larger share of a shorter run.
JAX can keep compiled programs on disk and load them in a later run with the same programs
(``jax_compilation_cache_dir``); it is off unless asked for. The experiment runner asks for it,
in ``~/.cache/deqjax/jax`` by default (``$DEQJAX_COMPILATION_CACHE_DIR`` when set: the test
suite points it at a temporary folder), and only for the run: the setting before it is restored
after it (a test that calls several experiments in one process sees no cache outside them). A
cache folder set through JAX (``JAX_COMPILATION_CACHE_DIR`` or ``jax.config``) is left as it is.
JAX writes only programs that took at least ``jax_persistent_cache_min_compile_time_secs`` (a
second, JAX's default) to compile, keyed by the program, the JAX and XLA versions and the
devices.

Runs share the folder safely, in parallel too. It is bounded (:data:`MAX_BYTES`: JAX evicts the
least recently used programs), which makes JAX lock it (``filelock``) around every read and
write, so no run reads a program another one is writing, and keep an access time beside each
program (``<key>-atime`` beside ``<key>-cache``), which every write reads for every program of
the folder. A program written without one (by an unbounded writer: deqjax before the bound, a
process with JAX's own setting, one without ``filelock``) made every later write of every run
warn ``Error writing persistent compilation cache entry ... FileNotFoundError ... -atime``. So:

* the bound is set before the folder, and taken off after it, so that no compilation (a
  background one of an earlier run included) ever sees the folder unbounded;
* a program found without an access time is given one (under the folder's lock) as the run
  starts;
* without ``filelock`` the run has no cache (a note says so) rather than an unbounded one.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
from collections.abc import Iterator

import jax
from jax.experimental.compilation_cache import compilation_cache

DEFAULT = "~/.cache/deqjax/jax"
ENV_VAR = "DEQJAX_COMPILATION_CACHE_DIR"  # replaces DEFAULT when set ('': no cache)
MAX_BYTES = 2**30  # the folder's bound (the main job's programs take about 1 MB)
LOCK_SECONDS = 10.0  # JAX's own wait for the folder's lock
# JAX's file names (jax/_src/lru_cache.py): a program, its access time, the folder's lock.
PROGRAM, ACCESS_TIME, LOCK = "-cache", "-atime", ".lockfile"


def folder_of(path: str) -> str:
    """The folder ``--compilation_cache path`` means: ``$DEQJAX_COMPILATION_CACHE_DIR`` for
    :data:`DEFAULT` when that is set, else ``path`` (``""``: none)."""
    if path == DEFAULT:
        path = os.environ.get(ENV_VAR, DEFAULT)
    return os.path.abspath(os.path.expanduser(path)) if path else ""


def has_filelock() -> bool:
    """Whether ``filelock`` is installed (JAX locks a bounded cache folder with it)."""
    return importlib.util.find_spec("filelock") is not None


def give_access_times(folder: str) -> int:
    """Writes the access time JAX's bounded cache expects beside every program of ``folder``
    that has none (the program's modification time), holding the folder's lock.

    Args:
      folder: a cache folder (nothing is done if it does not exist or its lock is held for
        longer than :data:`LOCK_SECONDS`).

    Returns:
      The number of access times written.
    """
    import filelock

    if not os.path.isdir(folder):
        return 0
    written = 0
    try:
        with filelock.FileLock(os.path.join(folder, LOCK), timeout=LOCK_SECONDS):
            for name in os.listdir(folder):
                if not name.endswith(PROGRAM):
                    continue
                program = os.path.join(folder, name)
                access_time = program.removesuffix(PROGRAM) + ACCESS_TIME
                with contextlib.suppress(FileNotFoundError):  # evicted meanwhile by a run
                    if not os.path.exists(access_time):
                        stamp = os.stat(program).st_mtime_ns.to_bytes(8, "little")
                        with open(access_time, "wb") as f:
                            f.write(stamp)
                        written += 1
    except filelock.Timeout:
        pass
    return written


@contextlib.contextmanager
def persistent_compilation_cache(path: str) -> Iterator[str | None]:
    """Within the block, JAX's compiled programs are kept in (and loaded from) ``path``.

    Args:
      path: the cache folder (``~`` expanded, created by JAX; :data:`DEFAULT` means
        ``$DEQJAX_COMPILATION_CACHE_DIR`` when that is set); ``""`` leaves the cache off.

    Yields:
      The folder in use (``None``: no persistent cache), also where JAX's own setting wins.
    """
    before = jax.config.jax_compilation_cache_dir
    folder = folder_of(path)
    if before or not folder:
        yield before or None
        return
    if not has_filelock():
        print(
            "note: no compilation cache for this run: install filelock to share one between runs",
            file=sys.stderr,
        )
        yield None
        return
    give_access_times(folder)
    size_before = jax.config.jax_compilation_cache_max_size
    jax.config.update(
        "jax_compilation_cache_max_size", MAX_BYTES if size_before == -1 else size_before
    )
    jax.config.update("jax_compilation_cache_dir", folder)
    compilation_cache.reset_cache()  # JAX opens its cache once: let it open this folder
    try:
        yield folder
    finally:
        jax.config.update("jax_compilation_cache_dir", before)
        jax.config.update("jax_compilation_cache_max_size", size_before)
        compilation_cache.reset_cache()
