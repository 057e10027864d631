"""JAX's persistent compilation cache for the duration of a run (``--compilation_cache``).

A run compiles its train, evaluation and diagnostics programs before its first step: a good part
of a short run on a CPU (BENCHMARKS.md, "The main job's wall time outside the train steps"),
and on an accelerator a larger share of a shorter run.
JAX can keep compiled programs on disk and load them in a later run with the same programs
(``jax_compilation_cache_dir``); it is off unless asked for. The experiment runner asks for it,
in ``~/.cache/deqjax/jax`` by default, and only for the run: the setting before it is restored
after it (a test that calls several experiments in one process sees no cache outside them). A
cache folder set through JAX (``JAX_COMPILATION_CACHE_DIR`` or ``jax.config``) is left as it is.
JAX writes only programs that took at least ``jax_persistent_cache_min_compile_time_secs`` (a
second, JAX's default) to compile, keyed by the program, the JAX and XLA versions and the
devices. The folder is bounded (:data:`MAX_BYTES`: JAX evicts the least recently used programs),
which also makes JAX lock it (``filelock``), so that runs in parallel never read a program
another one is writing.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
from collections.abc import Iterator

import jax
from jax.experimental.compilation_cache import compilation_cache

DEFAULT = "~/.cache/deqjax/jax"
MAX_BYTES = 2**30  # the folder's bound (the main job's programs take about 1 MB)


@contextlib.contextmanager
def persistent_compilation_cache(path: str) -> Iterator[str | None]:
    """Within the block, JAX's compiled programs are kept in (and loaded from) ``path``.

    Args:
      path: the cache folder (``~`` expanded, created by JAX); ``""`` leaves the cache off.

    Yields:
      The folder in use (``None``: no persistent cache), also where JAX's own setting wins.
    """
    before = jax.config.jax_compilation_cache_dir
    if before or not path:
        yield before or None
        return
    folder = os.path.abspath(os.path.expanduser(path))
    size_before = jax.config.jax_compilation_cache_max_size
    compilation_cache.reset_cache()  # JAX opens its cache once: let it open this folder
    jax.config.update("jax_compilation_cache_dir", folder)
    if size_before == -1 and importlib.util.find_spec("filelock") is not None:
        jax.config.update("jax_compilation_cache_max_size", MAX_BYTES)
    try:
        yield folder
    finally:
        jax.config.update("jax_compilation_cache_dir", before)
        jax.config.update("jax_compilation_cache_max_size", size_before)
        compilation_cache.reset_cache()
