"""Numpy reader for CIFAR-10's python pickles (the ``cifar-10-python.tar.gz`` archive, extracted).

The archive extracts to ``cifar-10-batches-py/`` with ``data_batch_1`` .. ``data_batch_5`` (10,000
training images each), ``test_batch`` (10,000) and ``batches.meta``. Each batch is a pickled dict
(written by Python 2, so its keys are ``bytes``) with ``b"data"``: uint8 ``[10000, 3072]``, each row
one image as 1024 red, then 1024 green, then 1024 blue values in row-major order, and
``b"labels"``: a list of 10,000 ints in ``[0, 10)``.

Pickles can run code when loaded: read only files you trust (the upstream archive).
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any

import numpy as np

from deqjax._src.data.errors import DataNotFoundError, missing_data_message

CIFAR10_DIRNAME = "cifar-10-batches-py"
CIFAR10_TRAIN_FILES = tuple(f"data_batch_{i}" for i in range(1, 6))
CIFAR10_TEST_FILES = ("test_batch",)
CIFAR10_CLASSES = (
    "airplane",
    "automobile",
    "bird",
    "cat",
    "deer",
    "dog",
    "frog",
    "horse",
    "ship",
    "truck",
)
CIFAR10_HOW_TO_GET = (
    "Download the CIFAR-10 'python version' archive (cifar-10-python.tar.gz) from the CIFAR-10 "
    "page of the University of Toronto, extract it with `tar xzf cifar-10-python.tar.gz`, and pass "
    "the directory that contains cifar-10-batches-py/ (or that directory itself) as data_dir. "
    "Alternatively prepare the TFDS 'cifar10' data set, or allow the labelled Fashion-MNIST "
    "stand-in (allow_standin=True; Debian: apt-get install dataset-fashion-mnist)."
)


def _get(batch: dict[Any, Any], key: str) -> Any:
    """``batch[key]`` for either ``bytes`` keys (the upstream Python 2 pickles) or ``str`` keys."""
    if key.encode() in batch:
        return batch[key.encode()]
    if key in batch:
        return batch[key]
    raise ValueError(f"CIFAR-10 batch has no {key!r} entry; keys are {sorted(map(str, batch))}.")


def read_cifar10_batch(path: str | os.PathLike[str]) -> dict[str, np.ndarray]:
    """Reads one CIFAR-10 python batch file.

    Args:
      path: a ``data_batch_<i>`` or ``test_batch`` file.

    Returns:
      ``{"image": uint8[N, 32, 32, 3] (channels last), "label": int32[N]}``, the layout of
      :func:`deqjax.data.load_fashion_mnist`.

    Raises:
      ValueError: if the file is not a CIFAR-10 batch (wrong keys, shapes or label range).
    """
    with open(path, "rb") as f:
        batch = pickle.load(f, encoding="bytes")
    if not isinstance(batch, dict):
        raise ValueError(f"{path}: expected a pickled dict, got {type(batch).__name__}.")
    data = np.asarray(_get(batch, "data"))
    labels = np.asarray(_get(batch, "labels"), dtype=np.int64)
    if data.ndim != 2 or data.shape[1] != 3 * 32 * 32:
        raise ValueError(f"{path}: 'data' must have shape [N, 3072], got {data.shape}.")
    if data.dtype != np.uint8:
        raise ValueError(f"{path}: 'data' must be uint8, got {data.dtype}.")
    if labels.shape != (data.shape[0],):
        raise ValueError(
            f"{path}: {labels.shape[0] if labels.ndim else 0} labels for {data.shape[0]} images."
        )
    if labels.size and (labels.min() < 0 or labels.max() >= len(CIFAR10_CLASSES)):
        raise ValueError(
            f"{path}: labels must lie in [0, 10), got [{labels.min()}, {labels.max()}]."
        )
    images = data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)  # [N, 32, 32, 3]
    return {"image": np.ascontiguousarray(images), "label": labels.astype(np.int32)}


def find_cifar10_dir(data_dir: str | os.PathLike[str]) -> Path | None:
    """The directory holding the CIFAR-10 batch files: ``data_dir`` itself or its
    ``cifar-10-batches-py`` subdirectory; ``None`` if neither holds all six batch files."""
    root = Path(data_dir).expanduser()
    for candidate in (root / CIFAR10_DIRNAME, root):
        files = CIFAR10_TRAIN_FILES + CIFAR10_TEST_FILES
        if all((candidate / name).is_file() for name in files):
            return candidate
    return None


def cifar10_looked_for(data_dir: str | os.PathLike[str]) -> list[Path]:
    """The paths :func:`find_cifar10_dir` checks, for error messages."""
    root = Path(data_dir).expanduser()
    return [root / CIFAR10_DIRNAME / "data_batch_1", root / "data_batch_1"]


def load_cifar10(data_dir: str | os.PathLike[str]) -> dict[str, dict[str, np.ndarray]]:
    """Loads CIFAR-10 from its python pickles.

    Args:
      data_dir: a directory containing ``cifar-10-batches-py/``, or that directory itself.

    Returns:
      ``{"train": split, "test": split}``, each split ``{"image": uint8[N, 32, 32, 3],
      "label": int32[N]}`` (50,000 and 10,000 images for the upstream files).

    Raises:
      DataNotFoundError: if the batch files are not there; the message says how to get them.
    """
    directory = find_cifar10_dir(data_dir)
    if directory is None:
        raise DataNotFoundError(
            missing_data_message(
                "CIFAR-10 (python pickles)", cifar10_looked_for(data_dir), CIFAR10_HOW_TO_GET
            )
        )
    out = {}
    for split, names in (("train", CIFAR10_TRAIN_FILES), ("test", CIFAR10_TEST_FILES)):
        parts = [read_cifar10_batch(directory / name) for name in names]
        out[split] = {key: np.concatenate([p[key] for p in parts]) for key in ("image", "label")}
    return out
