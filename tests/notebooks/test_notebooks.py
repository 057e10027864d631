"""The example notebooks: paired with their jupytext sources and executable headless.

The notebook runs in a kernel started from THIS interpreter (a throw-away kernelspec pointing at
``sys.executable``), so it sees the same installed deqjax whatever ``python`` is first on PATH.
"""

import json
import pathlib
import sys

import pytest

jupytext = pytest.importorskip("jupytext")
nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

ROOT = pathlib.Path(__file__).resolve().parents[2]
NOTEBOOKS = ["initialization_ensembles"]
KERNEL_NAME = "deqjax-test-python"


def _cells(nb):
    return [(c.cell_type, c.source.strip()) for c in nb.cells]


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_ipynb_in_sync_with_py_source(name):
    source = jupytext.read(ROOT / "notebooks" / f"{name}.py")
    paired = nbformat.read(ROOT / "notebooks" / f"{name}.ipynb", as_version=4)
    assert _cells(source) == _cells(paired), (
        f"notebooks/{name}.ipynb is out of date: run "
        f"`jupytext --to ipynb notebooks/{name}.py` (the .py is the source of truth)."
    )


@pytest.fixture()
def kernel_env(tmp_path, monkeypatch):
    """A kernelspec that starts ipykernel with the current interpreter."""
    spec_dir = tmp_path / "jupyter" / "kernels" / KERNEL_NAME
    spec_dir.mkdir(parents=True)
    spec = {
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "deqjax test kernel",
        "language": "python",
    }
    (spec_dir / "kernel.json").write_text(json.dumps(spec))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    return tmp_path


@pytest.mark.slow
@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_executes_and_writes_figures(name, kernel_env, monkeypatch):
    out = kernel_env / "figures"
    monkeypatch.setenv("DEQJAX_NOTEBOOK_OUT", str(out))
    monkeypatch.setenv("DEQJAX_NOTEBOOK_FAST", "1")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    nb = nbformat.read(ROOT / "notebooks" / f"{name}.ipynb", as_version=4)
    elsewhere = kernel_env / "elsewhere"
    elsewhere.mkdir()
    client = nbclient.NotebookClient(
        nb,
        kernel_name=KERNEL_NAME,
        timeout=600,
        # started outside the repository: the notebook must not depend on the working directory
        resources={"metadata": {"path": str(elsewhere)}},
    )
    from jupyter_client.kernelspec import KernelSpecManager

    assert KernelSpecManager().get_kernel_spec(KERNEL_NAME).argv[0] == sys.executable
    client.execute()  # raises CellExecutionError on the first failing cell
    errors = [o for c in nb.cells for o in c.get("outputs", []) if o.output_type == "error"]
    assert not errors
    for figure in [
        "spectra.png",
        "digits_training.png",
        "init_theory/fig1_linear_trace.png",
        "init_theory/fig2_mean_field_q.png",
        "init_theory/fig3_spectral_radius.png",
        "init_theory/fig4_residual.png",
        "init_theory/results.csv",
    ]:
        path = out / figure
        assert path.exists() and path.stat().st_size > 1000, figure
    images = [o for c in nb.cells for o in c.get("outputs", []) if "image/png" in o.get("data", {})]
    assert len(images) >= 4  # the four paper figures are displayed inline
