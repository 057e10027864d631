"""Data sources (issue 8): readers on small files in the upstream formats, the KJV stand-in, the
dispatcher's source labels, and TFDS (fail-fast offline check without TFDS; a real prepared
array_record data set read end to end when tensorflow-datasets is installed)."""

from __future__ import annotations

import pickle
import shutil
import socket
import sys

import numpy as np
import pytest

from deqjax._src.data import kjv as kjv_lib
from deqjax._src.data import sources, tfds_source
from deqjax._src.data import text as text_lib
from deqjax._src.data.cifar10 import (
    CIFAR10_TEST_FILES,
    CIFAR10_TRAIN_FILES,
    load_cifar10,
    read_cifar10_batch,
)
from deqjax._src.data.errors import DataNotFoundError
from deqjax._src.data.idx import write_idx
from deqjax._src.data.wikitext import load_wikitext

HAVE_BIBLE = shutil.which("bible") is not None
needs_bible = pytest.mark.skipif(
    not HAVE_BIBLE, reason="`bible` not installed (Debian: apt-get install bible-kjv)"
)


# --- CIFAR-10 python pickles ----------------------------------------------------------------------


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


# --- Fashion-MNIST stand-in for CIFAR-10 ----------------------------------------------------------


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


# --- WikiText-103 and plain text ------------------------------------------------------------------


_WIKI = {
    "train": " \n = Valkyria Chronicles III = \n \n Senjō no Valkyria 3 : <unk> Chronicles is a "
    "tactical role @-@ playing video game . \n \n = = Gameplay = = \n \n The game 's battle system "
    "was carried over . \n",
    "valid": " \n = Homarus gammarus = \n \n Homarus gammarus is a species of clawed lobster . \n",
    "test": " \n = Robert Boulter = \n \n Robert Boulter is an English film actor . \n",
}


@pytest.fixture
def wiki_dir(tmp_path):
    d = tmp_path / "data" / "wikitext-103"
    d.mkdir(parents=True)
    for split, body in _WIKI.items():
        (d / f"wiki.{split}.tokens").write_text(body, encoding="utf-8")
    return d


def test_wikitext_reader(wiki_dir):
    corpus = load_wikitext(wiki_dir.parent)
    assert corpus.train == [
        "= Valkyria Chronicles III =",
        "Senjō no Valkyria 3 : <unk> Chronicles is a tactical role @-@ playing video game .",
        "= = Gameplay = =",
        "The game 's battle system was carried over .",
    ]
    assert corpus.valid[1].startswith("Homarus gammarus is") and len(corpus.test) == 2
    assert not corpus.is_standin and corpus.name == "wikitext-103"
    # The same files through the dispatcher, by name (data_dir) and by path.
    by_name = sources.load_lm_corpus("wikitext-103", data_dir=wiki_dir.parent)
    by_path = sources.load_lm_corpus(wiki_dir)
    assert by_name.train == by_path.train == corpus.train
    assert "wiki.*.tokens" in by_name.source and not by_path.is_standin


def test_wikitext_missing_without_standin(tmp_path):
    with pytest.raises(DataNotFoundError) as err:
        sources.load_lm_corpus("wikitext-103", data_dir=tmp_path)
    msg = str(err.value)
    assert "wiki.train.tokens" in msg and str(tmp_path) in msg and "bible-kjv" in msg


def test_text_file_split_and_directory(tmp_path):
    lines = [f"line number {i}" for i in range(100)]
    f = tmp_path / "book.txt"
    f.write_text("\n\n".join(lines) + "\n", encoding="utf-8")  # blank lines are dropped
    corpus = sources.load_lm_corpus(f)
    assert (len(corpus.train), len(corpus.valid), len(corpus.test)) == (90, 5, 5)
    assert corpus.train + corpus.valid + corpus.test == lines  # contiguous, in order
    assert corpus.name == "book" and not corpus.is_standin
    d = tmp_path / "splits"
    d.mkdir()
    for split, body in (("train", "a b\nc"), ("valid", "d"), ("test", " e \n")):
        (d / f"{split}.txt").write_text(body, encoding="utf-8")
    corpus = sources.load_lm_corpus(d)
    assert (corpus.train, corpus.valid, corpus.test) == (["a b", "c"], ["d"], ["e"])
    with pytest.raises(DataNotFoundError, match="not found"):
        sources.load_lm_corpus(tmp_path / "missing.txt")
    with pytest.raises(ValueError, match="valid_fraction"):
        text_lib.split_lines(lines, valid_fraction=1.5)
    with pytest.raises(ValueError, match="too few"):
        text_lib.split_lines(lines[:3])


# --- King James Bible stand-in --------------------------------------------------------------------


