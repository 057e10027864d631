"""End-to-end smoke tests of the main job ``experiments/fashion_mnist.py`` and its ``--sweep``.

They use ``--dataset digits`` (scikit-learn's 8×8 digits ship with scikit-learn) so they never skip,
and tiny models and step counts (``--smoke``): what they check is the plumbing — the metrics JSONL
with the solver/JR/diagnostics fields, the orbax checkpoints and ``--resume``, the PNGs, the sweep
CSVs — and that the short run learns (test accuracy well above chance).
"""

from __future__ import annotations

import csv
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import jax
import numpy as np
import pytest

from deqjax import data, training
from deqjax._src.data.idx import write_idx
from deqjax._src.training.checkpoint import all_finite
from experiments import fashion_mnist as fm
from tests.helpers.run_experiment import ROOT
from tests.helpers.train_worker import worker_env


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
    assert config["device_resident"] is True  # the data on the devices by default
    assert config["input"] == "arrays" and config["tensorboard"] is True
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
    # TensorBoard event files beside the JSONL, by default: the same train losses
    board = training.read_tensorboard(os.path.join(out, "tensorboard"))
    assert board["train/loss"] == [(r["step"], pytest.approx(r["loss"])) for r in train]
    assert [s for s, _ in board["eval/accuracy"]] == [r["step"] for r in evals]
    # the short run learns: chance is 0.1
    assert summary["test"]["accuracy"] > 0.5, summary["test"]
    assert evals[-1]["accuracy"] == pytest.approx(summary["test"]["accuracy"])


def test_main_job_resumes_from_its_checkpoint(main_run, capsys):
    out, summary = main_run
    steps = json.load(open(os.path.join(out, "config.json")))["steps"]
    metrics = open(os.path.join(out, "metrics.jsonl"), "rb").read()
    again = _run(["--smoke", "--dataset", "digits", "--out_dir", out, "--no_progress", "--resume"])
    assert again["restored_step"] == steps and again["final_step"] == steps
    # nothing left to train, nothing done: the run's last evaluation is reported again
    assert f"step {steps} of {steps}: nothing left to do" in capsys.readouterr().out
    assert again["test"] == summary["test"]
    assert open(os.path.join(out, "metrics.jsonl"), "rb").read() == metrics


def test_a_finished_run_relaunched_with_resume_exits_0_having_done_nothing(main_run, tmp_path):
    """What a scheduler re-launching a finished job does; the process used to abort (exit 134)
    with the warm-up's background compilations still inside XLA at exit."""
    out = _copy_run(main_run, tmp_path)
    before = _snapshot(os.path.join(out, "ckpt"))
    cmd = [sys.executable, "-m", "experiments.fashion_mnist", *SMOKE, "--resume", "--out_dir", out]
    env = worker_env(1) | {"PYTHONPATH": str(ROOT)}
    proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "nothing left to do" in proc.stdout and "final test accuracy" in proc.stdout
    assert _snapshot(os.path.join(out, "ckpt")) == before


@pytest.mark.slow  # a main job per framework: the front-ends' own tests run in the default suite
@pytest.mark.parametrize("framework", ["nnx", "equinox"])
def test_the_main_job_trains_in_each_framework(main_run, framework, tmp_path):
    """``--framework nnx`` / ``equinox``: the same classifier in Flax NNX or Equinox, trained by
    the same loop, logging the same records as Haiku's run, checkpointed and resumed."""
    out = tmp_path / framework
    summary = _run([*SMOKE, "--framework", framework, "--out_dir", str(out)])
    config = json.load(open(out / "config.json"))
    assert config["framework"] == framework
    split = lambda path, name: [r for r in training.read_jsonl(path) if r["split"] == name]  # noqa: E731
    haiku = os.path.join(main_run[0], "metrics.jsonl")
    for name in ("train", "diagnostics", "eval"):
        got, want = split(out / "metrics.jsonl", name), split(haiku, name)
        assert [r["step"] for r in got] == [r["step"] for r in want], name
        assert all(set(r) == set(want[0]) for r in got), name  # the same metrics
        assert all(np.isfinite(v) for r in got for v in r.values() if isinstance(v, float)), name
    train = split(out / "metrics.jsonl", "train")
    assert train[-1]["loss"] < 0.8 * train[0]["loss"]  # it learns
    assert summary["test"]["accuracy"] > 0.3, summary["test"]  # chance: 0.1 (other draws)
    # its checkpoint restores: resumed when finished, it does nothing more and reports the same
    again = _run([*SMOKE, "--framework", framework, "--out_dir", str(out), "--resume"])
    assert again["restored_step"] == config["steps"] and again["test"] == summary["test"]


