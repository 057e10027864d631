"""The solver demo (the interim main job) runs end to end in smoke mode and writes its outputs."""

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_solver_demo_smoke(tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            str(REPO / "experiments" / "solver_demo.py"),
            "--smoke",
            "--out_dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    assert "| solver | NFE mean" in out.stdout
    png = tmp_path / "convergence.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    table = (tmp_path / "table.md").read_text()
    for name in ["fixed_point_iteration", "anderson", "broyden(memory=None)", "broyden(memory=10)"]:
        assert name in table
    results = json.loads((tmp_path / "results.json").read_text())
    for r in results.values():
        assert 1 <= r["nfe_mean"] <= r["nfe_max"] <= 20
        assert 0.0 <= r["frac_converged"] <= 1.0
        assert sum(r["status_counts"].values()) == 64
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["smoke"] and config["seed"] == 0
