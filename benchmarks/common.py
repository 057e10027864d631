"""Helpers shared by the benchmark scripts: timing, a random tanh DEQ layer, Markdown tables."""

from __future__ import annotations

import platform
import re
import statistics
import time
from typing import Any, Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from deqjax._src import precision


def time_fn(fn: Callable[..., Any], *args: Any, repeats: int = 10) -> float:
    """Median wall time in seconds of ``fn(*args)`` after one warm-up call (compiles)."""
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def tanh_layer(d: int, batch: int, radius: float, seed: int = 0, dtype=jnp.float32):
    """Parameters and inputs of ``f(z) = tanh(W z + U x + b)``; W has spectral radius ``radius``."""
    rng = np.random.default_rng(seed)
    w = rng.normal(size=(d, d))
    w *= radius / np.max(np.abs(np.linalg.eigvals(w)))
    params = {
        "W": jnp.asarray(w, dtype),
        "U": jnp.asarray(rng.normal(size=(d, d)) / np.sqrt(d), dtype),
        "b": jnp.asarray(0.1 * rng.normal(size=d), dtype),
    }
    x = jnp.asarray(rng.normal(size=(batch, d)), dtype)
    return params, x


# With emulate_tf32(True), the benchmark cells round their product operands as an NVIDIA GPU does
# at JAX's default precision (TF32: 10 mantissa bits), unless the precision traced is full: the CPU
# then reproduces a GPU's numbers (its residual floors, not its times).
_EMULATE_TF32 = [False]


def emulate_tf32(on: bool) -> None:
    """Makes the benchmark cells emulate TF32 products (or not)."""
    _EMULATE_TF32[0] = bool(on)


def round_tf32(a):
    """``a`` rounded as a TF32 product rounds its operands (10 mantissa bits), unless the matmul
    precision in force while it is traced is full."""
    if precision.is_full(precision.ambient()):
        return a
    return jax.lax.reduce_precision(a, exponent_bits=8, mantissa_bits=10)


def product_operand(a):
    """``a`` as a product's operand: :func:`round_tf32` under :func:`emulate_tf32`, else
    itself."""
    return round_tf32(a) if _EMULATE_TF32[0] else a


def tanh_cell(p, x, z):
    """One example: ``tanh(W z + U x + b)`` for z, x of shape [d]."""
    return jnp.tanh(p["W"] @ z + p["U"] @ x + p["b"])


def count_fusions(hlo_text: str) -> int:
    """XLA fusions (kernels) in the text of a compiled program, or of one of its computations."""
    return len(re.findall(r" fusion\(", hlo_text))


def machine() -> str:
    """A one-line description of where the numbers were taken."""
    dev = jax.devices()[0]
    return (
        f"jax {jax.__version__}, {dev.platform} ({dev.device_kind}), "
        f"{len(jax.devices())} device(s), python {platform.python_version()}"
    )


Format = str | Callable[[Any], str]  # a format spec such as ".1f", or value -> text


def _cell(value: Any, fmt: Format) -> str:
    return fmt(value) if callable(fmt) else format(value, fmt)


def markdown_row(cells: Sequence[Any], formats: Sequence[Format] | None = None) -> str:
    """One Markdown table line ``| a | b |``, each cell ``format(cell, spec)`` or ``spec(cell)``.

    Args:
      cells: the values of the line, in column order.
      formats: one format spec (``".1f"``; ``""``: as an f-string prints it) or callable per cell.
    """
    formats = formats if formats is not None else [""] * len(cells)
    return "| " + " | ".join(_cell(v, f) for v, f in zip(cells, formats, strict=True)) + " |"


def markdown_header(columns: Sequence[str], align: str | None = None) -> list[str]:
    """The header line and the rule line of a Markdown table.

    Args:
      columns: the column titles.
      align: one letter per column, ``"l"`` (rule ``---``) or ``"r"`` (``---:``), or one letter
        for every column; ``None``: the compact rule ``|---|---|``.
    """
    if align is None:
        rule = "|" + "---|" * len(columns)
    else:
        align = align * len(columns) if len(align) == 1 else align
        if len(align) != len(columns) or set(align) - set("lr"):
            raise ValueError(f"align {align!r}: one of 'l', 'r' per column ({len(columns)})")
        rule = markdown_row(["---:" if a == "r" else "---" for a in align])
    return [markdown_row(columns), rule]


def markdown_section(title: str, columns: Sequence[str], align: str | None = None) -> list[str]:
    """A blank line, ``title``, a blank line, then the header and rule of a table under it."""
    return ["", title, "", *markdown_header(columns, align)]


def markdown_table(
    rows: Sequence[Mapping[str, Any]],
    columns: Sequence[str],
    formats: Mapping[str, Format] | None = None,
    align: str | None = None,
) -> list[str]:
    """The lines of a Markdown table: header, rule, then ``row[column]`` of every row.

    Args:
      rows: one mapping per line, column title -> value.
      columns: the column titles, in order.
      formats: column title -> format spec or callable; a column not named prints as an f-string.
      align: see :func:`markdown_header`.
    """
    formats = formats or {}
    specs = [formats.get(c, "") for c in columns]
    body = [markdown_row([r[c] for c in columns], specs) for r in rows]
    return markdown_header(columns, align) + body


def emit(lines: Sequence[str], out: str | None = None) -> str:
    """Prints the lines as one text and, when ``out`` is given, writes it there too."""
    text = "\n".join(lines)
    print(text)
    if out:
        with open(out, "w") as fh:
            fh.write(text + "\n")
    return text