def test_a_dtype_policy_outside_haiku_is_refused(tmp_path, capsys):
    argv = [*SMOKE, "--framework", "nnx", "--dtype", "bfloat16", "--out_dir", str(tmp_path / "o")]
    assert _exit_code(argv) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "error: --dtype bfloat16 is a Haiku mixed-precision policy; --framework nnx trains in "
        "float32: pass --framework haiku or --dtype float32."
    ]
    assert not os.path.exists(tmp_path / "o")


def test_a_batch_the_devices_cannot_share_is_refused_before_the_folder_is_claimed(tmp_path):
    env = worker_env(2) | {"PYTHONPATH": str(ROOT)}
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "experiments.fashion_mnist", *SMOKE, "--batch_size", "33"]
    proc = subprocess.run(
        [*cmd, "--out_dir", str(out)], env=env, cwd=ROOT, capture_output=True, text=True
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines() == [
        "error: --batch_size 33 must be a multiple of the 2 devices (each device takes an equal "
        "share of the batch)."
    ]
    assert not out.exists()  # no config.json to refuse the corrected rerun


def test_wandb_without_the_package_is_refused_naming_it(tmp_path, capsys, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a)
    )
    assert _exit_code([*SMOKE, "--wandb", "--out_dir", str(tmp_path / "o")]) == 2
    assert "pip install wandb" in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "o")


@pytest.mark.slow  # ~20 s: the main job's smoke again, its batches placed from the host
def test_the_main_job_with_its_data_on_the_host_logs_the_same_records(main_run, tmp_path):
    out, summary = main_run
    flags = ["--smoke", "--dataset", "digits", "--no_progress", "--no_device_resident"]
    host = _run([*flags, "--out_dir", str(tmp_path)])
    assert json.load(open(tmp_path / "config.json"))["device_resident"] is False
    untimed = lambda path: [  # noqa: E731
        {k: v for k, v in r.items() if k != "examples_per_sec"} for r in training.read_jsonl(path)
    ]
    want = untimed(os.path.join(out, "metrics.jsonl"))  # a --resume test may have appended to it
    got = untimed(tmp_path / "metrics.jsonl")
    assert got == want[: len(got)] and [r["split"] for r in got].count("eval") == 2
    assert host["test"] == summary["test"]


@pytest.mark.slow  # ~20 s: the main job's smoke again, its batches read through grain
def test_the_main_job_reading_through_grain_logs_the_same_records(main_run, tmp_path):
    out, summary = main_run
    grain = _run([*SMOKE, "--input", "grain", "--out_dir", str(tmp_path)])
    assert json.load(open(tmp_path / "config.json"))["input"] == "grain"
    untimed = lambda path: [  # noqa: E731
        {k: v for k, v in r.items() if k != "examples_per_sec"} for r in training.read_jsonl(path)
    ]
    want = untimed(os.path.join(out, "metrics.jsonl"))
    got = untimed(tmp_path / "metrics.jsonl")
    assert [r["loss"] for r in got if r["split"] == "train"] == [
        r["loss"] for r in want if r["split"] == "train"
    ]
    assert got == want[: len(got)] and [r["split"] for r in got].count("eval") == 2
    assert grain["test"] == summary["test"]


@pytest.mark.slow  # ~1 min: four short runs; the main job's smoke above stays in the default lane
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


@pytest.mark.slow  # a second main job; the tolerance the dtype picks: tests/harness (default suite)
def test_bfloat16_main_job_records_its_dtype_and_learns(tmp_path, capsys):
    """One flag: ``--dtype bfloat16`` alone picks the tolerances bfloat16 resolves (the
    defaults' 1e-3 it cannot), says so and records them."""
    out = tmp_path / "bf16"
    argv = ["--smoke", "--dataset", "digits", "--dtype", "bfloat16"]
    summary = _run([*argv, "--out_dir", str(out), "--no_progress", "--no_jr"])
    config = json.load(open(out / "config.json"))
    assert config["dtype"] == "bfloat16" and config["tol"] == 0.01 and config["bwd_tol"] == 0.01
    assert config["solver"]["tol"] == 0.01 and config["adjoint"]["solver"]["tol"] == 0.01
    said = [line for line in capsys.readouterr().out.splitlines() if "picks" in line]
    assert said == [
        "--dtype bfloat16 picks --tol 0.01 (default 0.001) and --bwd_tol 0.01 (default 0.001), "
        "above its machine epsilon 7.8e-03"
    ]
    assert summary["test"]["accuracy"] > 0.5  # chance: 0.1
    # Parameters and optimizer state stay float32 (the checkpoint's).
    import orbax.checkpoint as ocp

    step = max(d for d in os.listdir(out / "ckpt") if d.isdigit())
    state = ocp.StandardCheckpointer().restore(str(out / "ckpt" / step / "state"))
    floats = [a for a in jax.tree_util.tree_leaves(state) if np.issubdtype(a.dtype, np.floating)]
    assert floats and {a.dtype for a in floats} == {np.dtype(np.float32)}


