"""Smoke runs of ``experiments/copy_memory.py`` (issue 8).

Each run is a subprocess (``_run_experiment.run_smoke``); the outputs are checked for the
data-source label and finite metrics.
"""

from __future__ import annotations

import math

from _run_experiment import run_smoke


def test_copy_memory_smoke(tmp_path):
    summary = run_smoke("copy_memory.py", tmp_path, "--models", "deq:transformer,tied:trellis")
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
