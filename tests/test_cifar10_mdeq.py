"""Smoke runs of ``experiments/cifar10_mdeq.py`` (issue 8).

Each run is a subprocess (``_run_experiment.run_smoke``); the outputs are checked for the
data-source label and finite metrics.
"""

from __future__ import annotations

import pytest
from _run_experiment import run_smoke


@pytest.mark.slow  # ~30 s alone, ~100 s on a loaded 2-core machine
def test_cifar10_mdeq_smoke(tmp_path):
    summary = run_smoke("cifar10_mdeq.py", tmp_path, "--gammas", "1.0", "--budgets", "1,3")
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
