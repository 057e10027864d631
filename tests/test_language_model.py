"""Smoke runs of ``experiments/language_model.py`` (issue 8).

Each run is a subprocess (``_run_experiment.run_smoke``); the outputs are checked for the
data-source label and finite metrics.
"""

from __future__ import annotations

import math

import pytest
from _run_experiment import run_smoke


@pytest.mark.slow  # ~20 s alone, ~60 s on a loaded 2-core machine
def test_language_model_smoke(tmp_path):
    summary = run_smoke("language_model.py", tmp_path, "--models", "deq,tied", "--jr_gamma", "0.1")
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
    summary = run_smoke(
        "language_model.py", tmp_path, "--models", "deq,untied", "--no-memory", "--pre_ln"
    )
    deq, untied = summary["results"]
    assert untied["params"] > deq["params"]
    assert all(math.isfinite(r["valid_ppl"]) for r in summary["results"])