def test_kjv_parse_wrapped_output_and_chapter_split():
    # `bible` without -f wraps long verses; continuation lines must join the verse before them.
    out = "Ge1:1 In the beginning\n  God created.\nGe1:2 And the earth.\nGe2:1 Thus the heavens.\n"
    verses = kjv_lib.parse_verses(out)
    assert verses == [
        ("Ge", 1, 1, "In the beginning God created."),
        ("Ge", 1, 2, "And the earth."),
        ("Ge", 2, 1, "Thus the heavens."),
    ]
    verses = [("B", c, 1, f"chapter {c}") for c in range(7)]
    train, valid, test = kjv_lib.split_kjv(verses, holdout_every=3)
    assert (train, valid, test) == (
        ["chapter 0", "chapter 3", "chapter 6"],
        ["chapter 1", "chapter 4"],
        ["chapter 2", "chapter 5"],
    )
    with pytest.raises(ValueError, match="holdout_every"):
        kjv_lib.split_kjv(verses, holdout_every=2)


def test_kjv_missing_program_names_the_package(tmp_path):
    with pytest.raises(DataNotFoundError) as err:
        kjv_lib.load_kjv(cache_dir=tmp_path, bible_executable="no-such-bible-program")
    assert "bible-kjv" in str(err.value) and str(tmp_path) in str(err.value)


@pytest.fixture(scope="module")
def kjv_cache(tmp_path_factory):
    if not HAVE_BIBLE:
        pytest.skip("`bible` not installed (Debian: apt-get install bible-kjv)")
    cache = tmp_path_factory.mktemp("kjv_cache")
    return cache, kjv_lib.load_kjv(cache_dir=cache)


@needs_bible
def test_kjv_standin(kjv_cache):
    cache, corpus = kjv_cache
    assert corpus.is_standin and corpus.source.startswith("STAND-IN: King James Bible")
    assert corpus.train[0] == "In the beginning God created the heaven and the earth."
    total = len(corpus.train) + len(corpus.valid) + len(corpus.test)
    assert total == kjv_lib.KJV_NUM_VERSES
    # Chapters 18 and 19 (0-based), Genesis 19 and 20, open valid and test: about 90/5/5 overall.
    assert corpus.valid[0].startswith("And there came two angels to Sodom")
    assert corpus.test[0].startswith("And Abraham journeyed from thence")
    assert 0.04 < len(corpus.valid) / total < 0.06 and 0.04 < len(corpus.test) / total < 0.06
    words = sum(len(line.split()) for line in corpus.train + corpus.valid + corpus.test)
    assert 780_000 < words < 800_000  # ~790k words (DESIGN.md)


@needs_bible
def test_kjv_cache_is_used_and_repaired(kjv_cache, tmp_path):
    cache, corpus = kjv_cache
    path = kjv_lib.kjv_cache_path(cache)
    assert path.is_file()
    # A cached copy is enough: no `bible` program needed the second time, same split.
    again = kjv_lib.load_kjv(cache_dir=cache, bible_executable="no-such-bible-program")
    assert again == corpus
    # A truncated cache file is detected and regenerated.
    other = tmp_path / "cache2"
    shutil.copytree(cache, other)
    broken = kjv_lib.kjv_cache_path(other)
    broken.write_text(path.read_text(encoding="utf-8")[:10_000], encoding="utf-8")
    assert kjv_lib.load_kjv(cache_dir=other).train == corpus.train


@needs_bible
def test_wikitext_missing_falls_back_to_labelled_kjv(kjv_cache, tmp_path):
    cache, corpus = kjv_cache
    standin = sources.load_lm_corpus(
        "wikitext-103", data_dir=tmp_path, cache_dir=cache, allow_standin=True
    )
    assert standin.is_standin and standin.source.startswith("STAND-IN: ")
    assert "wikitext-103" in standin.source and standin.train == corpus.train


# --- TFDS: fail-fast network check (runs without TFDS) --------------------------------------------


def test_network_probe_true_for_listening_socket_false_for_invalid_host():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        port = server.getsockname()[1]
        assert tfds_source.network_available(("127.0.0.1",), port=port, timeout_s=2.0)
    # ".invalid" never resolves (RFC 2606); a closed local port refuses at once.
    assert not tfds_source.network_available(("no-such-host.invalid",), timeout_s=1.0)
    assert not tfds_source.network_available(("127.0.0.1",), port=port, timeout_s=1.0)
    with pytest.raises(ValueError, match="timeout_s"):
        tfds_source.network_available(timeout_s=0.0)


@pytest.fixture
def no_tfds(monkeypatch):
    """Makes `import tensorflow_datasets` fail, as on a machine without it."""
    monkeypatch.setitem(sys.modules, "tensorflow_datasets", None)


