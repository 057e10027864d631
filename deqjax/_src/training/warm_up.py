"""Programs compiled in the background while the train step compiles and runs.

A training run compiles three programs: the train step (first), the evaluation step (first used at
the end of the first epoch) and the diagnostics step (first used after ``diagnostics_every``
steps). Compiled one after the other on first use they add their compile times to the run
(BENCHMARKS.md, "The main job's wall time outside the train steps"). XLA
compiles a program on one host thread, so :func:`compile_in_background` lowers and compiles the
later ones on threads of their own from the start: their compilation overlaps the train step's,
and the first call finds its program in JAX's cache (a lowered-and-compiled ``pmap``/``jit``
program is the one its call runs). JAX's settings that a ``with`` block makes local to the calling
thread (``jax.default_matmul_precision``, ``jax.numpy_dtype_promotion``,
``jax.numpy_rank_promotion``, ``jax.enable_x64``) are carried to the background thread; were
another one to differ, its program would differ from the call's, which then compiles its own on
first use, as it would have without the warm-up (the background's work wasted, never used).
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
from collections.abc import Callable, Sequence
from typing import Any

import jax

PyTree = Any
THREAD_NAME = "deqjax-warm-up"  # each background compilation's thread


def abstract(tree: PyTree) -> PyTree:
    """``tree``'s arrays as ``jax.ShapeDtypeStruct`` (shape, dtype and sharding): what lowering
    needs, taken before the arrays are donated or deleted."""

    def spec(a: Any) -> Any:
        if isinstance(a, jax.Array):
            return jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding)
        return a

    return jax.tree_util.tree_map(spec, tree)


def _thread_settings() -> list[contextlib.AbstractContextManager]:
    """Context managers that set, in another thread, the tracing settings in force in this one."""
    config = jax.config
    return [
        jax.default_matmul_precision(config.jax_default_matmul_precision),
        jax.numpy_dtype_promotion(config.jax_numpy_dtype_promotion),
        jax.numpy_rank_promotion(config.jax_numpy_rank_promotion),
        jax.enable_x64(bool(config.jax_enable_x64)),
    ]


class Background:
    """One program compiling on a thread of its own; :meth:`wait` before its first call, and
    before the process exits (an interpreter that exits while XLA compiles on another thread
    aborts: the action that started it waits in its ``close``).

    A failure to lower or compile in the background is not raised there: the first call then
    compiles (and raises) as it would have without the warm-up.
    """

    def __init__(self, fn: Any, args: Sequence[PyTree]):
        context = contextvars.copy_context()  # the caller's context variables, e.g. deqjax's
        settings = _thread_settings()
        self._thread = threading.Thread(
            target=context.run,
            args=(self._compile, fn, [abstract(a) for a in args], settings),
            name=THREAD_NAME,
            daemon=True,
        )
        self._thread.start()

    @staticmethod
    def _compile(fn: Any, args: list[PyTree], settings: list) -> None:
        try:
            with contextlib.ExitStack() as stack:
                for setting in settings:
                    stack.enter_context(setting)
                fn.lower(*args).compile()
        except Exception:  # noqa: BLE001 -- the first call compiles and reports instead
            pass

    def wait(self) -> None:
        """Blocks until the background compilation ended (at once after the first wait)."""
        self._thread.join()


def compile_in_background(jobs: Sequence[tuple[Any, Sequence[PyTree]] | None]) -> list[Callable]:
    """Starts one :class:`Background` per ``(jitted or pmapped fn, example args)`` job (``None``:
    nothing); returns their ``wait`` functions (a no-op for ``None``)."""
    waits: list[Callable] = []
    for job in jobs:
        waits.append(Background(*job).wait if job is not None else (lambda: None))
    return waits
