"""What a new user meets first: the README's code, the scripts' --help, smoke-run folders, errors.

The README's Python blocks are executed as written (each in a fresh namespace), so an example that
stops working fails here. The scripts' argument parsers are inspected in one subprocess: every
flag has help text, descriptions are whole sentences, and ``--smoke`` never writes into the full
run's folder.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys

import haiku as hk
import jax
import jax.numpy as jnp
import pytest

import deqjax as dq

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPTS = [
    "fashion_mnist",
    "solver_demo",
    "init_theory",
    "synthetic_1d",
    "copy_memory",
    "language_model",
    "cifar10_mdeq",
    "plot_metrics",
]


def _readme_python_blocks() -> list[str]:
    text = (ROOT / "README.md").read_text()
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def test_readme_has_a_deq_module_and_optax_example():
    blocks = _readme_python_blocks()
    assert any("dq.nn.DEQ" in b and "optax" in b for b in blocks)


@pytest.mark.parametrize("index", range(len(_readme_python_blocks())))
def test_readme_python_blocks_run(index, tmp_path):
    # As a user would run it: a fresh interpreter (float32, default promotion), another directory.
    code = _readme_python_blocks()[index]
    code += "\nif 'losses' in dir(): assert losses[-1] < 0.5 * losses[0], losses\n"
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=str(tmp_path),
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_readme_points_inside_the_repository():
    text = (ROOT / "README.md").read_text()
    assert "../shared" not in text
    for target in re.findall(r"\]\(([^)#:]+)\)", text):  # relative links must exist
        assert (ROOT / target).exists(), target
    assert (ROOT / "docs" / "design.md").exists()


def test_notebooks_extra_has_nbconvert():
    setup = (ROOT / "setup.cfg").read_text()
    extra = setup.split("notebooks =", 1)[1].split("\n\n", 1)[0].split("dev =", 1)[0]
    assert "nbconvert" in extra


def test_deq_names_the_users_unbatched_shape():
    def forward(x):
        return dq.nn.DEQ(dq.nn.MLPCell(16))(x)

    model = hk.transform(forward)
    with jax.numpy_dtype_promotion("standard"):
        with pytest.raises(ValueError, match=r"x of shape \[\(8,\)\].*x\[None\]"):
            model.init(jax.random.PRNGKey(0), jnp.ones(8, jnp.float32))


_INSPECT = r"""
import argparse, json, os, runpy, sys
found = {}


class Stop(Exception):
    pass


ORIG = argparse.ArgumentParser.parse_args


def fake_parse(self, args=None, namespace=None):
    # record the parser, and the namespace the script's own flow produces, then stop the script
    entry = found.setdefault(NAME, {})
    entry["missing"] = [
        a.option_strings[0] for a in self._actions
        if a.option_strings and not a.help and a.dest != "help"
    ]
    entry["description"] = self.description
    ns = ORIG(self, args, namespace)
    entry[MODE + "_out_dir"] = getattr(ns, "out_dir", None)
    raise Stop


argparse.ArgumentParser.parse_args = fake_parse
for NAME in SCRIPTS:
    for MODE, argv in (("full", []), ("smoke", ["--smoke"])):
        if NAME == "plot_metrics":
            argv = ["metrics.jsonl"]
        sys.argv = [NAME, *argv]
        try:
            runpy.run_module("experiments." + NAME, run_name="__main__")
        except Stop:
            pass
print(json.dumps(found))
"""


@pytest.fixture(scope="module")
def parsers() -> dict:
    code = f"ROOT = {str(ROOT)!r}\nSCRIPTS = {SCRIPTS!r}\n" + _INSPECT
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=str(ROOT),
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("name", SCRIPTS)
def test_every_flag_has_help(parsers, name):
    assert name in parsers, sorted(parsers)
    assert parsers[name]["missing"] == [], parsers[name]["missing"]


@pytest.mark.parametrize("name", SCRIPTS)
def test_descriptions_are_whole_sentences(parsers, name):
    first_paragraph = parsers[name]["description"].strip().split("\n\n")[0]
    assert first_paragraph.endswith("."), first_paragraph[-80:]


@pytest.mark.parametrize("name", [s for s in SCRIPTS if s != "plot_metrics"])
def test_smoke_runs_never_write_into_the_full_runs_folder(parsers, name):
    entry = parsers[name]
    assert entry["smoke_out_dir"] and entry["full_out_dir"], entry
    assert entry["smoke_out_dir"] != entry["full_out_dir"]
    assert entry["smoke_out_dir"].endswith("_smoke"), entry["smoke_out_dir"]


def test_curves_have_legends_and_no_flat_panels():
    from deqjax._src.training import plots

    records = []
    for step in (10, 20, 30):
        records.append({"split": "train", "step": step, "loss": 1.0 / step, "jr/gamma": 1.0})
        records.append({"split": "diagnostics", "step": step, "spectral_radius": 0.5 + step})
    records.append({"split": "eval", "step": 30, "loss": 0.05})
    fig, names, constant = plots.make_figure(records)
    assert names == ["loss", "spectral_radius"] and constant == {"jr/gamma": 1.0}
    panels = [ax for ax in fig.axes if ax.get_visible() and ax.axison]
    assert len(panels) == 2
    for ax in panels:  # a diagnostics-only panel too says what its line is
        assert ax.get_legend() is not None, ax.get_title()
    assert any("jr/gamma = 1" in t.get_text() for t in fig.texts)
