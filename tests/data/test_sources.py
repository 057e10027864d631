"""The dispatcher: which source has the data, and the labelled offline stand-ins."""

from __future__ import annotations

import numpy as np
import pytest

from deqjax._src.data import sources
from deqjax._src.data.errors import DataNotFoundError
from deqjax._src.data.idx import write_idx
from tests.data.conftest import needs_bible


@pytest.fixture
def tiny_fashion_mnist(tmp_path):
    """Four idx files in the upstream Fashion-MNIST layout (5 train, 2 test images)."""
    rng = np.random.default_rng(1)
    d = tmp_path / "fm"
    d.mkdir()
    arrays = {}
    for prefix, n in (("train", 5), ("t10k", 2)):
        images = rng.integers(1, 256, (n, 28, 28), dtype=np.uint8)  # no zeros: border check below
        labels = rng.integers(0, 10, n).astype(np.uint8)
        write_idx(d / f"{prefix}-images-idx3-ubyte.gz", images)
        write_idx(d / f"{prefix}-labels-idx1-ubyte.gz", labels)
        arrays[prefix] = (images, labels)
    return d, arrays


def test_cifar_standin_is_padded_fashion_mnist_and_labelled(tiny_fashion_mnist, tmp_path):
    fm_dir, arrays = tiny_fashion_mnist
    kwargs = dict(data_dir=tmp_path / "none", tfds_data_dir=tmp_path / "none", standin_dir=fm_dir)
    with pytest.raises(DataNotFoundError) as err:
        sources.load_image_dataset("cifar10", **kwargs)
    assert "allow_standin=True" in str(err.value) and "data_batch_1" in str(err.value)
    ds = sources.load_image_dataset("cifar10", allow_standin=True, **kwargs)
    assert ds.is_standin
    assert ds.source.startswith("STAND-IN: Fashion-MNIST padded to 32x32x3 for CIFAR-10")
    images, labels = arrays["train"]
    assert ds.train["image"].shape == (5, 32, 32, 3) and ds.train["image"].dtype == np.uint8
    for c in range(3):
        np.testing.assert_array_equal(ds.train["image"][:, 2:30, 2:30, c], images)
    border = np.ones((32, 32), bool)
    border[2:30, 2:30] = False
    assert not ds.train["image"][:, border].any()
    np.testing.assert_array_equal(ds.train["label"], labels)
    assert ds.test["image"].shape == (2, 32, 32, 3)


def test_fashion_mnist_from_idx_files(tiny_fashion_mnist, tmp_path):
    fm_dir, arrays = tiny_fashion_mnist
    ds = sources.load_image_dataset("fashion_mnist", data_dir=fm_dir, tfds_data_dir=tmp_path)
    assert not ds.is_standin and "idx files" in ds.source
    np.testing.assert_array_equal(ds.test["image"][..., 0], arrays["t10k"][0])
    with pytest.raises(ValueError, match="name"):
        sources.load_image_dataset("imagenet")


@needs_bible
def test_wikitext_missing_falls_back_to_labelled_kjv(kjv_cache, tmp_path):
    cache, corpus = kjv_cache
    standin = sources.load_lm_corpus(
        "wikitext-103", data_dir=tmp_path, cache_dir=cache, allow_standin=True
    )
    assert standin.is_standin and standin.source.startswith("STAND-IN: ")
    assert "wikitext-103" in standin.source and standin.train == corpus.train
