"""Smoke run of ``experiments/cifar10_mdeq.py`` (a subprocess,
``tests.helpers.run_experiment.run_smoke``): one γ evaluated at two inference budgets."""

from __future__ import annotations

import numpy as np
import pytest

from experiments import cifar10_mdeq
from tests.helpers.run_experiment import run_smoke


def test_flags_keep_their_names():
    c = cifar10_mdeq.EXPERIMENT.parse(["--smoke", "--gammas", "0.1", "--channels", "8,16"])
    assert c.gammas == (0.1,) and c.model.channels == (8, 16)  # explicit flags win
    assert (c.budgets, c.steps, c.model.train_budget) == ((1, 3), 2, 3)  # smoke


@pytest.mark.slow  # ~45 s alone (XLA compiles of the MDEQ), several minutes on a loaded machine
def test_cifar10_mdeq_smoke(tmp_path):
    summary = run_smoke(
        "cifar10_mdeq", tmp_path, "--gammas", "1.0", "--budgets", "1,3", timeout=900
    )
    assert summary["is_standin"] == summary["data_source"].startswith("STAND-IN: ")
    (r,) = summary["results"]
    assert r["gamma"] == 1.0
    assert set(r["by_budget"]) == {"1", "3"}
    for budget, v in r["by_budget"].items():
        assert 0.0 <= v["test_accuracy"] <= 1.0
        assert 1 <= v["nfe_mean"] <= v["nfe_max"] <= int(budget)
        assert v["images_per_s"] > 0
    assert r["by_budget"]["1"]["nfe_max"] == 1
    assert r["train_images_per_s"] > 0 and np.isfinite(r["train_jac_last"])
    assert r["train_jac_last"] > 0  # jr_p = 1: the penalty every step
    table = (tmp_path / "table.md").read_text()
    assert summary["data_source"] in table and "b=3" in table
    assert (tmp_path / "accuracy_vs_budget.png").stat().st_size > 0


def test_a_budget_below_one_is_a_usage_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        cifar10_mdeq.main(["--budgets", "0,2", "--out_dir", str(tmp_path / "o")])
    assert e.value.code == 2 and "--budgets" in capsys.readouterr().err
