"""Small image-classification sets as standardised, flattened float32 arrays (the init paper's
§4.1 input pipeline): Fashion-MNIST from its idx files, or scikit-learn's bundled 8×8 digits."""

from __future__ import annotations

import numpy as np

from deqjax._src.data.digits import load_digits
from deqjax._src.data.idx import DEFAULT_FASHION_MNIST_DIR, load_fashion_mnist

CLASSIFICATION_SETS = ("fashion_mnist", "digits")


def load_classification(
    dataset: str = "fashion_mnist",
    *,
    data_dir: str | None = None,
    train_size: int = 0,
    test_size: int = 0,
    seed: int = 0,
) -> tuple[dict, dict, str]:
    """Train and test sets as ``{"image": float32 [N, P] standardised, "label": int32 [N]}``.

    Pixels are scaled to ``[0, 1]``, flattened, then standardised with the training subset's
    mean and standard deviation (one scalar each).

    Args:
      dataset: ``"fashion_mnist"`` (idx files in ``data_dir``, default
        ``/usr/share/datasets/fashion-mnist``) or ``"digits"`` (scikit-learn's 8×8 digits).
      data_dir: folder of the idx files (Fashion-MNIST only).
      train_size, test_size: keep a random subset of this many examples (0: all).
      seed: seed of the subsets.

    Returns:
      ``(train, test, source)`` with ``source`` a human-readable description.

    Raises:
      deqjax.data.DataNotFoundError: if the Fashion-MNIST files are missing (names the paths).
      deqjax.data.DataFormatError: if an idx file is garbled (names the file).
      ValueError: for an unknown ``dataset``.
    """
    if dataset == "fashion_mnist":
        splits = [load_fashion_mnist(data_dir, split=s) for s in ("train", "test")]
        source, scale = f"Fashion-MNIST idx files in {data_dir or DEFAULT_FASHION_MNIST_DIR}", 255.0
    elif dataset == "digits":
        splits = [load_digits(split=s) for s in ("train", "test")]
        source, scale = "scikit-learn digits (8x8)", 1.0  # already in [0, 1]
    else:
        raise ValueError(f"dataset must be one of {CLASSIFICATION_SETS}, got {dataset!r}.")
    rng = np.random.default_rng(seed)
    out = []
    for split, size in zip(splits, (train_size, test_size)):
        n = split["label"].shape[0]
        idx = np.sort(rng.permutation(n)[:size]) if 0 < size < n else np.arange(n)
        image = np.asarray(split["image"])[idx].reshape(idx.shape[0], -1).astype(np.float32)
        label = np.asarray(split["label"])[idx].astype(np.int32)
        out.append({"image": image / np.float32(scale), "label": label})
    mean, std = float(out[0]["image"].mean()), float(out[0]["image"].std()) + 1e-6
    for split in out:
        split["image"] = ((split["image"] - mean) / std).astype(np.float32)
    return out[0], out[1], source
