"""Tables of result rows: a CSV file, a Markdown table.

Rows are mappings with the same keys (e.g. one per run of a sweep, or its summary by
:func:`~deqjax.harness.summarize_runs`); floats print with 4 significant digits in Markdown.
"""

from __future__ import annotations

import csv
import os
from collections.abc import Mapping, Sequence
from typing import Any


def write_csv(path: str | os.PathLike, rows: Sequence[Mapping[str, Any]]) -> str:
    """Writes ``rows`` (same keys) as CSV with a header; returns the path."""
    path = os.fspath(path)
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path


def markdown_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str] | None = None) -> str:
    """A Markdown table of ``rows`` (floats with 4 significant digits)."""
    columns = list(columns or rows[0])
    fmt = lambda v: f"{v:.4g}" if isinstance(v, float) else str(v)  # noqa: E731
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(fmt(r.get(c, "")) for c in columns) + " |" for r in rows]
    return "\n".join(lines)
