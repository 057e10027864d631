"""The idx reader and writer (gzip or not), upstream file names, Fashion-MNIST from Debian."""

import gzip
import os

import numpy as np
import pytest

from deqjax import data
from deqjax._src.data.idx import DEFAULT_FASHION_MNIST_DIR, load_mnist, read_idx, write_idx


@pytest.mark.parametrize("compress", [False, True])
@pytest.mark.parametrize(
    "array",
    [
        np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4),
        np.array([3, 1, 4, 1, 5], np.uint8),
        np.array([[-7, 70000], [1, 2]], np.int32),
        np.array([0.5, -1.25, 3.0], np.float32),
    ],
)
def test_idx_round_trip(tmp_path, array, compress):
    path = tmp_path / "x-idx"
    write_idx(path, array, compress=compress)
    raw = path.read_bytes()
    assert (raw[:2] == b"\x1f\x8b") == compress
    if not compress:  # the header is the upstream one: 0, 0, dtype code, ndim, big-endian dims
        code = {"uint8": 0x08, "int32": 0x0C, "float32": 0x0D}[array.dtype.name]
        assert raw[:4] == bytes([0, 0, code, array.ndim])
        assert int.from_bytes(raw[4:8], "big") == array.shape[0]
    out = read_idx(path)  # compression detected from content, not from the name
    assert out.dtype == array.dtype and out.shape == array.shape
    np.testing.assert_array_equal(out, array)


def test_idx_rejects_truncated_and_foreign_files(tmp_path):
    images = np.zeros((4, 5, 5), np.uint8)
    good = tmp_path / "a-idx3-ubyte"
    write_idx(good, images)
    truncated = tmp_path / "b-idx3-ubyte"
    truncated.write_bytes(good.read_bytes()[:-7])
    with pytest.raises(ValueError, match="b-idx3-ubyte.*truncated"):
        read_idx(truncated)
    bad_gz = tmp_path / "c.gz"
    bad_gz.write_bytes(gzip.compress(good.read_bytes())[:-10])
    with pytest.raises(ValueError, match="c.gz"):
        read_idx(bad_gz)
    foreign = tmp_path / "d.txt"
    foreign.write_bytes(b"hello world")
    with pytest.raises(ValueError, match="not an idx file"):
        read_idx(foreign)


def _write_split(folder, prefix, n, *, gz):
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
    labels = rng.integers(0, 10, size=(n,), dtype=np.uint8)
    ext = ".gz" if gz else ""
    write_idx(os.path.join(folder, f"{prefix}-images-idx3-ubyte{ext}"), images)
    write_idx(os.path.join(folder, f"{prefix}-labels-idx1-ubyte{ext}"), labels)
    return images, labels


def test_load_idx_dataset_upstream_names(tmp_path):
    images, labels = _write_split(tmp_path, "train", 7, gz=True)
    test_images, _ = _write_split(tmp_path, "t10k", 3, gz=False)
    train = load_mnist(tmp_path, split="train")
    np.testing.assert_array_equal(train["image"], images)
    np.testing.assert_array_equal(train["label"], labels.astype(np.int32))
    assert train["label"].dtype == np.int32
    np.testing.assert_array_equal(load_mnist(tmp_path, split="test")["image"], test_images)
    with pytest.raises(ValueError, match="split"):
        load_mnist(tmp_path, split="validation")


def test_missing_files_name_the_paths_and_the_package(tmp_path):
    with pytest.raises(FileNotFoundError) as info:
        data.load_fashion_mnist(tmp_path / "nowhere", split="train")
    message = str(info.value)
    assert os.path.join(str(tmp_path / "nowhere"), "train-images-idx3-ubyte.gz") in message
    assert os.path.join(str(tmp_path / "nowhere"), "train-labels-idx1-ubyte") in message
    assert "apt-get install dataset-fashion-mnist" in message


@pytest.mark.skipif(
    not os.path.isdir(DEFAULT_FASHION_MNIST_DIR),
    reason="dataset-fashion-mnist not installed",
)
def test_fashion_mnist_from_debian_package():
    test = data.load_fashion_mnist(split="test")
    assert test["image"].shape == (10000, 28, 28) and test["image"].dtype == np.uint8
    np.testing.assert_array_equal(np.bincount(test["label"]), np.full(10, 1000))
