"""``experiments/repro_preln.py`` (REPRODUCTION.md claim 5): the step-0 diagnosis, tiny."""

import json

import pytest

from experiments import repro_preln


@pytest.mark.slow  # exact Jacobians and two cells: ~20 s alone
def test_diagnosis_rows(tmp_path, capsys):
    out = tmp_path / "rows.json"
    argv = ["--ln", "pre,post", "--x_scale", "0.02", "--seeds", "1", "--d_model", "8"]
    repro_preln.main([*argv, "--seq_len", "4", "--batch_size", "2", "--out", str(out)])
    rows = json.loads(out.read_text())
    assert [r["pre_ln"] for r in rows] == [True, False]
    for r in rows:
        assert 1 <= r["fwd_nfe"] <= 12 and r["spectral_radius"] >= 0 and r["grad_norm"] > 0
    assert capsys.readouterr().out.count("fwd_nfe") == 2
