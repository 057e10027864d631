"""The metrics of a run as a JSONL file: one JSON object per record, append-only."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from typing import Any

from deqjax._src.training.metrics import RESUME, to_python
from deqjax._src.training.writers.metric_writer import claim, writes_here


class JsonlWriter:
    """Appends each record to a JSONL file as one line, flushed at once (a
    :class:`~deqjax.training.MetricWriter`).

    The file is only ever appended to (the overwrite/resume policy of
    :class:`~deqjax.training.RunPolicy`): a resumed run (``open(restored_step=s, ...)``) first
    appends a marker ``{"split": "resume", "step": s}``, and :func:`~deqjax.training.read_jsonl`
    drops the records the interrupted run logged after step ``s``, so the file reads as one
    uninterrupted run while keeping every line ever written. A fresh run over an earlier run's
    file is refused unless ``overwrite``.

    Args:
      path: the JSONL file (its folder is created on :meth:`open`).
      enabled: whether this process writes (None: only JAX's process 0).

    Example:
      >>> w = JsonlWriter("runs/x/metrics.jsonl")
      >>> w.open(restored_step=None, overwrite=False)
      >>> w.write({"split": "train", "step": 10, "loss": 0.5}); w.close()
    """

    def __init__(self, path: str | os.PathLike, *, enabled: bool | None = None):
        self.path = os.fspath(path)
        self._enabled = enabled
        self._open = False
        self._file = None

    def open(self, restored_step: int | None, overwrite: bool) -> None:
        """Claims the file (a fresh run) or continues it after a resume marker (a resumed run).

        Raises:
          FileExistsError: a fresh run finds a non-empty file and ``overwrite`` is not set.
        """
        self.close()
        self._open = True
        if not writes_here(self._enabled):
            return
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        exists = os.path.exists(self.path) and os.path.getsize(self.path) > 0
        claim(
            [self.path] if exists else [],
            restored_step,
            overwrite,
            f"{self.path} holds the metrics",
        )
        self._file = open(self.path, "a")
        if restored_step is not None:
            if exists:
                with open(self.path, "rb") as f:  # a torn last line gets its own line ended
                    f.seek(-1, os.SEEK_END)
                    if f.read(1) != b"\n":
                        self._file.write("\n")
            self.write({"split": RESUME, "step": int(restored_step), "time": time.time()})

    def write(self, record: Mapping[str, Any]) -> None:
        """Appends ``record`` as one line, flushed at once (nan/inf as strings).

        Raises:
          RuntimeError: before :meth:`open`.
        """
        if not self._open:
            raise RuntimeError(f"JsonlWriter({self.path!r}).write before open().")
        if self._file is not None:
            self._file.write(json.dumps(to_python(record)) + "\n")
            self._file.flush()

    def close(self) -> None:
        """Closes the file (if open); the writer may be opened again."""
        self._open = False
        if self._file is not None:
            self._file.close()
            self._file = None
