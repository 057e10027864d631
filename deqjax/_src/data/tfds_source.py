"""TensorFlow Datasets (TFDS) as a data source: prepared data first, downloads only on request.

Order of attempts in :func:`load_tfds_split`:

1. A **prepared** data set under ``data_dir`` (``<data_dir>/<name>/<version>/dataset_info.json``,
   found by looking at the disk, without TFDS). It is read with ``tfds.builder_from_directory``:
   with TensorFlow installed through ``as_dataset`` (any file format); without TensorFlow through
   ``as_data_source``, which reads only the ``array_record`` format (TFDS's default format,
   ``tfrecord``, then needs TensorFlow, and the error says so).
2. Only if ``download=True``: a **network check** first (:func:`network_available`, a TCP connect
   with a short timeout in a background thread, so a hanging DNS lookup cannot stall it). Offline,
   fail at once: ``tfds.load`` would otherwise retry its downloads for minutes. Online, and with
   TensorFlow installed (TFDS builds data sets only with TensorFlow), ``tfds.load(download=True)``.
3. Otherwise :class:`DataNotFoundError` naming the directories looked at and how to prepare them.

Install: ``pip install tensorflow-datasets`` (a few MB, reads array_record data) and additionally
``tensorflow-cpu`` (about 1.4 GB) to build/download data sets or read tfrecord ones.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import socket
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from deqjax._src.data.errors import DataNotFoundError, missing_data_message

#: Hosts tried by :func:`network_available` by default (TFDS's own storage).
DEFAULT_PROBE_HOSTS = ("storage.googleapis.com",)
_VERSION_DIR = re.compile(r"^\d+\.\d+\.\d+$")


class TFDSSplit(NamedTuple):
    """One split read through TFDS, as host numpy arrays, and where it came from."""

    arrays: dict[str, np.ndarray]  # feature name -> [N, ...] array
    source: str  # logged by experiments
    info: Any  # the tfds.core.DatasetInfo (features, num_classes, supervised_keys)


def tfds_default_data_dir() -> Path:
    """TFDS's default data directory: ``$TFDS_DATA_DIR`` or ``~/tensorflow_datasets``."""
    env = os.environ.get("TFDS_DATA_DIR")
    return Path(env).expanduser() if env else Path.home() / "tensorflow_datasets"


def tensorflow_available() -> bool:
    """Whether TensorFlow can be imported (checked without importing it)."""
    return importlib.util.find_spec("tensorflow") is not None


def network_available(
    hosts: Sequence[str] = DEFAULT_PROBE_HOSTS, *, port: int = 443, timeout_s: float = 2.0
) -> bool:
    """Whether any of ``hosts`` accepts a TCP connection on ``port`` within ``timeout_s``.

    Name resolution and the connection run in a daemon thread that is waited on for at most
    ``timeout_s`` in total, so the check never blocks longer even where DNS hangs.

    Args:
      hosts: host names (or addresses) to try, in order; the first that answers wins.
      port: TCP port.
      timeout_s: overall limit in seconds; must be positive.

    Returns:
      ``True`` if a connection was made, else ``False``.

    Raises:
      ValueError: if ``timeout_s <= 0``.
    """
    if not timeout_s > 0:
        raise ValueError(f"timeout_s must be positive, got {timeout_s}.")
    result = threading.Event()

    def probe() -> None:
        for host in hosts:
            try:
                with socket.create_connection((host, port), timeout=timeout_s):
                    result.set()
                    return
            except OSError:
                continue

    thread = threading.Thread(target=probe, name="deqjax-network-probe", daemon=True)
    thread.start()
    thread.join(timeout_s)
    return result.is_set()


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def find_prepared_tfds(name: str, data_dir: str | os.PathLike[str]) -> Path | None:
    """The prepared version directory of TFDS data set ``name`` under ``data_dir``, or ``None``.

    Args:
      name: ``"cifar10"``, ``"cifar10:3.0.2"`` or ``"<name>/<config>[:<version>]"``.
      data_dir: a TFDS data directory (the parent of ``<name>/``).

    Returns:
      ``<data_dir>/<name>[/<config>]/<version>`` holding ``dataset_info.json``: the requested
      version, or the highest one present.
    """
    base, _, version = name.partition(":")
    root = Path(data_dir).expanduser() / base
    if not root.is_dir():
        return None
    versions = [
        d.name
        for d in root.iterdir()
        if d.is_dir() and _VERSION_DIR.match(d.name) and (d / "dataset_info.json").is_file()
    ]
    if version:
        return root / version if version in versions else None
    return root / max(versions, key=_version_key) if versions else None


def _import_tfds(what: str) -> Any:
    try:
        return importlib.import_module("tensorflow_datasets")
    except ImportError as e:
        raise DataNotFoundError(
            f"{what} needs tensorflow-datasets, which is not installed: "
            f"`pip install tensorflow-datasets` (reads prepared array_record data) and "
            f"`pip install tensorflow-cpu` as well to build, download or read tfrecord data "
            f"(or `pip install deqjax[tfds]`)."
        ) from e


def _stack(examples: Sequence[dict[str, Any]]) -> dict[str, np.ndarray]:
    if not examples:
        return {}
    return {key: np.stack([np.asarray(ex[key]) for ex in examples]) for key in examples[0]}


