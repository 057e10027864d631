"""Smoke runs of the sequence and vision experiments (issue 8).

Each script runs in a subprocess (its own jax config: the experiments run in float32 with the
default promotion rules, not under this suite's float64/strict conftest settings) with ``--smoke``
and a reduced model list; the outputs are checked for the data-source label and finite metrics.
"""

from __future__ import annotations

import json
import math
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _run(script: str, out_dir: pathlib.Path, *flags: str) -> dict:
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    cmd = [sys.executable, str(ROOT / "experiments" / script), "--smoke", "--no_progress"]
    cmd += ["--out_dir", str(out_dir), *flags]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert "data source:" in proc.stdout
    assert (out_dir / "config.json").exists()
    config = json.loads((out_dir / "config.json").read_text())
    assert config["seed"] == 0 and config["smoke"] is True
    return json.loads((out_dir / "results.json").read_text())


def test_copy_memory_smoke(tmp_path):
    summary = _run("copy_memory.py", tmp_path, "--models", "deq:transformer,tied:trellis")
    assert summary["data_source"].startswith("synthetic copy-memory")
    models = [r["model"] for r in summary["results"]]
    assert models == ["deq:transformer", "tied:trellis"]
    for r in summary["results"]:
        assert math.isfinite(r["test_loss"]) and r["test_loss"] > 0
        assert 0.0 <= r["test_copy_accuracy"] <= 1.0
    deq, tied = summary["results"]
    assert 1 <= deq["forward_nfe_eval"] <= 4  # --smoke: Anderson max_steps=4
    assert tied["forward_nfe_eval"] == 2  # --smoke: depth 2
    assert (tmp_path / "loss.png").exists()


@pytest.mark.slow  # ~20 s alone, ~60 s on a loaded 2-core machine
def test_language_model_smoke(tmp_path):
    summary = _run("language_model.py", tmp_path, "--models", "deq,tied", "--jr_gamma", "0.1")
    assert summary["data_source"]  # printed and stored; offline this is the labelled stand-in
    assert summary["is_standin"] == summary["data_source"].startswith("STAND-IN: ")
    deq, tied = summary["results"]
    assert (deq["model"], tied["model"]) == ("deq", "tied")
    # The explicit model is unrolled to the DEQ's measured forward NFE.
    assert tied["depth_or_max_steps"] == max(1, round(deq["forward_nfe_train"]))
    assert deq["params"] == tied["params"]  # same weight-tied cell, same embeddings/head
    for r in (deq, tied):
        # A vocabulary of 300 pieces: an untrained model sits near ppl 300, never at 1 or inf.
        assert 20 < r["valid_ppl"] < 3000
        assert r["train_step_s_median"] > 0 and r["tokens_per_s"] > 0
        assert r["compiled_temp_bytes"] is None or r["compiled_temp_bytes"] > 0


@pytest.mark.slow
def test_language_model_smoke_untied_no_memory_pre_ln(tmp_path):
    summary = _run(
        "language_model.py", tmp_path, "--models", "deq,untied", "--no-memory", "--pre_ln"
    )
    deq, untied = summary["results"]
    assert untied["params"] > deq["params"]
    assert all(math.isfinite(r["valid_ppl"]) for r in summary["results"])


@pytest.mark.slow  # ~30 s alone, ~100 s on a loaded 2-core machine
def test_cifar10_mdeq_smoke(tmp_path):
    summary = _run("cifar10_mdeq.py", tmp_path, "--gammas", "1.0", "--budgets", "1,3")
    assert summary["is_standin"] == summary["data_source"].startswith("STAND-IN: ")
    (r,) = summary["results"]
    assert r["gamma"] == 1.0
    assert set(r["by_budget"]) == {"1", "3"}
    for budget, v in r["by_budget"].items():
        assert 0.0 <= v["test_accuracy"] <= 1.0
        assert v["mean_nfe"] <= int(budget)
    assert r["train_images_per_s"] > 0
    table = (tmp_path / "table.md").read_text()
    assert summary["data_source"] in table and "NFE≤3" in table
