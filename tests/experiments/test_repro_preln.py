"""``experiments/repro_preln.py`` (REPRODUCTION.md claim 5): the step-0 diagnosis, tiny (a
subprocess, ``tests.helpers.run_experiment.run_module``: float32 as a user runs it)."""

import json
import math

import pytest

from tests.helpers.run_experiment import run_module


@pytest.mark.slow  # exact Jacobians and two cells: ~20 s alone
def test_diagnosis_rows(tmp_path):
    out = tmp_path / "rows.json"
    argv = ["--ln", "pre,post", "--x_scale", "0.02", "--seeds", "1", "--d_model", "8"]
    proc = run_module(
        "repro_preln", *argv, "--seq_len", "4", "--batch_size", "2", "--out", str(out)
    )
    rows = json.loads(out.read_text())
    assert [r["pre_ln"] for r in rows] == [True, False]
    for r in rows:  # every diagnosis of the module docstring, finite
        assert 1 <= r["fwd_nfe"] <= 12 and r["bwd_nfe"] <= 12
        keys = ("fwd_rel_residual", "z_rms", "jac_fro_sq_per_d", "spectral_radius", "grad_norm")
        assert all(math.isfinite(r[k]) and r[k] >= 0 for k in keys), r
    assert proc.stdout.count("fwd_nfe") == 2
