"""Runs an experiment script with ``--smoke`` in a subprocess for the experiment smoke tests.

A subprocess gives the script its own jax config: the experiments run in float32 with the default
promotion rules, not under this suite's float64/strict conftest settings.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def run_smoke(script: str, out_dir: pathlib.Path, *flags: str) -> dict:
    """Runs ``experiments/<script> --smoke``; checks the logged config; returns results.json."""
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    cmd = [sys.executable, str(ROOT / "experiments" / script), "--smoke", "--no_progress"]
    cmd += ["--out_dir", str(out_dir), *flags]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert "data source:" in proc.stdout
    assert (out_dir / "config.json").exists()
    config = json.loads((out_dir / "config.json").read_text())
    assert config["seed"] == 0 and config["smoke"] is True
    return json.loads((out_dir / "results.json").read_text())
