"""Metrics on the host: the writers the records go to (one JSON object per record in a JSONL
file), reading such a file back, and a progress bar."""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
from collections.abc import Mapping
from typing import Any

import numpy as np


def to_python(value: Any) -> Any:
    """numpy / JAX scalars and arrays -> JSON-able Python.

    Non-finite floats are written as the strings ``"nan"``, ``"inf"``, ``"-inf"`` (JSON has no
    literal for them); :func:`read_jsonl` turns them back into floats. Configuration objects
    are written by their fields so a config file shows every hyper-parameter: a dataclass (e.g.
    a solver object) as ``{"type": class name, field: value, ...}``, a ``functools.partial`` as
    ``{"function": name, keyword: value, ...}``, another function or class by its name.
    """
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
        return {"type": type(value).__name__, **to_python(fields)}
    if isinstance(value, functools.partial):
        name = getattr(value.func, "__qualname__", repr(value.func))
        return {"function": name, **to_python(value.keywords)}
    if callable(value) and hasattr(value, "__qualname__"):
        return value.__qualname__
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


def read_jsonl(path: str | os.PathLike, *, raw: bool = False) -> list[dict]:
    """The records of a metrics file, read as one uninterrupted run.

    The file is append-only: a resumed run appends a marker ``{"split": "resume", "step": s}``
    and then its own records. By default each marker drops the records before it with
    ``"step" > s`` (logged by the interrupted run after its last checkpoint) and is itself
    dropped, so the result reads as one uninterrupted run. A torn last line (from a killed
    writer) is ignored.

    Args:
      path: the JSONL file.
      raw: return every record as written, markers included.
    """
    records: list[dict] = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                record = _from_json(json.loads(line))
            except json.JSONDecodeError:
                continue
            if not raw and record.get("split") == RESUME:
                s = record.get("step", 0)
                records = [r for r in records if r.get("step", 0) <= s]
                continue
            records.append(record)
    return records


RESUME = "resume"


def format_value(value: Any, spec: str = ".4g") -> str:
    """``format(value, spec)`` for numbers, including nan/inf and their JSON strings.

    Final reports format values that may be non-finite (a diverged run) or missing; this never
    raises: ``"nan"`` / ``"inf"`` strings are read as floats, other non-numbers print as given.
    """
    if isinstance(value, str) and value in ("nan", "inf", "-inf"):
        value = float(value)
    if isinstance(value, (bool, np.bool_)) or value is None:
        return str(value)
    try:
        return format(float(value), spec)
    except (TypeError, ValueError):
        return str(value)


def format_metrics(metrics: Mapping[str, Any], *, keys: tuple[str, ...] | None = None) -> str:
    """A short ``name=value`` string for progress bars and logs (4 significant digits)."""
    items = metrics.items() if keys is None else ((k, metrics[k]) for k in keys if k in metrics)
    parts = []
    for k, v in items:
        if isinstance(v, float):
            parts.append(f"{k}={format_value(v)}")
        elif isinstance(v, (int, str)):
            parts.append(f"{k}={v}")
    return " ".join(parts)


def progress_bar(*, total: int, initial: int = 0, enabled: bool = True, desc: str = "train"):
    """A tqdm bar over steps (disabled, e.g. on non-zero processes, it does nothing)."""
    from tqdm.auto import tqdm

    return tqdm(
        total=total, initial=initial, disable=not enabled, desc=desc, dynamic_ncols=True, leave=True
    )
