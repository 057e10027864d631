"""Smoke run of experiments/init_theory.py: figures and a sane CSV are written."""

import csv
import json
import math

import pytest

from experiments import init_theory


@pytest.mark.slow  # ~10 s of plots; tests/theory checks every prediction in the default lane
def test_smoke_run_writes_figures_and_csv(tmp_path):
    module = init_theory
    out = module.main(["--smoke", "--quiet", "--out_dir", str(tmp_path)])
    for name in module.FIGURES.values():
        path = tmp_path / name
        assert path.exists() and path.stat().st_size > 5_000, name  # a real plot, not empty
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["smoke"] and config["n"] == 32
    assert "GOE" in (tmp_path / "README.md").read_text()

    with open(tmp_path / "results.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(out["rows"]) == 3 * (3 + 3 * 3)  # 3 ensembles x (fig1 + figs 2-4)
    figures = {r["figure"] for r in rows}
    assert figures == {"fig1", "fig2", "fig3", "fig4"}
    for r in rows:
        empirical, theory = float(r["empirical"]), float(r["theory"])
        scale = float(r["scale"])
        if r["figure"] == "fig1":
            # (1/n) tr((I-W)^-1 (I-W)^-T) >= ~1 and theory inf only beyond the edge.
            assert empirical > 0.5 and math.isfinite(empirical)
            if math.isfinite(theory):
                assert theory >= 1.0
            else:
                assert scale >= (0.5 if r["ensemble"] == "goe" else 1.0)
        elif r["figure"] == "fig2":
            assert empirical > 0.5 and theory >= 1.0  # q >= sigma_x^2 = 1 in theory
        elif r["figure"] == "fig3":
            assert 0 < empirical < 10 and 0 < theory < 10
        else:
            assert empirical >= 0 and 0.3 < theory < 3  # predicted critical scale
    # Small scale: theory and Monte-Carlo agree even at n = 32.
    small = [r for r in rows if r["figure"] == "fig1" and float(r["scale"]) == 0.05]
    for r in small:
        assert math.isclose(float(r["empirical"]), float(r["theory"]), rel_tol=0.02)
