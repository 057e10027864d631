"""The main job's init sweep: its runs, and the report of their rows."""

from __future__ import annotations

import csv

import pytest

from experiments.parts.init_sweep import InitSweepConfig, report_sweep

ROWS = [
    {"family": "g", "scale": 1.0, "seed": 0, "test_error": 0.1, "test_nfe": 4.0},
    {"family": "g", "scale": 1.0, "seed": 1, "test_error": 0.3, "test_nfe": 6.0},
    {"family": "o", "scale": 1.0, "seed": 0, "test_error": 0.5, "test_nfe": 5.0},
]


def test_init_sweep_runs():
    sweep = InitSweepConfig(sweep_families=("goe",), sweep_scales=(0.5, 1.0))
    assert sweep.runs() == [{"family": "goe", "scale": 0.5, "seed": s} for s in (0, 1, 2)] + [
        {"family": "goe", "scale": 1.0, "seed": s} for s in (0, 1, 2)
    ]


def test_report_sweep_writes_its_files(tmp_path, capsys):
    summary = report_sweep(ROWS, tmp_path, title="t")
    assert [r["family"] for r in summary] == ["g", "o"]
    assert summary[0]["median_error"] == pytest.approx(0.2) and summary[0]["n"] == 2
    assert len(list(csv.DictReader(open(tmp_path / "sweep.csv")))) == 3
    assert len(list(csv.DictReader(open(tmp_path / "sweep_summary.csv")))) == 2
    assert (tmp_path / "sweep.png").stat().st_size > 0
    assert "| family | scale | n |" in capsys.readouterr().out
