"""The solver demo (the interim main job) runs end to end in smoke mode and writes its outputs."""

import json

import pytest

from tests.helpers.run_experiment import run_smoke


@pytest.mark.slow  # ~12 s; the experiments' smokes of the main job run in the default lane
def test_solver_demo_smoke(tmp_path):
    results = run_smoke("solver_demo", tmp_path, data_source=False)
    png = tmp_path / "convergence.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    table = (tmp_path / "table.md").read_text()
    assert "| solver | NFE mean" in table
    names = ["fixed_point_iteration", "anderson(m=5)", "broyden(memory=None)", "broyden(memory=10)"]
    assert sorted(results) == sorted(names)
    for name in names:
        assert name in table and 1 <= results[name]["nfe_mean"] <= 20
    config = json.loads((tmp_path / "config.json").read_text())
    # the solver objects are logged field by field
    assert config["solvers"]["anderson(m=5)"] == {**config["solvers"]["anderson(m=5)"], "m": 5}
    assert config["solvers"]["broyden(memory=10)"]["type"] == "Broyden"
    assert config["solvers"]["broyden(memory=10)"]["max_steps"] == 20
