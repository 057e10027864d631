"""Run folders: a new run never deletes an earlier one, a resume never runs under other flags."""

import argparse
import json

import pytest

from deqjax import training

CONFIG = {"width": 128, "seed": 0, "epochs": 4, "lr": 2e-3, "progress": True, "out_dir": "a"}


def _prepare(out, config=CONFIG, **kwargs):
    return training.prepare_run_dir(out, config, safe_keys=("epochs",), **kwargs)


def test_fresh_run_writes_config_and_refuses_to_overwrite(tmp_path):
    out = tmp_path / "run"
    assert _prepare(out) == training.RunDir(str(out), False, {})
    assert json.loads((out / "config.json").read_text()) == CONFIG
    (out / "metrics.jsonl").write_text('{"step": 1}\n')
    (out / "ckpt" / "5").mkdir(parents=True)
    (out / "notes.txt").write_text("mine")
    with pytest.raises(training.RunDirError, match=r"holds an earlier run \(config.json, metrics"):
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
    with pytest.raises(training.RunDirError) as exc:
        _prepare(out, changed, resume=True)
    message = str(exc.value)
    assert "3 changed" in message and "cannot change on resume" in message
    for line in ("--width: 128 in config.json, now 64", "--seed: 0", "--epochs: 4"):
        assert line in message
    with pytest.raises(training.RunDirError, match="--width"):
        _prepare(out, changed, resume=True, force=True)  # --force never accepts unsafe changes
    with pytest.raises(training.RunDirError, match="pass --force"):
        _prepare(out, {**CONFIG, "epochs": 8}, resume=True)
    assert json.loads((out / "config.json").read_text()) == CONFIG
    run = _prepare(out, {**CONFIG, "epochs": 8}, resume=True, force=True)
    assert run.accepted_changes == {"epochs": (4, 8)}
    assert json.loads((out / "config.json").read_text())["epochs"] == 8


def test_resume_needs_a_run(tmp_path):
    with pytest.raises(training.RunDirError, match="holds no run to resume"):
        _prepare(tmp_path / "none", resume=True)
    (tmp_path / "old" / "ckpt" / "3").mkdir(parents=True)  # files but no config.json
    with pytest.raises(training.RunDirError, match="no config.json"):
        _prepare(tmp_path / "old", resume=True)
    assert _prepare(tmp_path / "old", resume=True, force=True).resume
    with pytest.raises(training.RunDirError, match="contradict"):
        _prepare(tmp_path / "old", resume=True, overwrite=True)


def test_flag_types_name_the_flag(capsys):
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=training.positive_int)
    p.add_argument("--train_size", type=training.nonnegative_int)
    p.add_argument("--clip_norm", type=training.nonnegative_float)
    p.add_argument("--lr", type=training.positive_float)
    training.add_run_flags(p)
    ok = p.parse_args(["--epochs", "2", "--train_size", "0", "--clip_norm", "0", "--lr", "1e-3"])
    assert (ok.epochs, ok.train_size, ok.clip_norm, ok.lr) == (2, 0, 0.0, 1e-3)
    assert (ok.resume, ok.force, ok.overwrite) == (False, False, False)
    for argv, flag in [
        (["--epochs", "-1"], "--epochs"),
        (["--epochs", "x"], "--epochs"),
        (["--train_size", "-5"], "--train_size"),
        (["--clip_norm", "-1"], "--clip_norm"),
        (["--lr", "inf"], "--lr"),
    ]:
        with pytest.raises(SystemExit):
            p.parse_args(argv)
        assert f"argument {flag}:" in capsys.readouterr().err
