"""Metrics on the host: one JSON object per logging step in a JSONL file, and a progress bar."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from typing import Any

import numpy as np


def to_python(value: Any) -> Any:
    """numpy / JAX scalars and arrays -> JSON-able Python.

    Non-finite floats are written as the strings ``"nan"``, ``"inf"``, ``"-inf"`` (JSON has no
    literal for them); :func:`read_jsonl` turns them back into floats.
    """
    if isinstance(value, Mapping):
        return {str(k): to_python(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_python(v) for v in value]
    if isinstance(value, (str, bool)) or value is None:
        return value
    arr = np.asarray(value)
    if arr.ndim:
        return [to_python(v) for v in arr.tolist()]
    item = arr.item()
    if isinstance(item, float) and not math.isfinite(item):
        return str(item)
    return item


def _from_json(value: Any) -> Any:
    if value in ("nan", "inf", "-inf"):
        return float(value)
    if isinstance(value, dict):
        return {k: _from_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_from_json(v) for v in value]
    return value


def read_jsonl(path: str | os.PathLike) -> list[dict]:
    """All records of a metrics file (a torn last line, from a killed writer, is ignored)."""
    records = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                records.append(_from_json(json.loads(line)))
            except json.JSONDecodeError:
                continue
    return records


class MetricsWriter:
    """Appends metric records to a JSONL file, one line per record, flushed at once.

    Args:
      path: the JSONL file (its folder is created).
      keep_until_step: when resuming from a checkpoint of step ``s``, pass ``s``: records with
        ``"step" > s`` (logged after that checkpoint by the interrupted run) are dropped, so the
        file reads as one uninterrupted run.
      enabled: False makes every call a no-op (non-zero processes of a multi-host run).
    """

    def __init__(
        self, path: str | os.PathLike, *, keep_until_step: int | None = None, enabled: bool = True
    ):
        self.path = os.fspath(path)
        self.enabled = enabled
        self._file = None
        if not enabled:
            return
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        if keep_until_step is not None and os.path.exists(self.path):
            kept = [r for r in read_jsonl(self.path) if r.get("step", 0) <= keep_until_step]
            tmp = self.path + ".tmp"
            with open(tmp, "w") as f:
                for r in kept:
                    f.write(json.dumps(to_python(r)) + "\n")
            os.replace(tmp, self.path)
        elif keep_until_step is None and os.path.exists(self.path):
            os.remove(self.path)
        self._file = open(self.path, "a")

    def write(self, record: Mapping[str, Any]) -> None:
        if self._file is None:
            return
        self._file.write(json.dumps(to_python(record)) + "\n")
        self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self) -> MetricsWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def format_metrics(metrics: Mapping[str, Any], *, keys: tuple[str, ...] | None = None) -> str:
    """A short ``name=value`` string for progress bars and logs (4 significant digits)."""
    items = metrics.items() if keys is None else ((k, metrics[k]) for k in keys if k in metrics)
    parts = []
    for k, v in items:
        if isinstance(v, float):
            parts.append(f"{k}={v:.4g}")
        elif isinstance(v, (int, str)):
            parts.append(f"{k}={v}")
    return " ".join(parts)


def progress_bar(*, total: int, initial: int = 0, enabled: bool = True, desc: str = "train"):
    """A tqdm bar over steps (disabled, e.g. on non-zero processes, it does nothing)."""
    from tqdm.auto import tqdm

    return tqdm(
        total=total, initial=initial, disable=not enabled, desc=desc, dynamic_ncols=True, leave=True
    )
