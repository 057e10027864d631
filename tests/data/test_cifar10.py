"""The CIFAR-10 reader on small files in the upstream python-pickle format."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from deqjax._src.data import sources
from deqjax._src.data.cifar10 import (
    CIFAR10_TEST_FILES,
    CIFAR10_TRAIN_FILES,
    load_cifar10,
    read_cifar10_batch,
)
from deqjax._src.data.errors import DataNotFoundError


def _write_cifar_batch(path, images, labels):
    """Writes a batch exactly as the upstream archive does: bytes keys, [N, 3072] uint8 rows holding
    the red plane, then green, then blue (each row-major), protocol-2 pickle."""
    data = images.transpose(0, 3, 1, 2).reshape(images.shape[0], 3072)
    batch = {
        b"batch_label": b"testing batch 1 of 1",
        b"labels": [int(v) for v in labels],
        b"data": np.ascontiguousarray(data, np.uint8),
        b"filenames": [f"img_{i}.png".encode() for i in range(images.shape[0])],
    }
    with open(path, "wb") as f:
        pickle.dump(batch, f, protocol=2)


@pytest.fixture
def cifar_dir(tmp_path):
    """A cifar-10-batches-py directory with 3 images per batch; returns (root, expected)."""
    rng = np.random.default_rng(0)
    root = tmp_path / "cifar"
    batch_dir = root / "cifar-10-batches-py"
    batch_dir.mkdir(parents=True)
    expected = {}
    for split, names in (("train", CIFAR10_TRAIN_FILES), ("test", CIFAR10_TEST_FILES)):
        imgs, labs = [], []
        for name in names:
            images = rng.integers(0, 256, (3, 32, 32, 3), dtype=np.uint8)
            labels = rng.integers(0, 10, 3)
            _write_cifar_batch(batch_dir / name, images, labels)
            imgs.append(images)
            labs.append(labels)
        expected[split] = (np.concatenate(imgs), np.concatenate(labs))
    return root, expected


def test_cifar_batch_channel_layout(tmp_path):
    # One image whose red plane is a ramp, green constant 7, blue the transposed ramp: the reader
    # must put R/G/B in the last axis and keep rows/columns in place.
    ramp = (np.arange(32 * 32) % 256).reshape(32, 32).astype(np.uint8)
    image = np.stack([ramp, np.full_like(ramp, 7), ramp.T], axis=-1)[None]
    _write_cifar_batch(tmp_path / "b", image, [9])
    out = read_cifar10_batch(tmp_path / "b")
    assert out["image"].shape == (1, 32, 32, 3) and out["image"].dtype == np.uint8
    np.testing.assert_array_equal(out["image"][0, :, :, 0], ramp)
    np.testing.assert_array_equal(out["image"][0, :, :, 1], 7)
    np.testing.assert_array_equal(out["image"][0, :, :, 2], ramp.T)
    assert out["label"].dtype == np.int32 and out["label"].tolist() == [9]


def test_cifar_reader_and_dispatcher(cifar_dir, tmp_path):
    root, expected = cifar_dir
    for data_dir in (root, root / "cifar-10-batches-py"):
        splits = load_cifar10(data_dir)
        for split, (images, labels) in expected.items():
            np.testing.assert_array_equal(splits[split]["image"], images)
            np.testing.assert_array_equal(splits[split]["label"], labels)
    assert splits["train"]["image"].shape == (15, 32, 32, 3)
    ds = sources.load_image_dataset("cifar10", data_dir=root, tfds_data_dir=tmp_path / "none")
    assert not ds.is_standin and "CIFAR-10 python pickles" in ds.source
    assert ds.num_classes == 10 and ds.test["image"].shape == (3, 32, 32, 3)


def test_cifar_bad_and_missing_files(tmp_path):
    bad = tmp_path / "bad"
    with open(bad, "wb") as f:
        pickle.dump({b"data": np.zeros((2, 100), np.uint8), b"labels": [0, 1]}, f)
    with pytest.raises(ValueError, match="3072"):
        read_cifar10_batch(bad)
    with pytest.raises(DataNotFoundError) as err:
        load_cifar10(tmp_path / "nowhere")
    msg = str(err.value)
    assert "cifar-10-batches-py" in msg and "cifar-10-python.tar.gz" in msg
