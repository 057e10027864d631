"""The public module ``deqjax.harness``: its names, frozen here, and that ``import deqjax`` does
not load it (nor tyro)."""

from __future__ import annotations

import subprocess
import sys

from deqjax import harness

PUBLIC = {
    "CorpusConfig",
    "Experiment",
    "FloatList",
    "GRADIENTS",
    "InitSweepConfig",
    "IntList",
    "JRConfig",
    "LoggingConfig",
    "MDEQConfig",
    "MLPClassifierConfig",
    "MultiHostConfig",
    "NonNegativeFloat",
    "NonNegativeInt",
    "OptimizationConfig",
    "PositiveFloat",
    "PositiveInt",
    "ResumableRunConfig",
    "RunConfig",
    "RunContext",
    "RunDir",
    "RunDirError",
    "SequenceModelConfig",
    "SolverConfig",
    "StackedRuns",
    "Switch",
    "UsageError",
    "at_least",
    "batch_fns",
    "choice_list",
    "config_changes",
    "evaluate_classifier",
    "flat_dict",
    "format_metrics",
    "format_value",
    "grid",
    "line_plot",
    "markdown_table",
    "median_rows",
    "parse_config",
    "plot_jr_fig5",
    "plot_metrics",
    "plot_panels",
    "plot_sweep",
    "prepare_run_dir",
    "pyplot",
    "report_sweep",
    "run",
    "run_until_interrupted",
    "save_figure",
    "short_runs",
    "solver_and_adjoint",
    "summarize_runs",
    "to_python",
    "write_csv",
    "write_json",
}


def test_public_names_are_frozen():
    assert set(harness.__all__) == PUBLIC  # a deliberate edit grows the API
    assert len(harness.__all__) == len(PUBLIC)
    for name in PUBLIC:
        assert getattr(harness, name) is not None, name


def test_import_deqjax_loads_neither_the_harness_nor_tyro():
    code = "import sys, deqjax; print('deqjax.harness' in sys.modules, 'tyro' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]
