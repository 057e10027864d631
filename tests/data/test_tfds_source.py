"""TFDS: the fail-fast offline check (runs without TFDS), and a real prepared array_record data
set read end to end when tensorflow-datasets is installed."""

from __future__ import annotations

import socket
import sys

import numpy as np
import pytest

from deqjax._src.data import sources, tfds_source
from deqjax._src.data.errors import DataNotFoundError


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
