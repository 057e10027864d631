"""scikit-learn's digits, split deterministically into train and test."""

import sys

import numpy as np
import pytest

from deqjax import data
from deqjax._src.data.errors import DataNotFoundError


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


def test_without_scikit_learn_the_error_names_the_install(monkeypatch, capsys, tmp_path):
    monkeypatch.setitem(sys.modules, "sklearn.datasets", None)  # import fails as if absent
    with pytest.raises(DataNotFoundError, match="pip install scikit-learn"):
        data.load_digits()
    # The main job's usage line: exit 2 with the message, not a raw ModuleNotFoundError.
    from experiments import fashion_mnist

    argv = ["--smoke", "--dataset", "digits", "--out_dir", str(tmp_path), "--no_progress"]
    with pytest.raises(SystemExit) as stop:
        fashion_mnist.main(argv)
    assert stop.value.code == 2
    assert "pip install scikit-learn" in capsys.readouterr().err
