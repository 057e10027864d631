"""The metrics of a run as TensorBoard event files, written through tensorboardX (no TensorFlow)."""

from __future__ import annotations

import glob
import os
import time
from typing import Any

from deqjax._src.training.writers.metric_writer import ScalarWriter, claim, require

EVENT_FILE_PATTERN = "events.out.tfevents.*"


def event_files(logdir: str | os.PathLike) -> list[str]:
    """The TensorBoard event files directly in ``logdir``, in the order TensorBoard reads them
    (by name: their names start with the second they were opened)."""
    return sorted(glob.glob(os.path.join(os.fspath(logdir), EVENT_FILE_PATTERN)))


class TensorBoardWriter(ScalarWriter):
    """Writes every numeric field of each record as a TensorBoard scalar (a
    :class:`~deqjax.training.MetricWriter`).

    A record ``{"split": "train", "step": 100, "loss": 0.3, "accuracy": 0.9}`` becomes the
    scalars ``train/loss`` and ``train/accuracy`` at step 100 (:func:`scalars` says which fields
    are kept). Each :meth:`open` starts a new event file in ``logdir``, so the folder is
    append-only like the JSONL file: a resumed run from step ``s`` writes its file with a
    ``purge_step`` of ``s + 1``, which TensorBoard reads as "hide the earlier files' events after
    step ``s``" (and a later value of a tag at a step it already has replaces it), so the folder
    shows one uninterrupted run; :func:`~deqjax.training.read_tensorboard` reads it so. A fresh
    run over an earlier run's event files is refused unless ``overwrite`` (which deletes them and
    only them). Each record is flushed to the file at once (what tensorboardX's writer thread had
    not yet written when the process was killed is lost).

    Args:
      logdir: the folder of the event files (created), e.g. ``<run folder>/tensorboard``;
        ``tensorboard --logdir <it or a folder above>`` shows it.
      enabled: whether this process writes (None: only JAX's process 0).

    Raises:
      ModuleNotFoundError: tensorboardX is not installed (it names ``pip install tensorboardX``).
      FileExistsError: from :meth:`open`, for a fresh run over event files without ``overwrite``.

    Example:
      >>> w = TensorBoardWriter("runs/x/tensorboard")
      >>> w.open(restored_step=None, overwrite=False)
      >>> w.write({"split": "train", "step": 10, "loss": 0.5}); w.close()
    """

    def __init__(self, logdir: str | os.PathLike, *, enabled: bool | None = None):
        require("tensorboardX", "tensorboardX", "TensorBoardWriter")
        super().__init__(enabled)
        self.logdir = self.label = os.fspath(logdir)

    def _start(self, restored_step: int | None, overwrite: bool) -> Any:
        """A new event file: a fresh run's (claiming the folder) or a resumed run's."""
        from tensorboardX import SummaryWriter

        found = event_files(self.logdir)
        claim(found, restored_step, overwrite, f"{self.logdir} holds the TensorBoard events")
        return SummaryWriter(
            self.logdir,
            purge_step=None if restored_step is None else int(restored_step) + 1,
            # Files of one second (a quick resume) stay distinct and in the order written.
            filename_suffix=f".{time.time_ns()}",
        )

    def _send(self, step: int, values: dict[str, float]) -> None:
        """Adds the scalars at ``step``, and flushes."""
        wall_time = time.time()
        for tag, value in values.items():
            self._sink.add_scalar(tag, value, global_step=step, walltime=wall_time)
        self._sink.flush()

    def _stop(self) -> None:
        self._sink.close()
