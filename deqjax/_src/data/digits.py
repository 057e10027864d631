"""scikit-learn's ``load_digits``: 1797 real 8×8 digits, for fast tests and smoke runs."""

from __future__ import annotations

import numpy as np

from deqjax._src.data.errors import DataNotFoundError


def load_digits(*, split: str = "train", test_fraction: float = 0.25, seed: int = 0) -> dict:
    """The UCI optical digits shipped inside scikit-learn, split deterministically.

    Args:
      split: ``"train"``, ``"test"`` or ``"all"``.
      test_fraction: share of examples held out for ``"test"`` (in (0, 1)).
      seed: seed of the split permutation (the same seed gives the same split everywhere).

    Returns:
      ``{"image": float32[N, 8, 8] in [0, 1], "label": int32[N]}``.

    Raises:
      ValueError: on a bad ``split`` or ``test_fraction``.
      DataNotFoundError: where scikit-learn, which ships the digits, is not installed (the
        message names the install).
    """
    if split not in ("train", "test", "all"):
        raise ValueError(f"split must be 'train', 'test' or 'all', got {split!r}.")
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}.")
    try:
        from sklearn.datasets import load_digits as _sk_load_digits
    except ImportError:
        raise DataNotFoundError(
            "the digits data set ships inside scikit-learn, which is not installed: "
            "pip install scikit-learn (or pip install -e '.[test]'). The main job's default "
            "data set, Fashion-MNIST (--dataset fashion_mnist), needs no extra package."
        ) from None

    bunch = _sk_load_digits()
    images = (np.asarray(bunch.images, np.float32) / np.float32(16.0)).astype(np.float32)
    labels = np.asarray(bunch.target, np.int32)
    if split == "all":
        return {"image": images, "label": labels}
    order = np.random.default_rng(seed).permutation(labels.shape[0])
    num_test = int(round(test_fraction * labels.shape[0]))
    idx = order[:num_test] if split == "test" else order[num_test:]
    idx = np.sort(idx)
    return {"image": images[idx], "label": labels[idx]}
