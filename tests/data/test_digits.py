"""scikit-learn's digits, split deterministically into train and test."""

import numpy as np
import pytest

from deqjax import data


def test_load_digits_split():
    train, test = data.load_digits(split="train"), data.load_digits(split="test")
    everything = data.load_digits(split="all")
    assert len(train["label"]) + len(test["label"]) == len(everything["label"]) == 1797
    assert train["image"].shape[1:] == (8, 8) and train["image"].dtype == np.float32
    assert 0.0 <= train["image"].min() and train["image"].max() == 1.0
    # Disjoint: no test image appears among the train images.
    train_rows = {row.tobytes() for row in train["image"]}
    assert sum(row.tobytes() in train_rows for row in test["image"]) < 5  # exact duplicates only
    with pytest.raises(ValueError, match="test_fraction"):
        data.load_digits(test_fraction=1.5)
