"""End-to-end smoke tests of the main job ``experiments/fashion_mnist.py`` and its ``--sweep``.

They use ``--dataset digits`` (scikit-learn's 8×8 digits ship with scikit-learn) so they never skip,
and tiny models and step counts (``--smoke``): what they check is the plumbing — the metrics JSONL
with the solver/JR/diagnostics fields, the orbax checkpoints and ``--resume``, the PNGs, the sweep
CSVs — and that the short run learns (test accuracy well above chance).
"""

from __future__ import annotations

import csv
import json
import os
import sys

import jax
import numpy as np
import pytest

from deqjax import data, training

sys.path.insert(
    0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "experiments")
)
import fashion_mnist as fm  # noqa: E402


def _run(argv):
    # optax's schedules add a Python float to the int32 step, which the strict promotion mode of
    # tests/conftest.py rejects (third-party code); our own code passes under it otherwise.
    with jax.numpy_dtype_promotion("standard"), jax.numpy_rank_promotion("allow"):
        return fm.main(argv)


@pytest.fixture(scope="module")
def main_run(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("fm_main"))
    summary = _run(["--smoke", "--dataset", "digits", "--out_dir", out, "--no_progress"])
    return out, summary


def test_main_job_writes_metrics_checkpoints_and_plot(main_run):
    out, summary = main_run
    for name in ("config.json", "metrics.jsonl", "curves.png", "results.json"):
        assert os.path.getsize(os.path.join(out, name)) > 0, name
    config = json.load(open(os.path.join(out, "config.json")))
    assert config["dataset"] == "digits" and config["jr"] is True
    records = training.read_jsonl(os.path.join(out, "metrics.jsonl"))
    train = [r for r in records if r["split"] == "train"]
    diag = [r for r in records if r["split"] == "diagnostics"]
    evals = [r for r in records if r["split"] == "eval"]
    assert train and diag and evals
    for field in (
        "loss",
        "accuracy",
        "nfe",
        "nfe_max",
        "rel_residual",
        "rel_residual_max",
        "jr/penalty",
        "jr/gamma",
        "jr/frobenius_sq",
    ):
        assert all(field in r and np.isfinite(r[field]) for r in train), field
    last = train[-1]
    assert 1 <= last["nfe"] <= last["nfe_max"] <= config["max_steps"]
    assert 0 <= last["rel_residual"] <= last["rel_residual_max"]
    assert all(r["jr/gamma"] == pytest.approx(config["gamma"]) for r in train)
    for field in ("bwd_rel_residual", "bwd_nfe", "jac_frobenius", "spectral_radius"):
        assert all(field in r and np.isfinite(r[field]) and r[field] >= 0 for r in diag), field
    # a checkpoint every 3 steps and at the end, readable by the project's checkpointer
    ckpt = training.Checkpointer(os.path.join(out, "ckpt"))
    assert max(ckpt.all_steps()) == config["steps"]
    ckpt.close()
    # the short run learns: chance is 0.1
    assert summary["test"]["accuracy"] > 0.5, summary["test"]
    assert evals[-1]["accuracy"] == pytest.approx(summary["test"]["accuracy"])


def test_main_job_resumes_from_its_checkpoint(main_run):
    out, summary = main_run
    steps = json.load(open(os.path.join(out, "config.json")))["steps"]
    again = _run(["--smoke", "--dataset", "digits", "--out_dir", out, "--no_progress", "--resume"])
    assert again["restored_step"] == steps and again["final_step"] == steps
    # nothing left to train: the restored parameters give the same test accuracy
    assert again["test"]["accuracy"] == pytest.approx(summary["test"]["accuracy"])


def test_sweep_smoke_writes_csv_and_plot(tmp_path):
    out = str(tmp_path)
    result = _run(["--sweep", "--smoke", "--dataset", "digits", "--out_dir", out, "--no_progress"])
    with open(os.path.join(out, "sweep.csv")) as f:
        rows = list(csv.DictReader(f))
    assert {(r["family"], float(r["scale"])) for r in rows} == {
        (f, s) for f in ("gaussian", "orthogonal") for s in (0.5, 1.5)
    }
    assert all(0.0 <= float(r["test_error"]) <= 1.0 for r in rows)
    with open(os.path.join(out, "sweep_summary.csv")) as f:
        summary = list(csv.DictReader(f))
    assert len(summary) == 4 and all(int(r["n"]) == 1 for r in summary)
    for r in summary:  # one seed: median = mean = that run's error
        assert float(r["median_error"]) == pytest.approx(float(r["mean_error"]))
    assert os.path.getsize(os.path.join(out, "sweep.png")) > 0
    assert len(result["runs"]) == 4


def test_missing_data_fails_fast_with_paths(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        fm.main(["--data_dir", str(tmp_path / "nowhere"), "--out_dir", str(tmp_path / "o")])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "nowhere" in err and "dataset-fashion-mnist" in err


def test_load_data_standardises_and_subsets():
    train, test, source = fm.load_data("digits", train_size=100, test_size=50, seed=1)
    assert train["image"].shape == (100, 64) and test["image"].shape == (50, 64)
    assert train["image"].dtype == np.float32 and train["label"].dtype == np.int32
    assert abs(float(train["image"].mean())) < 1e-4
    assert float(train["image"].std()) == pytest.approx(1.0, rel=1e-3)
    with pytest.raises(ValueError, match="dataset"):
        fm.load_data("cifar")
    assert isinstance(data.DataNotFoundError("x"), Exception)
