"""``experiments/repro_lm_init.py`` (REPRODUCTION.md claim 2): the LM with FFN ensembles."""

from __future__ import annotations

import json
import math

import pytest

from tests.helpers.run_experiment import run_module


@pytest.mark.parametrize("flag", ["--d_model", "--ffn_scale", "--seed"])
def test_repro_lm_init_refuses_sweep_flags_after_the_separator(flag, monkeypatch, capsys):
    """A ``--d_model`` after ``--`` would change the width but not ``d_ff`` (GOE then fails, the
    other families silently widen): the driver refuses it, as it does the swept flags."""
    from experiments import repro_lm_init

    monkeypatch.setattr("sys.argv", ["repro_lm_init", "--seeds", "1", "--", flag, "64"])
    with pytest.raises(SystemExit) as e:
        repro_lm_init.main()
    assert e.value.code == 2 and "before '--'" in capsys.readouterr().err


@pytest.mark.slow  # three smoke LM runs, ~1-2 min
def test_repro_lm_init_sweep_runs_each_family_and_resumes(tmp_path):
    """One run per (scale, family, seed) with the FFN drawn from that ensemble at ``d_ff =
    d_model``; ``summary.json`` holds each run's loss and curves; a second call skips finished
    runs and resumes a killed one."""
    sweep = ("--families", "gaussian,goe", "--scales", "1.5", "--seeds", "1", "--d_model", "16")
    flags = (*sweep, "--threshold", "100", "--curve_every", "1", "--out_dir", str(tmp_path))
    flags = (*flags, "--", "--smoke")
    assert run_module("repro_lm_init", *flags, timeout=900).stdout.count("valid_ppl=") == 2
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert [(r["family"], r["scale"], r["seed"]) for r in summary["runs"]] == [
        ("gaussian", 1.5, 0),
        ("goe", 1.5, 0),
    ]
    for r in summary["runs"]:
        config = json.loads((tmp_path / f"s1.5_{r['family']}_seed0" / "config.json").read_text())
        assert (config["ffn_init"], config["ffn_scale"], config["d_ff"]) == (r["family"], 1.5, 16)
        assert len(r["train_nll"]) == 3 and math.isfinite(r["valid_loss"])
        assert r["below_threshold"] == 1.0  # every finite loss is below 100 nats
    done = tmp_path / "s1.5_goe_seed0" / "results.json"
    mtime = done.stat().st_mtime_ns
    (tmp_path / "s1.5_gaussian_seed0" / "results.json").unlink()  # as if killed before the end
    proc = run_module("repro_lm_init", *flags, timeout=900)
    assert done.stat().st_mtime_ns == mtime  # finished: not run again
    assert proc.stdout.count("valid_ppl=") == 1  # the killed one continued (--resume), not refused
    again = json.loads((tmp_path / "summary.json").read_text())["runs"][0]
    assert again["valid_loss"] == summary["runs"][0]["valid_loss"]  # from its final checkpoint
