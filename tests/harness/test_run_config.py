"""The run section: its flags, ``--quiet`` as ``--no_progress``, and what it builds for a
training (its actions, where its metrics go, a profiler window)."""

import dataclasses
import importlib.util

import numpy as np
import pytest

from deqjax import harness, training


@dataclasses.dataclass(frozen=True)
class Config:
    run: harness.ResumableRunConfig = harness.ResumableRunConfig()


def test_run_flags():
    c = harness.parse_config(Config(), ["--seed", "4", "--resume", "--force", "--quiet"])
    assert c.run == harness.ResumableRunConfig(seed=4, resume=True, force=True, progress=False)
    assert not harness.parse_config(Config(), ["--no_progress"]).run.progress
    assert harness.parse_config(Config(), ["--overwrite", "--smoke"]).run.overwrite
    assert "resume" not in harness.flat_dict(harness.RunConfig())  # only resumable runs resume


def test_where_the_metrics_go_and_the_profiler_window_are_flags():
    c = harness.parse_config(Config(), ["--profile_steps", "3:5", "--no_tensorboard", "--wandb"])
    assert (c.run.profile_steps, c.run.tensorboard, c.run.wandb) == ("3:5", False, True)
    default = harness.ResumableRunConfig()
    assert (default.profile_steps, default.tensorboard, default.wandb) == ("", True, False)
    assert harness.parse_config(Config(), ["--profile_steps", " 7:7"]).run.profile_steps == "7:7"


@pytest.mark.parametrize("window", ["5", "5:3", "0:2", "a:b", "1:2:3", ":4"])
def test_a_bad_profiler_window_exits_2_naming_the_flag(window, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "300")  # one line per message
    with pytest.raises(SystemExit) as e:
        harness.parse_config(Config(), ["--profile_steps", window])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "--profile_steps" in err and "expected A:B" in err and repr(window) in err, err


def test_a_training_s_actions_and_writers(tmp_path):
    ctx = harness.RunContext(str(tmp_path), {"seed": 0}, False, False, True, experiment="toy")
    run = harness.ResumableRunConfig(profile_steps="2:4")
    actions = run.actions(training.Evaluate(lambda p, b: {}, {"x": np.zeros(2)}), log_every=5)
    kinds = [type(a).__name__ for a in actions]
    assert kinds == [
        "LogMetrics",
        "GuardNonFinite",
        "Evaluate",
        "ProfileSteps",
        "StopOnSigterm",
        "ReportProgress",
    ]
    assert actions[0].schedule.every_steps == 5 and (actions[3].first, actions[3].last) == (2, 4)
    quiet = harness.ResumableRunConfig(progress=False).actions(log_every=1)
    assert [type(a).__name__ for a in quiet] == ["LogMetrics", "GuardNonFinite", "StopOnSigterm"]
    jsonl, tb = run.writers(ctx)
    assert isinstance(jsonl, training.JsonlWriter) and jsonl.path == str(tmp_path / "metrics.jsonl")
    assert isinstance(tb, training.TensorBoardWriter) and tb.logdir == str(tmp_path / "tensorboard")
    jsonl, tb = run.writers(ctx, "gamma0")
    assert jsonl.path == str(tmp_path / "metrics_gamma0.jsonl")
    assert tb.logdir == str(tmp_path / "tensorboard" / "gamma0")
    (jsonl,) = harness.ResumableRunConfig(tensorboard=False).writers(ctx)
    assert isinstance(jsonl, training.JsonlWriter)


def test_wandb_without_the_package_is_a_usage_error_naming_it(monkeypatch):
    assert harness.ResumableRunConfig(wandb=False).check() is None
    assert harness.RunConfig().check() is None
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a)
    )
    message = harness.ResumableRunConfig(wandb=True).check()
    assert "--wandb" in message and "pip install wandb" in message
