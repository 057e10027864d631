"""Metrics on the host: the writers the records go to (one JSON object per record in a JSONL
file), reading such a file back, and a progress bar."""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import time
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

import numpy as np

from deqjax._src.training.run_policy import RunPolicy


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


@runtime_checkable
class MetricWriter(Protocol):
    """Where :func:`~deqjax.training.fit` sends its records (e.g. :class:`JsonlWriter`)."""

    def open(self, restored_step: int | None, overwrite: bool) -> None:
        """Before the first record: ``restored_step`` is the step a resumed run continues
        from (None: a fresh run, which may replace an earlier run's records only with
        ``overwrite``)."""

    def write(self, record: Mapping[str, Any]) -> None:
        """One record (a flat dict with ``"split"`` and ``"step"``)."""

    def close(self) -> None:
        """After the last record (also after an error)."""


class JsonlWriter:
    """Appends the records to a JSONL file, one line per record, flushed at once (process 0).

    The file is only ever appended to (the overwrite/resume policy of
    :mod:`~deqjax._src.training.run_policy`): a resumed run (``open(restored_step=s, ...)``)
    first appends a marker ``{"split": "resume", "step": s}``; :func:`read_jsonl` uses it to drop
    the records the interrupted run logged after step ``s``, so the file reads as one
    uninterrupted run while keeping every line ever written.

    Args:
      path: the JSONL file (its folder is created on :meth:`open`).
      enabled: False makes every call a no-op (default: only process 0 writes).

    Example:
      >>> writer = JsonlWriter("runs/x/metrics.jsonl")
      >>> writer.open(restored_step=None, overwrite=False); writer.write({"split": "train"})
    """

    def __init__(self, path: str | os.PathLike, *, enabled: bool | None = None):
        self.path = os.fspath(path)
        if enabled is None:
            import jax

            enabled = jax.process_index() == 0
        self.enabled = bool(enabled)
        self._file = None

    def open(self, restored_step: int | None, overwrite: bool) -> None:
        """Opens the file for appending (see the class docstring).

        Raises:
          FileExistsError: a fresh run (``restored_step`` None) finds a non-empty file and
            ``overwrite`` is not set.
        """
        if not self.enabled:
            return
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        exists = os.path.exists(self.path) and os.path.getsize(self.path) > 0
        policy = RunPolicy(resume=restored_step is not None, overwrite=overwrite)
        refuse = lambda: FileExistsError(  # noqa: E731
            f"{self.path} holds the metrics of an earlier run; resume it, or pass "
            f"overwrite=True (--overwrite) to replace it."
        )
        for path in policy.to_delete([self.path] if exists else [], refuse):
            os.remove(path)
        self._file = open(self.path, "a")
        if restored_step is not None:
            if exists:
                with open(self.path, "rb") as f:  # a torn last line gets its own line ended
                    f.seek(-1, os.SEEK_END)
                    if f.read(1) != b"\n":
                        self._file.write("\n")
            self.write({"split": RESUME, "step": int(restored_step), "time": time.time()})

    def write(self, record: Mapping[str, Any]) -> None:
        """Appends ``record`` as one line (nothing before :meth:`open` or when disabled)."""
        if self._file is None:
            return
        self._file.write(json.dumps(to_python(record)) + "\n")
        self._file.flush()

    def close(self) -> None:
        """Closes the file (if open)."""
        if self._file is not None:
            self._file.close()
            self._file = None


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