def test_tfds_download_offline_fails_fast_before_importing_tfds(no_tfds, monkeypatch, tmp_path):
    probes = []

    def offline(hosts, *, timeout_s):
        probes.append((tuple(hosts), timeout_s))
        return False

    monkeypatch.setattr(tfds_source, "network_available", offline)
    with pytest.raises(DataNotFoundError) as err:
        tfds_source.load_tfds_split("cifar10", split="train", data_dir=tmp_path, download=True)
    msg = str(err.value)
    # The offline message (not the "install tensorflow-datasets" one): TFDS was never imported.
    assert "network does not answer" in msg and "Not calling tfds.load" in msg
    assert probes == [(tfds_source.DEFAULT_PROBE_HOSTS, 2.0)]
    # Through the dispatcher: the offline failure is listed, then the stand-in refusal.
    with pytest.raises(DataNotFoundError) as err:
        sources.load_image_dataset(
            "cifar10", data_dir=tmp_path, tfds_data_dir=tmp_path, download=True
        )
    assert "network does not answer" in str(err.value) and "allow_standin" in str(err.value)
    assert len(probes) == 2


def test_tfds_not_prepared_without_download_needs_no_network(no_tfds, monkeypatch, tmp_path):
    monkeypatch.setattr(tfds_source, "network_available", pytest.fail)  # must not be called
    with pytest.raises(DataNotFoundError) as err:
        tfds_source.load_tfds_split("cifar10", split="train", data_dir=tmp_path)
    assert "tfds build cifar10" in str(err.value) and str(tmp_path / "cifar10") in str(err.value)


def test_tfds_prepared_dir_found_but_tfds_missing(no_tfds, tmp_path):
    for version in ("1.0.0", "3.0.2", "10.0.0"):
        (tmp_path / "cifar10" / version).mkdir(parents=True)
        (tmp_path / "cifar10" / version / "dataset_info.json").write_text("{}")
    (tmp_path / "cifar10" / "99.0.0").mkdir()  # no dataset_info.json: not prepared
    assert tfds_source.find_prepared_tfds("cifar10", tmp_path).name == "10.0.0"  # numeric order
    assert tfds_source.find_prepared_tfds("cifar10:3.0.2", tmp_path).name == "3.0.2"
    assert tfds_source.find_prepared_tfds("cifar10:2.0.0", tmp_path) is None
    assert tfds_source.find_prepared_tfds("mnist", tmp_path) is None
    with pytest.raises(DataNotFoundError, match="pip install tensorflow-datasets"):
        tfds_source.load_tfds_split("cifar10", split="train", data_dir=tmp_path)


# --- TFDS: the real code path on a tiny prepared array_record data set ----------------------------


def test_tfds_prepared_array_record_end_to_end(tmp_path, monkeypatch):
    tfds = pytest.importorskip(
        "tensorflow_datasets", reason="tensorflow-datasets not installed (pip install it to run)"
    )
    rng = np.random.default_rng(3)
    data = {
        "train": (rng.integers(0, 256, (6, 32, 32, 3), dtype=np.uint8), rng.integers(0, 10, 6)),
        "test": (rng.integers(0, 256, (4, 32, 32, 3), dtype=np.uint8), rng.integers(0, 10, 4)),
    }

    # Named "cifar10" so the dispatcher finds it; not registered, so TFDS's own cifar10 is
    # untouched. Tensor features (not Image) because encoding PNGs needs TensorFlow.
    class TinyCifar(tfds.core.GeneratorBasedBuilder, skip_registration=True):
        name = "cifar10"
        VERSION = tfds.core.Version("1.0.0")

        def _info(self):
            return tfds.core.DatasetInfo(
                builder=self,
                features=tfds.features.FeaturesDict(
                    {
                        "id": np.int64,
                        "image": tfds.features.Tensor(shape=(32, 32, 3), dtype=np.uint8),
                        "label": tfds.features.ClassLabel(num_classes=10),
                    }
                ),
            )

        def _split_generators(self, dl_manager):
            return {split: self._generate_examples(split) for split in data}

        def _generate_examples(self, split):
            images, labels = data[split]
            for i in range(images.shape[0]):
                yield i, {"id": i, "image": images[i], "label": int(labels[i])}

    TinyCifar(data_dir=tmp_path, file_format="array_record").download_and_prepare()
    monkeypatch.setattr(tfds_source, "network_available", pytest.fail)  # prepared: no network

    loaded = tfds_source.load_tfds_split("cifar10", split="train", data_dir=tmp_path)
    order = np.argsort(loaded.arrays["id"])  # TFDS shuffles examples when writing
    np.testing.assert_array_equal(loaded.arrays["image"][order], data["train"][0])
    np.testing.assert_array_equal(loaded.arrays["label"][order], data["train"][1])
    assert "cifar10/1.0.0" in loaded.source and str(tmp_path) in loaded.source

    ds = sources.load_image_dataset("cifar10", data_dir=tmp_path / "none", tfds_data_dir=tmp_path)
    assert not ds.is_standin and ds.source.startswith("TFDS cifar10/1.0.0 [train]")
    assert ds.test["image"].shape == (4, 32, 32, 3) and ds.test["label"].dtype == np.int32
    assert sorted(ds.test["label"].tolist()) == sorted(data["test"][1].tolist())
