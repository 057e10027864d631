"""Data: the idx reader (gzip or not), Fashion-MNIST from the Debian package, digits, batching."""

import gzip
import os

import numpy as np
import pytest

from deqjax import data


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
    data.write_idx(path, array, compress=compress)
    raw = path.read_bytes()
    assert (raw[:2] == b"\x1f\x8b") == compress
    if not compress:  # the header is the upstream one: 0, 0, dtype code, ndim, big-endian dims
        code = {"uint8": 0x08, "int32": 0x0C, "float32": 0x0D}[array.dtype.name]
        assert raw[:4] == bytes([0, 0, code, array.ndim])
        assert int.from_bytes(raw[4:8], "big") == array.shape[0]
    out = data.read_idx(path)  # compression detected from content, not from the name
    assert out.dtype == array.dtype and out.shape == array.shape
    np.testing.assert_array_equal(out, array)


def test_idx_rejects_truncated_and_foreign_files(tmp_path):
    images = np.zeros((4, 5, 5), np.uint8)
    good = tmp_path / "a-idx3-ubyte"
    data.write_idx(good, images)
    truncated = tmp_path / "b-idx3-ubyte"
    truncated.write_bytes(good.read_bytes()[:-7])
    with pytest.raises(ValueError, match="b-idx3-ubyte.*truncated"):
        data.read_idx(truncated)
    bad_gz = tmp_path / "c.gz"
    bad_gz.write_bytes(gzip.compress(good.read_bytes())[:-10])
    with pytest.raises(ValueError, match="c.gz"):
        data.read_idx(bad_gz)
    foreign = tmp_path / "d.txt"
    foreign.write_bytes(b"hello world")
    with pytest.raises(ValueError, match="not an idx file"):
        data.read_idx(foreign)


def _write_split(folder, prefix, n, *, gz):
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
    labels = rng.integers(0, 10, size=(n,), dtype=np.uint8)
    ext = ".gz" if gz else ""
    data.write_idx(os.path.join(folder, f"{prefix}-images-idx3-ubyte{ext}"), images)
    data.write_idx(os.path.join(folder, f"{prefix}-labels-idx1-ubyte{ext}"), labels)
    return images, labels


def test_load_idx_dataset_upstream_names(tmp_path):
    images, labels = _write_split(tmp_path, "train", 7, gz=True)
    test_images, _ = _write_split(tmp_path, "t10k", 3, gz=False)
    train = data.load_mnist(tmp_path, split="train")
    np.testing.assert_array_equal(train["image"], images)
    np.testing.assert_array_equal(train["label"], labels.astype(np.int32))
    assert train["label"].dtype == np.int32
    np.testing.assert_array_equal(data.load_mnist(tmp_path, split="test")["image"], test_images)
    with pytest.raises(ValueError, match="split"):
        data.load_mnist(tmp_path, split="validation")


def test_missing_files_name_the_paths_and_the_package(tmp_path):
    with pytest.raises(FileNotFoundError) as info:
        data.load_fashion_mnist(tmp_path / "nowhere", split="train")
    message = str(info.value)
    assert os.path.join(str(tmp_path / "nowhere"), "train-images-idx3-ubyte.gz") in message
    assert os.path.join(str(tmp_path / "nowhere"), "train-labels-idx1-ubyte") in message
    assert "apt-get install dataset-fashion-mnist" in message


@pytest.mark.skipif(
    not os.path.isdir(data.DEFAULT_FASHION_MNIST_DIR),
    reason="dataset-fashion-mnist not installed",
)
def test_fashion_mnist_from_debian_package():
    test = data.load_fashion_mnist(split="test")
    assert test["image"].shape == (10000, 28, 28) and test["image"].dtype == np.uint8
    np.testing.assert_array_equal(np.bincount(test["label"]), np.full(10, 1000))


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


def _ids(n):
    return {"id": np.arange(n), "x": np.arange(n) * 10.0}


def test_batches_cover_each_epoch_once_and_are_deterministic():
    it = data.ShuffledBatches(_ids(103), batch_size=10, seed=5)
    assert it.steps_per_epoch == 10
    epoch0 = np.concatenate([next(it)["id"] for _ in range(10)])
    assert len(set(epoch0.tolist())) == 100  # no repeats; 3 left out this epoch
    assert it.state == data.IteratorState(0, 10)
    epoch1 = np.concatenate([next(it)["id"] for _ in range(10)])
    assert it.state == data.IteratorState(1, 10)
    assert not np.array_equal(epoch0, epoch1)  # reshuffled
    again = data.ShuffledBatches(_ids(103), batch_size=10, seed=5)
    np.testing.assert_array_equal(np.concatenate([next(again)["id"] for _ in range(10)]), epoch0)
    other = data.ShuffledBatches(_ids(103), batch_size=10, seed=6)
    assert not np.array_equal(next(other)["id"], epoch0[:10])
    batch = next(data.ShuffledBatches(_ids(103), batch_size=10, seed=5))
    np.testing.assert_array_equal(batch["x"], batch["id"] * 10.0)  # arrays stay aligned


def test_batches_resume_from_state():
    it = data.ShuffledBatches(_ids(50), batch_size=8, seed=1)
    for _ in range(9):
        next(it)
    saved = it.state
    expected = [next(it)["id"] for _ in range(7)]
    resumed = data.ShuffledBatches(_ids(50), batch_size=8, seed=1)
    resumed.restore(saved._asdict())  # as stored in checkpoint JSON
    for want in expected:
        np.testing.assert_array_equal(next(resumed)["id"], want)


def test_batches_shard_over_processes():
    arrays = _ids(64)
    whole = data.ShuffledBatches(arrays, batch_size=12, seed=2, process_index=0, process_count=1)
    parts = [
        data.ShuffledBatches(arrays, batch_size=12, seed=2, process_index=p, process_count=3)
        for p in range(3)
    ]
    assert parts[0].local_batch_size == 4
    for _ in range(7):  # crosses an epoch boundary (5 steps per epoch)
        want = next(whole)["id"]
        got = np.concatenate([next(p)["id"] for p in parts])
        np.testing.assert_array_equal(got, want)
    with pytest.raises(ValueError, match="divisible by process_count"):
        data.ShuffledBatches(arrays, batch_size=10, seed=0, process_index=0, process_count=3)
    with pytest.raises(ValueError, match="batch_size"):
        data.ShuffledBatches(arrays, batch_size=65, seed=0, process_index=0, process_count=1)


def test_eval_batches_pad_and_mask():
    arrays = _ids(23)
    seen = []
    counts = []
    for p in range(2):
        batches = list(data.eval_batches(arrays, batch_size=10, process_index=p, process_count=2))
        counts.append(len(batches))
        for batch, mask in batches:
            assert batch["id"].shape == (5,) and mask.dtype == np.float32
            seen.extend(batch["id"][mask > 0].tolist())
    assert counts == [3, 3]
    assert sorted(seen) == list(range(23))
