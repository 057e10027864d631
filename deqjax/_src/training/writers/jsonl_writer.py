"""The metrics of a run as a JSONL file: one JSON object per record, append-only."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from deqjax._src.training.metrics import MetricsWriter
from deqjax._src.training.writers.metric_writer import writes_here


class JsonlWriter:
    """Appends each record to a JSONL file as one line (a :class:`~deqjax.training.MetricWriter`).

    The file is only ever appended to: a resumed run first appends a marker
    ``{"split": "resume", "step": s}`` (``s`` the restored step), and
    :func:`~deqjax.training.read_jsonl` drops the records the interrupted run logged after
    step ``s``, so the file reads as one uninterrupted run while keeping every line ever written.
    A fresh run over an earlier run's file is refused unless ``overwrite``.

    Args:
      path: the JSONL file (its folder is created).
      enabled: whether this process writes (None: only JAX's process 0).

    Raises:
      FileExistsError: from :meth:`open`, for a fresh run on a non-empty file without
        ``overwrite``.

    Example:
      >>> w = JsonlWriter("runs/x/metrics.jsonl")
      >>> w.open(restored_step=None, overwrite=False)
      >>> w.write({"split": "train", "step": 10, "loss": 0.5}); w.close()
    """

    def __init__(self, path: str | os.PathLike, *, enabled: bool | None = None):
        self.path = os.fspath(path)
        self._enabled = enabled
        self._file: MetricsWriter | None = None

    def open(self, restored_step: int | None, overwrite: bool) -> None:
        """Claims the file (fresh run) or continues it after a resume marker (resumed run)."""
        self.close()
        self._file = MetricsWriter(
            self.path,
            keep_until_step=restored_step,
            overwrite=overwrite,
            enabled=writes_here(self._enabled),
        )

    def write(self, record: Mapping[str, Any]) -> None:
        """Appends ``record`` as one line, flushed at once (nan/inf as strings)."""
        if self._file is None:
            raise RuntimeError(f"JsonlWriter({self.path!r}).write before open().")
        self._file.write(record)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