def test_a_tolerance_the_dtype_cannot_resolve_is_refused(tmp_path, capsys):
    argv = ["--dtype", "bfloat16", "--tol", "1e-3", "--out_dir", str(tmp_path / "o")]
    assert _exit_code(argv) == 2  # given, not picked: refused
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert "--tol 0.001" in err and "--dtype bfloat16" in err and "--tol 0.01" in err
    assert not os.path.exists(tmp_path / "o")


def test_load_data_standardises_and_subsets():
    train, test, source = data.load_classification("digits", train_size=100, test_size=50, seed=1)
    assert train["image"].shape == (100, 64) and test["image"].shape == (50, 64)
    assert train["image"].dtype == np.float32 and train["label"].dtype == np.int32
    assert abs(float(train["image"].mean())) < 1e-4
    assert float(train["image"].std()) == pytest.approx(1.0, rel=1e-3)
    with pytest.raises(ValueError, match="dataset"):
        data.load_classification("cifar")
    assert isinstance(data.DataNotFoundError("x"), Exception)


# --- run-folder safety: refuse to overwrite, refuse to guess on resume ----------------------------


def _copy_run(main_run, tmp_path) -> str:
    out = str(tmp_path / "run")
    shutil.copytree(main_run[0], out)
    return out


def _snapshot(folder: str) -> dict:
    files = {}
    for root, _, names in os.walk(folder):
        for name in names:
            path = os.path.join(root, name)
            files[os.path.relpath(path, folder)] = open(path, "rb").read()
    return files


SMOKE = ["--smoke", "--dataset", "digits", "--no_progress"]


def _exit_code(argv) -> int:
    with pytest.raises(SystemExit) as exc:
        _run(argv)
    return exc.value.code


def test_new_run_refuses_a_folder_holding_an_earlier_run(main_run, tmp_path, capsys):
    out = _copy_run(main_run, tmp_path)
    before = _snapshot(out)
    assert _exit_code([*SMOKE, "--out_dir", out]) == 2
    err = capsys.readouterr().err
    assert "holds an earlier run" in err and "--overwrite" in err and "--resume" in err
    assert _snapshot(out) == before  # nothing deleted


def test_resume_names_every_changed_flag_and_changes_nothing(main_run, tmp_path, capsys):
    out = _copy_run(main_run, tmp_path)
    before = _snapshot(out)
    changed = ["--width", "64", "--seed", "4", "--batch_size", "64", "--steps", "80"]
    assert _exit_code([*SMOKE, "--out_dir", out, "--resume", *changed]) == 2
    err = capsys.readouterr().err
    for flag in ("--width: 32", "--seed: 0", "--batch_size: 32", "--steps: 40"):
        assert flag in err, err
    assert "cannot change on resume" in err
    # a safe change alone needs --force; --force never accepts an unsafe one
    assert _exit_code([*SMOKE, "--out_dir", out, "--resume", "--steps", "80"]) == 2
    assert "pass --force" in capsys.readouterr().err
    force_unsafe = [*SMOKE, "--out_dir", out, "--resume", "--force", "--steps", "80", "--lr", "1"]
    assert _exit_code(force_unsafe) == 2
    assert "--lr" in capsys.readouterr().err
    assert _snapshot(out) == before


def test_resume_with_no_restorable_checkpoint_stops_and_renames_nothing(main_run, tmp_path, capfd):
    out = _copy_run(main_run, tmp_path)
    for step in os.listdir(os.path.join(out, "ckpt")):
        for root, _, names in os.walk(os.path.join(out, "ckpt", step, "state")):
            for name in names:
                path = os.path.join(root, name)
                if os.sep + "d" + os.sep in path and os.path.getsize(path) > 8:
                    os.truncate(path, os.path.getsize(path) // 2)
    before = _snapshot(out)
    assert _exit_code([*SMOKE, "--out_dir", out, "--resume"]) == 2
    err = capfd.readouterr().err
    assert "can be restored" in err and "corrupt" in err
    assert "Traceback" not in err and "Event loop is closed" not in err
    assert _snapshot(out) == before  # no *.corrupt, metrics kept


def test_resume_of_a_folder_without_a_run_is_an_error(tmp_path, capsys):
    assert _exit_code([*SMOKE, "--out_dir", str(tmp_path / "new"), "--resume"]) == 2
    assert "holds no run to resume" in capsys.readouterr().err


@pytest.mark.parametrize(
    "flags, name",
    [
        (["--epochs", "-1"], "--epochs"),
        (["--train_size", "-5"], "--train_size"),
        (["--clip_norm", "-1"], "--clip_norm"),
        (["--dataset", "digits", "--data_dir", "X"], "--data_dir"),
    ],
)
def test_bad_flags_are_rejected_naming_the_flag(flags, name, tmp_path, capsys):
    assert _exit_code([*flags, "--out_dir", str(tmp_path / "o")]) == 2
    assert name in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "o")


