"""Run folders: a new run never deletes an earlier one, a resume never runs under other flags."""

import json

import pytest

from deqjax import harness

CONFIG = {"width": 128, "seed": 0, "epochs": 4, "lr": 2e-3, "progress": True, "out_dir": "a"}


def _prepare(out, config=CONFIG, **kwargs):
    return harness.prepare_run_dir(out, config, safe_keys=("epochs",), **kwargs)


def test_fresh_run_writes_config_and_refuses_to_overwrite(tmp_path):
    out = tmp_path / "run"
    assert _prepare(out) == harness.RunDir(str(out), False, {})
    assert json.loads((out / "config.json").read_text()) == CONFIG
    (out / "metrics.jsonl").write_text('{"step": 1}\n')
    (out / "ckpt" / "5").mkdir(parents=True)
    (out / "notes.txt").write_text("mine")
    with pytest.raises(harness.RunDirError, match=r"holds an earlier run \(config.json, metrics"):
        _prepare(out, {**CONFIG, "lr": 1.0})
    assert json.loads((out / "config.json").read_text()) == CONFIG  # untouched
    _prepare(out, {**CONFIG, "lr": 1.0}, overwrite=True)
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "notes.txt"]  # only run files
    assert json.loads((out / "config.json").read_text())["lr"] == 1.0


def test_resume_names_every_changed_flag(tmp_path):
    out = tmp_path / "run"
    _prepare(out)
    # ignored keys (progress, out_dir) never count; identical flags resume
    assert _prepare(out, {**CONFIG, "progress": False, "out_dir": "b"}, resume=True).resume
    changed = {**CONFIG, "width": 64, "seed": 4, "epochs": 8}
    with pytest.raises(harness.RunDirError) as exc:
        _prepare(out, changed, resume=True)
    message = str(exc.value)
    assert "3 changed" in message and "cannot change on resume" in message
    for line in ("--width: 128 in config.json, now 64", "--seed: 0", "--epochs: 4"):
        assert line in message
    with pytest.raises(harness.RunDirError, match="--width"):
        _prepare(out, changed, resume=True, force=True)  # --force never accepts unsafe changes
    with pytest.raises(harness.RunDirError, match="pass --force"):
        _prepare(out, {**CONFIG, "epochs": 8}, resume=True)
    assert json.loads((out / "config.json").read_text()) == CONFIG
    run = _prepare(out, {**CONFIG, "epochs": 8}, resume=True, force=True)
    assert run.accepted_changes == {"epochs": (4, 8)}
    assert json.loads((out / "config.json").read_text())["epochs"] == 8


def test_resume_needs_a_run(tmp_path):
    with pytest.raises(harness.RunDirError, match="holds no run to resume"):
        _prepare(tmp_path / "none", resume=True)
    (tmp_path / "old" / "ckpt" / "3").mkdir(parents=True)  # files but no config.json
    with pytest.raises(harness.RunDirError, match="no config.json"):
        _prepare(tmp_path / "old", resume=True)
    assert _prepare(tmp_path / "old", resume=True, force=True).resume
    with pytest.raises(harness.RunDirError, match="contradict"):
        _prepare(tmp_path / "old", resume=True, overwrite=True)


def test_config_changes_ignore_what_never_changes_a_run():
    solver = {"type": "Anderson", "tol": 0.1}
    saved = {"width": 1, "progress": True, "out_dir": "a", "solver": solver}
    current = {"width": 1, "progress": False, "out_dir": "b", "solver": {**solver, "tol": 0.2}}
    assert harness.config_changes(saved, current) == {"solver": (solver, {**solver, "tol": 0.2})}
    assert harness.config_changes({"x": 1}, {}) == {"x": (1, "(absent)")}


def test_write_json_is_sorted_and_atomic(tmp_path):
    path = harness.write_json(tmp_path / "sub" / "r.json", {"b": float("nan"), "a": (1, 2)})
    text = (tmp_path / "sub" / "r.json").read_text()
    assert path == str(tmp_path / "sub" / "r.json") and text.index('"a"') < text.index('"b"')
    assert json.loads(text) == {"a": [1, 2], "b": "nan"}  # JSON has no literal for nan
    assert not (tmp_path / "sub" / "r.json.tmp").exists()