def read_prepared_tfds(version_dir: str | os.PathLike[str], *, split: str) -> TFDSSplit:
    """Reads one split of a prepared TFDS data set directory into numpy arrays.

    Args:
      version_dir: ``<data_dir>/<name>/<version>`` (see :func:`find_prepared_tfds`).
      split: a TFDS split name (``"train"``, ``"test"``, slicing like ``"train[:10%]"`` too).

    Returns:
      ``TFDSSplit``; every feature stacked along a new leading axis.

    Raises:
      DataNotFoundError: if tensorflow-datasets is missing, or the files are tfrecord and
        TensorFlow is missing.
    """
    tfds = _import_tfds(f"Reading the prepared TFDS data set in {version_dir}")
    builder = tfds.builder_from_directory(os.fspath(version_dir))
    fmt = getattr(builder.info.file_format, "value", str(builder.info.file_format))
    if tensorflow_available():
        arrays = tfds.as_numpy(builder.as_dataset(split=split, batch_size=-1))
        arrays = {k: np.asarray(v) for k, v in arrays.items()}
        how = "tfds.builder_from_directory + as_dataset"
    elif fmt == "array_record":
        data_source = builder.as_data_source(split=split)
        arrays = _stack(data_source.__getitems__(list(range(len(data_source)))))
        how = "tfds.builder_from_directory + as_data_source (no TensorFlow)"
    else:
        raise DataNotFoundError(
            f"The prepared TFDS data set in {version_dir} is stored as {fmt!r}; without "
            f"TensorFlow, TFDS reads only 'array_record'. `pip install tensorflow-cpu`, or "
            f"re-prepare it with file_format='array_record'."
        )
    return TFDSSplit(
        arrays, f"TFDS {builder.info.full_name} [{split}] from {version_dir} ({how})", builder.info
    )


def load_tfds_split(
    name: str,
    *,
    split: str,
    data_dir: str | os.PathLike[str] | None = None,
    download: bool = False,
    probe_hosts: Sequence[str] = DEFAULT_PROBE_HOSTS,
    probe_timeout_s: float = 2.0,
) -> TFDSSplit:
    """Loads one split of a TFDS data set into numpy arrays, downloading only when asked and online.

    Args:
      name: TFDS name, optionally with config and version (``"cifar10"``, ``"cifar10:3.0.2"``).
      split: split name (``"train"``, ``"test"``, ...).
      data_dir: TFDS data directory; ``None``: ``$TFDS_DATA_DIR`` or ``~/tensorflow_datasets``.
      download: allow ``tfds.load(..., download=True)`` when nothing is prepared. Checked against
        the network first (see the module docstring).
      probe_hosts: hosts for the network check; include the data set's own download host when you
        know it (the default only shows that the network answers at all).
      probe_timeout_s: limit of the network check in seconds.

    Returns:
      ``TFDSSplit`` with the arrays and a ``source`` line to log.

    Raises:
      DataNotFoundError: nothing prepared and no download asked; download asked but offline;
        tensorflow-datasets (or, where needed, TensorFlow) missing. Raised within about
        ``probe_timeout_s`` seconds in the offline case, before TFDS is imported.
    """
    root = tfds_default_data_dir() if data_dir is None else Path(data_dir).expanduser()
    version_dir = find_prepared_tfds(name, root)
    if version_dir is not None:
        return read_prepared_tfds(version_dir, split=split)
    base = name.partition(":")[0]
    looked_for = [root / base / "<version>" / "dataset_info.json"]
    if not download:
        raise DataNotFoundError(
            missing_data_message(
                f"Prepared TFDS data set {name!r}",
                looked_for,
                f"On a machine with network and TensorFlow, run `tfds build {base} "
                f"--data_dir <dir>` (or pass download=True) and copy <dir> here; add "
                f"--file_format=array_record to make it readable without TensorFlow.",
            )
        )
    if not network_available(probe_hosts, timeout_s=probe_timeout_s):
        raise DataNotFoundError(
            missing_data_message(
                f"TFDS data set {name!r}",
                looked_for,
                f"download=True was given, but the network does not answer (no TCP connection to "
                f"{', '.join(probe_hosts)} within {probe_timeout_s} s). Not calling tfds.load, "
                f"which retries for minutes offline. Prepare the data on a machine with network "
                f"(`tfds build {base} --data_dir <dir>`) and copy <dir> here.",
            )
        )
    tfds = _import_tfds(f"Downloading TFDS data set {name!r}")
    if not tensorflow_available():
        raise DataNotFoundError(
            f"Downloading and preparing TFDS data set {name!r} needs TensorFlow "
            f"(`pip install tensorflow-cpu`); without it TFDS only reads prepared array_record "
            f"data."
        )
    arrays, info = tfds.load(
        name, split=split, data_dir=os.fspath(root), download=True, batch_size=-1, with_info=True
    )
    arrays = {k: np.asarray(v) for k, v in tfds.as_numpy(arrays).items()}
    return TFDSSplit(arrays, f"TFDS {info.full_name} [{split}] downloaded to {root}", info)