def test_garbled_idx_file_is_named(tmp_path, capsys):
    folder = tmp_path / "fm"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for prefix in ("train", "t10k"):
        images = rng.integers(0, 255, size=(20, 28, 28), dtype=np.uint8)
        write_idx(folder / f"{prefix}-images-idx3-ubyte.gz", images)
        labels = rng.integers(0, 10, size=(20,), dtype=np.uint8)
        write_idx(folder / f"{prefix}-labels-idx1-ubyte.gz", labels)
    garbled = folder / "train-images-idx3-ubyte.gz"
    raw = bytearray(garbled.read_bytes())
    raw[20:-8] = bytes(b ^ 0x55 for b in raw[20:-8])
    garbled.write_bytes(bytes(raw))
    with pytest.raises(data.DataFormatError, match=str(garbled)):
        data.load_fashion_mnist(folder, split="train")
    assert _exit_code(["--data_dir", str(folder), "--out_dir", str(tmp_path / "o")]) == 2
    assert str(garbled) in capsys.readouterr().err


@pytest.mark.slow  # ~1-2 min: a resumed run recompiles, then trains until SIGTERM
def test_forced_resume_appends_metrics_and_sigterm_reports_no_final_result(
    main_run, tmp_path, capsys
):
    out = _copy_run(main_run, tmp_path)
    metrics = os.path.join(out, "metrics.jsonl")
    before = open(metrics, "rb").read()
    steps = json.load(open(os.path.join(out, "config.json")))["steps"]

    def terminate_after_a_new_step():
        deadline = time.time() + 240
        while time.time() < deadline:
            if any(r["step"] > steps for r in training.read_jsonl(metrics)):
                os.kill(os.getpid(), signal.SIGTERM)
                return
            time.sleep(0.05)

    killer = threading.Thread(target=terminate_after_a_new_step, daemon=True)
    killer.start()
    argv = [*SMOKE, "--out_dir", out, "--resume", "--force", "--steps", "400", "--log_every", "1"]
    argv += ["--diagnostics_every", "0"]  # a safe change too: less to compile
    assert _exit_code(argv) == 143
    killer.join()
    stdout = capsys.readouterr().out
    assert "final test accuracy" not in stdout and "interrupted by SIGTERM" in stdout
    assert open(metrics, "rb").read().startswith(before)  # append-only
    train = [r["step"] for r in training.read_jsonl(metrics) if r["split"] == "train"]
    assert train == sorted(set(train)) and train[-1] > steps
    assert json.load(open(os.path.join(out, "config.json")))["steps"] == 400


@pytest.mark.slow  # ~30 s of compile; the fit-level tests in test_training.py are fast
def test_nonfinite_training_skips_updates_and_stops_with_exit_3(tmp_path, capsys):
    out = str(tmp_path / "nan")
    diverge = ["--lr", "1e38", "--clip_norm", "0", "--schedule", "constant", "--log_every", "1"]
    argv = [*SMOKE, "--out_dir", out, *diverge, "--max_nonfinite_steps", "3", "--checkpoint_every"]
    assert _exit_code([*argv, "1", "--diagnostics_every", "0", "--no_jr", "--width", "16"]) == 3
    err = capsys.readouterr().err
    assert "non-finite for the last 3 steps" in err and "Traceback" not in err
    last = training.read_jsonl(os.path.join(out, "metrics.jsonl"))[-1]
    assert last["skipped_updates"] >= 3 and last["nonfinite_streak"] == 3
    import orbax.checkpoint as ocp

    steps = [d for d in os.listdir(os.path.join(out, "ckpt")) if d.isdigit()]
    assert steps
    for step in steps:  # every checkpoint kept holds finite values
        state = ocp.StandardCheckpointer().restore(os.path.join(out, "ckpt", step, "state"))
        assert all_finite(state), step
