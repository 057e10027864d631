"""Smoke runs of ``experiments/language_model.py`` (subprocesses,
``tests.helpers.run_experiment.run_smoke``): the DEQ against explicit models on the offline
corpus, with carried memory, JR, pre-LN and no memory."""

from __future__ import annotations

import math

import pytest

from experiments import language_model as lm
from tests.helpers.run_experiment import run_smoke


def test_flags_keep_their_names():
    argv = ["--models", "deq,tied", "--no-memory", "--pre_ln", "--jr_gamma", "0.1", "--d_model"]
    c = lm.EXPERIMENT.parse([*argv, "32", "--ffn_init", "goe", "--ffn_scale", "2", "--smoke"])
    assert c.models == ("deq", "tied") and not c.memory and c.deq.pre_ln
    assert (c.deq.jr_gamma, c.deq.d_model, c.deq.ffn_init, c.deq.ffn_scale) == (0.1, 32, "goe", 2)
    assert (c.data.vocab_size, c.seq_len, c.deq.max_steps) == (300, 16, 4)  # smoke
    assert lm.EXPERIMENT.parse(["--memory"]).memory


def test_dtype_flag_and_its_tolerance_check(tmp_path, capsys):
    c = lm.EXPERIMENT.parse(["--dtype", "bfloat16", "--tol", "1e-2"])
    assert c.compute.dtype == "bfloat16" and lm.check(c) is None
    c = lm.EXPERIMENT.parse(["--dtype", "bfloat16"])  # one flag: a tolerance bfloat16 resolves
    assert c.deq.tol == 0.01 and lm.check(c) is None
    with pytest.raises(SystemExit) as stop:
        lm.main(["--dtype", "bfloat16", "--tol", "1e-3", "--out_dir", str(tmp_path / "o")])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "--tol 0.001" in err and "--dtype bfloat16" in err


@pytest.mark.slow  # ~20 s alone, ~60 s on a loaded 2-core machine
def test_language_model_smoke(tmp_path):
    summary = run_smoke(
        "language_model", tmp_path, "--models", "deq,tied", "--jr_gamma", "0.1", timeout=900
    )
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
        assert len(r["history"]["nll"]) == 3
    # The DEQ reports its forward residual (explicit models: NaN) and the JR estimate.
    assert 0 < deq["forward_rel_residual_eval"] < 1
    assert math.isnan(float(tied["forward_rel_residual_eval"]))  # JSON: "nan"
    assert deq["jac_fro_sq_train_last"] > 0
    # Carried memory: one [B, M, D] equilibrium vs one state per explicit layer.
    depth = tied["depth_or_max_steps"]
    assert deq["carried_memory_shape"] == [4, 16, 16]  # smoke: B=4, M=T=16, D=16
    assert tied["carried_memory_shape"] == [depth, 4, 16, 16]
    assert tied["carried_memory_bytes"] == depth * deq["carried_memory_bytes"] == depth * 4096
    assert (tmp_path / "loss.png").exists() and (tmp_path / "metrics_deq.jsonl").exists()


@pytest.mark.slow
def test_language_model_smoke_untied_no_memory_pre_ln(tmp_path):
    summary = run_smoke(
        "language_model", tmp_path, "--models", "deq,untied", "--no-memory", "--pre_ln", timeout=900
    )
    deq, untied = summary["results"]
    assert untied["params"] > deq["params"]
    assert all(math.isfinite(r["valid_ppl"]) for r in summary["results"])
    assert deq["carried_memory_bytes"] == untied["carried_memory_bytes"] == 0
