"""Reading TensorBoard event files back: the scalars of a folder, as TensorBoard shows them."""

from __future__ import annotations

import os
import struct

from deqjax._src.training.writers.metric_writer import require
from deqjax._src.training.writers.tensorboard_writer import event_files


def _records(path: str):
    """The records of a TFRecord file (length, its checksum, data, its checksum); a torn last
    record (a killed writer) or a record whose checksums fail ends the file."""
    from tensorboardX.record_writer import masked_crc32c

    with open(path, "rb") as f:
        while True:
            header = f.read(12)
            if len(header) < 12:
                return
            (length,), (length_crc,) = (
                struct.unpack("<Q", header[:8]),
                struct.unpack("<I", header[8:]),
            )
            data, footer = f.read(length), f.read(4)
            if (
                length_crc != masked_crc32c(header[:8])
                or len(data) < length
                or len(footer) < 4
                or struct.unpack("<I", footer)[0] != masked_crc32c(data)
            ):
                return
            yield data


def read_tensorboard(logdir: str | os.PathLike) -> dict[str, list[tuple[int, float]]]:
    """The scalars of the event files in ``logdir``, read as one uninterrupted run.

    Reads the files in name order (the order they were written) with TensorBoard's rules for a
    resumed run: an event marking a session start at step ``s`` (what a writer's ``purge_step``
    writes) drops every earlier value at a step ``>= s``, and a value of a tag at step ``s``
    drops that tag's earlier values at steps ``>= s``.

    Args:
      logdir: the folder of a :class:`~deqjax.training.TensorBoardWriter`.

    Returns:
      ``{tag: [(step, value), ...]}`` in step order.

    Raises:
      ModuleNotFoundError: tensorboardX (whose event protocol buffers it parses) is absent.
    """
    require("tensorboardX", "tensorboardX", "read_tensorboard")
    from tensorboardX.proto.event_pb2 import Event, SessionLog

    series: dict[str, list[tuple[int, float]]] = {}
    for path in event_files(logdir):
        for data in _records(path):
            event = Event.FromString(data)
            step = int(event.step)
            if event.HasField("session_log") and event.session_log.status == SessionLog.START:
                series = {tag: [p for p in points if p[0] < step] for tag, points in series.items()}
            for value in event.summary.value if event.HasField("summary") else ():
                if value.WhichOneof("value") != "simple_value":
                    continue
                points = [p for p in series.get(value.tag, []) if p[0] < step]
                series[value.tag] = points + [(step, float(value.simple_value))]
    return series
