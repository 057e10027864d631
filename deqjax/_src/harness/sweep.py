"""Sweeps' tables: the grid of runs, and their rows summarised by group.

:func:`grid` lists one configuration per run (e.g. init family × scale × seed) and
:func:`summarize_runs` groups the rows of their results (median, mean, min, max of one value).
What trains the runs is the experiment's own.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np


def grid(**axes: Sequence[Any]) -> list[dict]:
    """Every combination of the axes' values, one dict each, the last axis varying fastest:
    ``grid(family=("gaussian", "goe"), seed=(0, 1))`` gives four runs."""
    runs: list[dict] = [{}]
    for name, values in axes.items():
        runs = [run | {name: value} for run in runs for value in values]
    return runs


def summarize_runs(
    rows: Sequence[Mapping[str, Any]],
    by: Sequence[str],
    value: str = "test_error",
    *,
    name: str = "error",
    means: Sequence[str] = ("test_nfe",),
) -> list[dict]:
    """One row per group of ``by`` values (in first-seen order): ``n``, ``median_<name>``,
    ``mean_<name>``, ``min_<name>``, ``max_<name>`` of ``value`` and ``mean_<m>`` of ``means``."""
    groups: dict[tuple, list] = {}
    for r in rows:
        groups.setdefault(tuple(r[k] for k in by), []).append(r)
    out = []
    for key, rs in groups.items():
        v = np.array([r[value] for r in rs], dtype=np.float64)
        row = dict(zip(by, key)) | {"n": int(v.size)}
        row |= {f"median_{name}": float(np.median(v)), f"mean_{name}": float(np.mean(v))}
        row |= {f"min_{name}": float(np.min(v)), f"max_{name}": float(np.max(v))}
        row |= {f"mean_{m}": float(np.mean([r[m] for r in rs])) for m in means if m in rs[0]}
        out.append(row)
    return out
