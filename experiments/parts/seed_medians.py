"""Medians over seeds: one row per setting from the rows of every seed.

The 1D experiment's ``results.md`` (``experiments/synthetic_1d.py``): each run trained with several
seeds, its row the median of every value over them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np


def median_rows(rows: Sequence[Mapping[str, Any]], by: Sequence[str]) -> list[dict]:
    """One row per group of ``by`` values (in first-seen order): those values, then the median
    of every other key of the group's first row (e.g. the median over seeds of each metric).

    Args:
      rows: result rows, each holding the keys ``by`` and numbers under every key of the first
        row of its group.
      by: the keys that name a group (e.g. ``("run",)``).

    Returns:
      The groups' rows.
    """
    groups: dict[tuple, list] = {}
    for r in rows:
        groups.setdefault(tuple(r[k] for k in by), []).append(r)
    out = []
    for key, rs in groups.items():
        values = {k: float(np.median([r[k] for r in rs])) for k in rs[0] if k not in by}
        out.append(dict(zip(by, key)) | values)
    return out
