"""The metric writers: the JSONL file, TensorBoard event files (read back and checked value by
value, step by step, across a resume) and W&B (absent: a clear error; else a stand-in module)."""

from __future__ import annotations

import json
import os
import sys
import types

import numpy as np
import pytest

from deqjax import training
from deqjax._src.training.writers.metric_writer import scalars
from deqjax._src.training.writers.tensorboard_writer import event_files


def _run(writer, records, *, restored_step=None, overwrite=False):
    writer.open(restored_step, overwrite)
    try:
        for record in records:
            writer.write(record)
    finally:
        writer.close()


def _train(step, loss):
    return {"split": "train", "step": step, "loss": np.float32(loss), "epoch": step / 4}


def test_every_writer_is_a_metric_writer(tmp_path):
    for writer in (
        training.JsonlWriter(tmp_path / "m.jsonl"),
        training.TensorBoardWriter(tmp_path / "tb"),
    ):
        assert isinstance(writer, training.MetricWriter)


def test_scalars_keeps_numeric_fields_under_split_and_name():
    step, values = scalars(
        {
            "split": "eval",
            "step": np.int64(7),
            "accuracy": np.float32(0.5),
            "count": 449,
            "nan": float("nan"),
            "stopped": True,
            "name": "x",
            "curve": np.ones(3),
            "none": None,
        }
    )
    assert step == 7 and set(values) == {"eval/accuracy", "eval/count", "eval/nan", "eval/stopped"}
    assert values["eval/accuracy"] == 0.5 and values["eval/stopped"] == 1.0
    assert np.isnan(values["eval/nan"])
    assert scalars({"step": 1, "loss": 2.0}) == (1, {"loss": 2.0})
    with pytest.raises(ValueError, match="int 'step'"):
        scalars({"split": "train", "loss": 1.0})


def test_jsonl_writer_keeps_the_metrics_writer_semantics(tmp_path):
    path = tmp_path / "run" / "metrics.jsonl"
    writer = training.JsonlWriter(path)
    with pytest.raises(RuntimeError, match="before open"):
        writer.write(_train(1, 1.0))
    _run(writer, [_train(s, 1.0 / s) for s in range(1, 6)])
    before = path.read_bytes()
    _run(writer, [_train(4, 9.0)], restored_step=3)  # resumed from step 3: appended, marked
    assert path.read_bytes().startswith(before)
    assert [(r["step"], r["loss"]) for r in training.read_jsonl(path)] == [
        (1, 1.0),
        (2, 0.5),
        (3, float(np.float32(1 / 3))),
        (4, 9.0),
    ]
    with pytest.raises(FileExistsError, match="earlier run"):
        writer.open(None, False)
    _run(writer, [], overwrite=True)
    assert training.read_jsonl(path) == []
    other = tmp_path / "other.jsonl"
    _run(training.JsonlWriter(other, enabled=False), [_train(1, 1.0)])  # process 1 of 2
    assert not other.exists()


def test_tensorboard_writer_writes_each_numeric_field_at_its_step(tmp_path):
    logdir = tmp_path / "tb"
    records = [_train(s, 1.0 / s) for s in (1, 2, 3, 4)]
    records.append({"split": "eval", "step": 4, "accuracy": 0.75, "count": 10, "note": "text"})
    records.append({"split": "train", "step": 5, "loss": float("nan"), "epoch": 1.25})
    _run(training.TensorBoardWriter(logdir), records)
    assert len(event_files(logdir)) == 1
    scalars_ = training.read_tensorboard(logdir)
    assert set(scalars_) == {"train/loss", "train/epoch", "eval/accuracy", "eval/count"}
    assert [s for s, _ in scalars_["train/loss"]] == [1, 2, 3, 4, 5]
    np.testing.assert_array_equal(
        [v for _, v in scalars_["train/loss"]][:4], np.float32([1, 1 / 2, 1 / 3, 1 / 4])
    )
    assert np.isnan(scalars_["train/loss"][-1][1])
    assert scalars_["train/epoch"] == [(1, 0.25), (2, 0.5), (3, 0.75), (4, 1.0), (5, 1.25)]
    assert scalars_["eval/accuracy"] == [(4, 0.75)] and scalars_["eval/count"] == [(4, 10.0)]


