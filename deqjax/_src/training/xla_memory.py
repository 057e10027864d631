"""XLA's planned memory of a compiled function: a proxy for peak activation memory."""

from __future__ import annotations

from typing import Any, Callable

import jax


def compile_with_memory(fn: Callable, *example_args: Any) -> tuple[Any, dict[str, int] | None]:
    """``jax.jit(fn)`` compiled once for ``example_args``, and XLA's memory analysis of it.

    The analysis is ``{"temp_bytes", "argument_bytes", "output_bytes"}``: ``temp_bytes`` is
    ``memory_analysis().temp_size_in_bytes``, the scratch buffers XLA plans for the program
    (activations kept for the backward pass, solver buffers) — a PROXY for peak activation
    memory, not a measured peak. ``None`` on backends without an analysis.

    Returns:
      ``(compiled, analysis)``; ``compiled`` is called with arrays shaped like ``example_args``.
    """
    compiled = jax.jit(fn).lower(*example_args).compile()
    try:
        analysis = compiled.memory_analysis()
    except Exception:  # noqa: BLE001 - backends without memory analysis
        analysis = None
    if analysis is None:
        return compiled, None
    return compiled, {
        "temp_bytes": int(analysis.temp_size_in_bytes),
        "argument_bytes": int(analysis.argument_size_in_bytes),
        "output_bytes": int(analysis.output_size_in_bytes),
    }
