"""Runs an experiment with ``--smoke`` in a subprocess for the experiment smoke tests.

The one way the tests start an experiment as a program: ``python -m experiments.<name>`` from the
repository root (the module a user runs as ``python experiments/<name>.py``; in-process checks
import it as ``from experiments import <name>``). A subprocess gives the experiment its own jax
config: it runs in float32 with the default promotion rules, not under this suite's
float64/strict conftest settings.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def run_module(name: str, *flags: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """``python -m experiments.<name> *flags`` from the repository root, on CPU; checks exit 0."""
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env.pop("JAX_ENABLE_X64", None)
    cmd = [sys.executable, "-m", f"experiments.{name.removesuffix('.py')}", *flags]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return proc


def run_smoke(
    script: str, out_dir: pathlib.Path, *flags: str, data_source: bool = True, timeout: float = 300
) -> dict:
    """Runs ``experiments/<script> --smoke``; checks the logged config; returns results.json.

    Args:
      script: the experiment's name (``"solver_demo"`` or ``"solver_demo.py"``).
      out_dir: its ``--out_dir``.
      flags: further flags.
      data_source: also require the ``data source:`` line some experiments print.
      timeout: seconds.
    """
    flags = ("--smoke", "--no_progress", "--out_dir", str(out_dir), *flags)
    proc = run_module(script, *flags, timeout=timeout)
    if data_source:
        assert "data source:" in proc.stdout
    assert (out_dir / "config.json").exists()
    config = json.loads((out_dir / "config.json").read_text())
    assert config["seed"] == 0 and config["smoke"] is True
    return json.loads((out_dir / "results.json").read_text())