def test_tensorboard_resume_appends_a_file_and_reads_as_one_run(tmp_path):
    logdir = tmp_path / "tb"
    writer = training.TensorBoardWriter(logdir)
    # The interrupted run logged to step 5 (and an eval at 5), its last checkpoint was step 3.
    interrupted = [_train(s, 10.0 + s) for s in range(1, 6)]
    _run(writer, interrupted + [{"split": "eval", "step": 5, "a": 1}])
    (first,) = event_files(logdir)
    before = open(first, "rb").read()
    _run(writer, [_train(s, 20.0 + s) for s in range(4, 8)], restored_step=3)
    files = event_files(logdir)
    assert len(files) == 2 and files[0] == first and open(first, "rb").read() == before
    scalars_ = training.read_tensorboard(logdir)
    assert scalars_["train/loss"] == [(1, 11.0), (2, 12.0), (3, 13.0)] + [
        (s, 20.0 + s) for s in range(4, 8)
    ]
    assert scalars_["eval/a"] == []  # logged after the checkpoint, never logged again: purged
    # the resumed file starts with TensorBoard's purge marker: a session start at step 4
    from tensorboardX.proto.event_pb2 import Event, SessionLog

    from deqjax._src.training.writers.event_file import _records

    starts = [Event.FromString(r) for r in _records(files[1])]
    assert any(e.step == 4 and e.session_log.status == SessionLog.START for e in starts)
    # a torn last record (a killed writer) is ignored
    with open(files[1], "ab") as f:
        f.write(b"\x10\x00\x00\x00\x00\x00\x00\x00torn")
    assert training.read_tensorboard(logdir) == scalars_


def test_tensorboard_fresh_run_refuses_an_earlier_runs_events(tmp_path):
    logdir = tmp_path / "tb"
    writer = training.TensorBoardWriter(logdir)
    _run(writer, [_train(1, 1.0)])
    with pytest.raises(FileExistsError, match="earlier run"):
        writer.open(None, False)
    (kept,) = event_files(logdir)
    (logdir / "notes.txt").write_text("mine")
    _run(writer, [_train(1, 2.0)], overwrite=True)
    assert kept not in event_files(logdir) and (logdir / "notes.txt").exists()
    expected = {"train/loss": [(1, 2.0)], "train/epoch": [(1, 0.25)]}
    assert training.read_tensorboard(logdir) == expected
    with pytest.raises(RuntimeError, match="before open"):
        writer.write(_train(2, 1.0))
    quiet = tmp_path / "quiet"
    _run(training.TensorBoardWriter(quiet, enabled=False), [_train(1, 1.0)])
    assert not quiet.exists()


def test_tensorboard_writer_names_the_package_when_tensorboardx_is_absent(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorboardX", None)
    with pytest.raises(ModuleNotFoundError, match="pip install tensorboardX"):
        training.TensorBoardWriter(tmp_path)


def test_wandb_writer_names_the_package_when_wandb_is_absent(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # absent, whether installed or not
    with pytest.raises(ModuleNotFoundError, match="pip install wandb"):
        training.WandbWriter(project="deqjax", run_dir=tmp_path)


class _FakeRun:
    def __init__(self, calls, **kwargs):
        self.calls, self.kwargs = calls, kwargs
        self.id = kwargs["id"] or f"run{len(calls['init'])}"
        calls["init"].append(kwargs)

    def log(self, values, step):
        self.calls["log"].append((step, values))

    def finish(self):
        self.calls["finish"] += 1


@pytest.fixture
def fake_wandb(monkeypatch):
    """A stand-in ``wandb`` module recording ``init``, ``log`` and ``finish``."""
    calls = {"init": [], "log": [], "finish": 0}
    module = types.ModuleType("wandb")
    module.__spec__ = types.SimpleNamespace(name="wandb")
    module.init = lambda **kwargs: _FakeRun(calls, **kwargs)
    monkeypatch.setitem(sys.modules, "wandb", module)
    return calls


def test_wandb_writer_logs_scalars_and_resumes_the_same_run(tmp_path, fake_wandb):
    config = {"lr": np.float32(0.5), "solver": "anderson"}
    writer = training.WandbWriter("deqjax", tmp_path / "run", config)
    _run(writer, [_train(1, 1.0), {"split": "eval", "step": 1, "accuracy": 0.5, "tag": "x"}])
    (init,) = fake_wandb["init"]
    assert init["project"] == "deqjax" and init["dir"] == os.fspath(tmp_path / "run")
    assert init["id"] is None and json.dumps(init["config"]) and init["config"]["lr"] == 0.5
    assert fake_wandb["log"] == [
        (1, {"train/loss": 1.0, "train/epoch": 0.25}),
        (1, {"eval/accuracy": 0.5}),
    ]
    assert (tmp_path / "run" / "wandb_run_id.txt").read_text() == "run0"
    _run(writer, [_train(2, 0.5)], restored_step=1)
    assert fake_wandb["init"][1]["id"] == "run0" and fake_wandb["init"][1]["resume"] == "allow"
    assert fake_wandb["finish"] == 2
    with pytest.raises(FileExistsError, match="earlier run"):
        writer.open(None, False)
    _run(training.WandbWriter("deqjax", tmp_path / "quiet", enabled=False), [_train(1, 1.0)])
    assert len(fake_wandb["init"]) == 2 and not (tmp_path / "quiet").exists()
    with pytest.raises(ValueError, match="project"):
        training.WandbWriter("", tmp_path)
