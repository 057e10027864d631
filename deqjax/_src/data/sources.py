"""Picks a source for a data set name and reports which one it used.

Every loader here returns its data together with a ``source`` line that experiments log (print and
write into their config JSON). Offline stand-ins are opt-in (``allow_standin=True``) and always
labelled: their ``source`` starts with ``"STAND-IN: "`` and ``is_standin`` is true.

Image data sets (``load_image_dataset``), first source that has the data wins:

* ``"cifar10"``: the python pickles under ``data_dir`` → a prepared TFDS ``cifar10`` (or a TFDS
  download when ``download=True`` and the network answers) → with ``allow_standin``, Fashion-MNIST
  (Debian ``dataset-fashion-mnist``) padded to 32×32 and repeated to 3 channels.
* ``"fashion_mnist"``: the idx files (``data_dir``, default the Debian location) → TFDS.
* ``"mnist"``: the idx files under ``data_dir`` → TFDS → with ``allow_standin``, Fashion-MNIST.

Language-modelling corpora (``load_lm_corpus``):

* ``"wikitext-103"`` / ``"wikitext-2"``: ``wiki.*.tokens`` under ``data_dir`` → with
  ``allow_standin``, the King James Bible (Debian ``bible-kjv``).
* ``"kjv"``: the King James Bible (always labelled a stand-in).
* a path: a directory of ``wiki.*.tokens``, a directory of ``{train,valid,test}.txt``, or one text
  file (split 90/5/5).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import NamedTuple

import numpy as np

from deqjax._src.data import cifar10 as _cifar10
from deqjax._src.data import idx as _idx
from deqjax._src.data import kjv as _kjv
from deqjax._src.data import text as _text
from deqjax._src.data import tfds_source as _tfds
from deqjax._src.data import wikitext as _wikitext
from deqjax._src.data.cache import resolve_cache_dir
from deqjax._src.data.errors import DataNotFoundError
from deqjax._src.data.text import LMCorpus

_LOG = logging.getLogger(__name__)

STANDIN_PREFIX = "STAND-IN: "
IMAGE_DATASETS = ("cifar10", "fashion_mnist", "mnist")
LM_CORPORA = ("wikitext-103", "wikitext-2", "kjv")
_NUM_CLASSES = {"cifar10": 10, "fashion_mnist": 10, "mnist": 10}


class ImageDataset(NamedTuple):
    """An image classification data set and where it came from.

    Each split is ``{"image": uint8[N, H, W, C], "label": int32[N]}`` (the layout
    :class:`deqjax.data.ShuffledBatches` takes). ``source`` starts with ``"STAND-IN: "`` exactly
    when ``is_standin`` is true.
    """

    name: str  # the name asked for, e.g. "cifar10"
    source: str  # human-readable origin, logged by experiments
    is_standin: bool
    train: dict[str, np.ndarray]
    test: dict[str, np.ndarray]
    num_classes: int


def pad_to_cifar_shape(images: np.ndarray) -> np.ndarray:
    """Grey 28×28 images ``[N, 28, 28]`` → ``[N, 32, 32, 3]``: zero-pad 2 pixels on each side,
    repeat the channel three times (the Fashion-MNIST stand-in for the CIFAR-10 pipeline)."""
    if images.ndim != 3 or images.shape[1:] != (28, 28):
        raise ValueError(f"images must have shape [N, 28, 28], got {images.shape}.")
    padded = np.pad(images, ((0, 0), (2, 2), (2, 2)))
    return np.ascontiguousarray(np.repeat(padded[..., None], 3, axis=-1))


def _with_channel(split: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    image = split["image"]
    return {"image": image[..., None] if image.ndim == 3 else image, "label": split["label"]}


def _from_upstream_files(name: str, data_dir: str | os.PathLike[str] | None) -> ImageDataset:
    """The data set from its upstream raw files, read with numpy (CIFAR-10 pickles, idx files).

    Raises:
      FileNotFoundError: the files are not there (the message names where it looked).
    """
    if name == "cifar10":
        root = resolve_cache_dir(data_dir)
        splits = _cifar10.load_cifar10(root)
        source = f"CIFAR-10 python pickles ({_cifar10.find_cifar10_dir(root)})"
    else:
        if name == "fashion_mnist":
            root = Path(_idx.DEFAULT_FASHION_MNIST_DIR if data_dir is None else data_dir)
            loader = _idx.load_fashion_mnist
        else:
            root = resolve_cache_dir(data_dir)
            loader = _idx.load_mnist
        splits = {s: _with_channel(loader(root, split=s)) for s in ("train", "test")}
        source = f"{name} idx files ({root})"
    return ImageDataset(name, source, False, splits["train"], splits["test"], _NUM_CLASSES[name])


def _from_tfds(
    name: str, *, data_dir: str | os.PathLike[str] | None, download: bool
) -> ImageDataset:
    """The data set from a prepared TFDS directory, or a TFDS download when asked and online.

    Raises:
      DataNotFoundError: TFDS has no prepared copy (and may not or cannot download one).
    """
    splits, sources = {}, []
    for split in ("train", "test"):
        loaded = _tfds.load_tfds_split(name, split=split, data_dir=data_dir, download=download)
        image = loaded.arrays["image"]
        if image.ndim == 3:
            image = image[..., None]
        splits[split] = {
            "image": np.asarray(image, np.uint8),
            "label": np.asarray(loaded.arrays["label"], np.int32),
        }
        sources.append(loaded.source)
    source = "; ".join(sources)
    return ImageDataset(name, source, False, splits["train"], splits["test"], _NUM_CLASSES[name])


def _standin(name: str, standin_dir: str | os.PathLike[str] | None) -> ImageDataset:
    """Fashion-MNIST standing in for ``"cifar10"`` (padded to 32x32x3) or ``"mnist"``, labelled.

    Raises:
      FileNotFoundError: the Fashion-MNIST idx files are not there either.
    """
    fm = {s: _idx.load_fashion_mnist(standin_dir, split=s) for s in ("train", "test")}
    if name == "cifar10":
        splits = {
            s: {"image": pad_to_cifar_shape(d["image"]), "label": d["label"]} for s, d in fm.items()
        }
        what = "Fashion-MNIST padded to 32x32x3 for CIFAR-10"
    else:
        splits = {s: _with_channel(d) for s, d in fm.items()}
        what = "Fashion-MNIST for MNIST"
    fm_dir = _idx.DEFAULT_FASHION_MNIST_DIR if standin_dir is None else standin_dir
    source = f"{STANDIN_PREFIX}{what} (idx files in {fm_dir}; {name} not found)"
    _LOG.warning("%s", source)
    return ImageDataset(name, source, True, splits["train"], splits["test"], 10)


def load_image_dataset(
    name: str,
    *,
    data_dir: str | os.PathLike[str] | None = None,
    tfds_data_dir: str | os.PathLike[str] | None = None,
    download: bool = False,
    allow_standin: bool = False,
    standin_dir: str | os.PathLike[str] | None = None,
) -> ImageDataset:
    """Loads an image classification data set from the first source that has it.

    Args:
      name: ``"cifar10"``, ``"fashion_mnist"`` or ``"mnist"``.
      data_dir: where the upstream files are (CIFAR-10 pickles, idx files). ``None``: the deqjax
        cache directory for CIFAR-10 and MNIST, the Debian location for Fashion-MNIST.
      tfds_data_dir: TFDS data directory (``None``: ``$TFDS_DATA_DIR`` or
        ``~/tensorflow_datasets``).
      download: let TFDS download when nothing is prepared (only if the network answers; needs
        tensorflow-datasets and TensorFlow).
      allow_standin: fall back to Fashion-MNIST (labelled ``STAND-IN``) for ``cifar10``/``mnist``.
      standin_dir: Fashion-MNIST idx directory for the stand-in (``None``: the Debian location).

    Returns:
      ``ImageDataset``; images uint8 ``[N, H, W, C]`` (``C = 1`` for the MNISTs, ``3`` for CIFAR-10
      and its stand-in), labels int32 ``[N]``.

    Raises:
      ValueError: for an unknown ``name``.
      DataNotFoundError: if no source has the data; the message lists every attempt.
    """
    if name not in IMAGE_DATASETS:
        raise ValueError(f"name must be one of {IMAGE_DATASETS}, got {name!r}.")
    failures: list[str] = []
    try:  # 1. upstream raw files, read with numpy
        return _from_upstream_files(name, data_dir)
    except FileNotFoundError as e:
        failures.append(str(e))
    try:  # 2. TFDS: a prepared directory, or a download when asked and online
        return _from_tfds(name, data_dir=tfds_data_dir, download=download)
    except DataNotFoundError as e:
        failures.append(str(e))
    if name in ("cifar10", "mnist"):  # 3. the labelled offline stand-in
        if not allow_standin:
            failures.append(
                "The Fashion-MNIST stand-in was not allowed (pass allow_standin=True to use it)."
            )
        else:
            try:
                return _standin(name, standin_dir)
            except FileNotFoundError as e:
                failures.append(str(e))
    raise DataNotFoundError(f"No source has {name!r}. Tried, in order:\n\n" + "\n\n".join(failures))


def load_lm_corpus(
    name_or_path: str | os.PathLike[str],
    *,
    data_dir: str | os.PathLike[str] | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    allow_standin: bool = False,
) -> LMCorpus:
    """Loads a language-modelling corpus by name or path and reports its source.

    Args:
      name_or_path: ``"wikitext-103"``, ``"wikitext-2"``, ``"kjv"``, or a path (a directory of
        ``wiki.*.tokens``, a directory of ``{train,valid,test}.txt``, or one UTF-8 text file).
      data_dir: where the WikiText files are (``None``: the deqjax cache directory).
      cache_dir: cache for the KJV text (``None``: the deqjax cache directory).
      allow_standin: use the King James Bible, labelled ``STAND-IN``, when WikiText is missing.

    Returns:
      ``LMCorpus`` (lines of train/valid/test, ``source``, ``is_standin``).

    Raises:
      DataNotFoundError: if the corpus is not found (and no stand-in is allowed or available).
    """
    key = os.fspath(name_or_path)
    if key == "kjv":
        return _kjv.load_kjv(cache_dir=cache_dir)
    if key in _wikitext.WIKITEXT_NAMES:
        root = resolve_cache_dir(data_dir)
        try:
            return _wikitext.load_wikitext(root, name=key)
        except DataNotFoundError as e:
            if not allow_standin:
                raise
            missing = str(e)
        corpus = _kjv.load_kjv(
            cache_dir=cache_dir, standin_for=f"{key} (wiki.*.tokens not found under {root})"
        )
        _LOG.warning("%s\n%s", corpus.source, missing)
        return corpus
    path = Path(key).expanduser()
    if path.is_dir() and _wikitext.find_wikitext_dir(path, name=path.name) is not None:
        return _wikitext.load_wikitext(path, name=path.name)
    if path.exists():
        return _text.load_text_corpus(path)
    raise DataNotFoundError(
        f"Language-modelling corpus {key!r} not found: it is not one of {LM_CORPORA} and no file "
        f"or directory {path} exists. Pass a known name, a directory of wiki.*.tokens or "
        f"{{train,valid,test}}.txt files, or one UTF-8 text file."
    )
