"""The public API: every public module's ``__all__`` frozen here, DESIGN.md's contract names
present, and docs/api.md listing exactly the public names.

Growing or shrinking the API is a deliberate edit of three places: the module's ``__all__``, its
list below and its table in docs/api.md.
"""

from __future__ import annotations

import importlib
import inspect
import pathlib
import re
import types
import typing

import pytest

import deqjax as dq

API_MD = pathlib.Path(__file__).resolve().parent.parent / "docs" / "api.md"

PUBLIC = {
    "deqjax": [
        "Adjoint",
        "BackwardStats",
        "ImplicitAdjoint",
        "OneStepAdjoint",
        "PhantomAdjoint",
        "ReversibleAdjoint",
        "ShineAdjoint",
        "UnrolledAdjoint",
        "correction_loss",
        "correction_states",
        "correction_weights",
        "data",
        "fixed_point",
        "harness",
        "initializers",
        "jacobian",
        "models",
        "nn",
        "regularization",
        "solvers",
        "theory",
        "training",
        "uniform_sample_steps",
    ],
    "deqjax.solvers": [
        "Anderson",
        "BiCGStab",
        "Broyden",
        "BroydenInverse",
        "CONVERGED",
        "DIVERGED",
        "FixedPointIteration",
        "GMRES",
        "MAX_STEPS",
        "NONFINITE",
        "NormalCG",
        "PRECISION_FLOOR",
        "Reversible",
        "ReversibleState",
        "STALLED",
        "Solution",
        "Solver",
        "anderson",
        "as_solver",
        "bicgstab",
        "broyden",
        "fixed_point_iteration",
        "from_dict",
        "gmres",
        "normal_cg",
        "reversal_error",
        "reversible",
        "status_name",
        "summarize",
    ],
    "deqjax.nn": [
        "DEQ",
        "DEQOutput",
        "GroupNorm",
        "LayerNorm",
        "MLPCell",
        "MultiscaleCell",
        "TransformerCell",
        "TransformerInput",
        "TrellisCell",
        "TrellisInput",
        "VariationalDropout",
        "WeightNorm",
        "per_forward",
    ],
    "deqjax.models": [
        "ClassifierFns",
        "DEQSettings",
        "INIT_FAMILIES",
        "MDEQClassifier",
        "MLPClassifier",
        "ScalarDEQ",
        "SequenceBackbone",
        "SequenceModel",
        "budget_solver",
        "classifier_fns",
        "evaluate_lm",
        "initial_memory",
        "jr_fig5_metrics",
        "jr_synthetic_data",
        "jr_synthetic_target",
        "lm_loss",
        "next_memory",
        "recurrent_init",
        "reset_memory",
        "token_nll",
        "trellis_reach",
    ],
    "deqjax.training": [
        "Action",
        "CheckpointError",
        "Checkpointer",
        "DataParallel",
        "DistributedConfig",
        "Evaluate",
        "FitResult",
        "GuardNonFinite",
        "LogMetrics",
        "LoopResult",
        "MetricsWriter",
        "NonFiniteError",
        "PER_DEVICE",
        "REPLICATED",
        "ReportProgress",
        "ResidentBatches",
        "RestoreError",
        "RunDiagnostics",
        "SHARDED",
        "STATE_KINDS",
        "SaveCheckpoints",
        "StepMetrics",
        "StopOnSigterm",
        "TrainState",
        "TrainStep",
        "compile_with_memory",
        "data_parallel",
        "fit",
        "initialize_distributed",
        "make_optimizer",
        "make_schedule",
        "read_jsonl",
        "reduce_metrics",
        "replicate",
        "shard",
        "skip_nonfinite",
        "train_loop",
        "train_step",
        "unreplicate",
    ],
    "deqjax.data": [
        "BatchIterator",
        "CopyMemoryBatches",
        "DataFormatError",
        "DataNotFoundError",
        "ImageDataset",
        "IteratorState",
        "LMBatches",
        "LMCorpus",
        "SentencePieceTokenizer",
        "ShuffledBatches",
        "copy_memory_batch",
        "copy_memory_blank_loss",
        "copy_memory_steps_to_learn",
        "encode_corpus",
        "load_classification",
        "load_digits",
        "load_fashion_mnist",
        "load_image_dataset",
        "load_lm_corpus",
        "random_crop_flip",
        "train_sentencepiece",
    ],
    "deqjax.harness": [
        "DtypeConfig",
        "Experiment",
        "FloatList",
        "GRADIENTS",
        "IntList",
        "JRConfig",
        "LoggingConfig",
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
        "Switch",
        "UsageError",
        "at_least",
        "choice_list",
        "config_changes",
        "flat_dict",
        "format_metrics",
        "format_value",
        "grid",
        "line_plot",
        "markdown_table",
        "parse_config",
        "plot_metrics",
        "plot_panels",
        "plot_sweep",
        "prepare_run_dir",
        "pyplot",
        "run",
        "run_until_interrupted",
        "save_figure",
        "solver_and_adjoint",
        "summarize_runs",
        "to_python",
        "write_csv",
        "write_json",
    ],
    "deqjax.theory": [
        "ENSEMBLES",
        "PHI_NAMES",
        "PiecewiseLinear",
        "critical_scale",
        "forward_iteration",
        "gaussian_expectation",
        "jacobian_radius",
        "linear_second_moment",
        "linear_trace",
        "mean_field_variance",
        "monte_carlo_rows",
        "phi_prime_second_moment",
        "phi_second_moment",
        "piecewise_linear",
        "predicted_radius",
        "sample_matrix",
        "spectral_radius",
    ],
    "deqjax.initializers": [
        "Antisymmetric",
        "GOE",
        "Gaussian",
        "HaarNormal",
        "HaarOrthogonal",
        "antisymmetric",
        "gaussian",
        "goe",
        "haar_normal",
        "haar_orthogonal",
        "matrix_dims",
    ],
    "deqjax.jacobian": ["backward_convergence", "frobenius_sq", "spectral_radius"],
    "deqjax.regularization": ["AdaptiveGamma", "AdaptiveGammaState", "JacobianRegularizer"],
}
MODULES = list(PUBLIC)


def _difference(expected, actual) -> str:
    added = sorted(set(actual) - set(expected))
    removed = sorted(set(expected) - set(actual))
    return f"added: {added}; removed: {removed}"


def _kind(obj) -> str:
    """The kind column of docs/api.md for one public object."""
    if isinstance(obj, types.ModuleType):
        return "module"
    if typing.get_origin(obj) is typing.Annotated:
        return "type"
    if inspect.isclass(obj):
        return "class"
    return "function" if callable(obj) else "constant"


def _api_tables() -> dict[str, list[tuple[str, str]]]:
    """``{module: [(name, kind), ...]}`` from the ``## `module` `` sections of docs/api.md."""
    tables: dict[str, list[tuple[str, str]]] = {}
    section = None
    for line in API_MD.read_text(encoding="utf-8").splitlines():
        heading = re.fullmatch(r"## `([\w.]+)`", line.strip())
        if heading:
            section = heading.group(1)
            assert section not in tables, f"docs/api.md: section {section} twice"
            tables[section] = []
            continue
        row = re.match(r"\| `(\w+)` \| (\w+) \|", line)
        if section is not None and row:
            tables[section].append((row.group(1), row.group(2)))
    return tables


def test_the_lists_here_are_sorted_and_without_repeats():
    for module, names in PUBLIC.items():
        assert names == sorted(set(names)), module


@pytest.mark.parametrize("module", MODULES)
def test_all_is_frozen(module):
    names = importlib.import_module(module).__all__
    assert len(names) == len(set(names)), f"{module}.__all__ names something twice"
    assert sorted(names) == PUBLIC[module], (
        f"{module}.__all__ changed ({_difference(PUBLIC[module], names)}): a deliberate API "
        "change edits PUBLIC in tests/test_public_api.py and the table in docs/api.md"
    )


@pytest.mark.parametrize("module", MODULES)
def test_every_public_name_exists(module):
    mod = importlib.import_module(module)
    missing = [name for name in mod.__all__ if not hasattr(mod, name)]
    assert not missing, f"{module}.__all__ names what it lacks: {missing}"


def test_api_md_lists_exactly_the_public_names():
    tables = _api_tables()
    assert list(tables) == MODULES, "docs/api.md: one section per public module, in this order"
    for module, rows in tables.items():
        mod = importlib.import_module(module)
        listed = [name for name, _ in rows]
        assert len(listed) == len(set(listed)), f"docs/api.md lists a name twice in {module}"
        assert sorted(listed) == sorted(mod.__all__), (
            f"docs/api.md's {module} table differs from {module}.__all__ "
            f"({_difference(listed, mod.__all__)})"
        )
        for name, kind in rows:
            assert kind == _kind(getattr(mod, name)), f"docs/api.md: kind of {module}.{name}"


def test_api_md_counts_are_the_public_names():
    text = API_MD.read_text(encoding="utf-8")
    counts = dict(re.findall(r"^\| \[`([\w.]+)`\]\(#[\w]+\) \| (\d+) \|$", text, re.M))
    assert {m: int(n) for m, n in counts.items()} == {m: len(PUBLIC[m]) for m in MODULES}
    total = re.search(r"^\| total \| (\d+) \|$", text, re.M)
    assert total and int(total.group(1)) == sum(len(names) for names in PUBLIC.values())


# --- the names and keywords of the API contract (DESIGN.md) ------------------------------------


def test_solver_names():
    for name in ["fixed_point_iteration", "anderson", "broyden", "reversible", "Solution"]:
        assert callable(getattr(dq.solvers, name))
    codes = {
        dq.solvers.CONVERGED,
        dq.solvers.MAX_STEPS,
        dq.solvers.DIVERGED,
        dq.solvers.NONFINITE,
        dq.solvers.STALLED,
        dq.solvers.PRECISION_FLOOR,
    }
    assert codes == {0, 1, 2, 3, 4, 5}  # the first four keep their values (DESIGN.md)
    assert dq.solvers.status_name(dq.solvers.CONVERGED) == "converged"
    contract = {"value", "num_steps", "abs_residual", "rel_residual", "trace", "status"}
    assert contract | {"f_value", "aux"} <= set(dq.solvers.Solution._fields)


def test_solver_keywords_of_the_contract():
    fields = {
        dq.solvers.FixedPointIteration: {"max_steps", "tol", "stop_mode", "damping"},
        dq.solvers.Anderson: {"max_steps", "tol", "stop_mode", "m", "beta", "lam"},
        dq.solvers.Broyden: {"max_steps", "tol", "stop_mode", "memory", "line_search"},
    }
    for cls, names in fields.items():
        params = set(inspect.signature(cls).parameters)
        assert names | {"batch_ndim", "has_aux"} <= params, cls.__name__


def test_package_modules_and_contract_names():
    for name in [
        "fixed_point",
        "ImplicitAdjoint",
        "PhantomAdjoint",
        "OneStepAdjoint",
        "UnrolledAdjoint",
        "ReversibleAdjoint",
    ]:
        assert hasattr(dq, name)
    assert {"solver", "adjoint", "has_aux"} <= set(inspect.signature(dq.fixed_point).parameters)
    assert "solver" in inspect.signature(dq.ImplicitAdjoint).parameters
    assert {"steps", "tau"} <= set(inspect.signature(dq.PhantomAdjoint).parameters)
    assert callable(dq.jacobian.frobenius_sq) and callable(dq.jacobian.spectral_radius)
    for name in ["Gaussian", "HaarOrthogonal", "GOE"]:
        assert hasattr(dq.initializers, name)
    assert callable(dq.theory.linear_second_moment) and callable(dq.theory.spectral_radius)
    for name in ["DEQ", "MLPCell", "TransformerCell", "MultiscaleCell", "TrellisCell"]:
        assert hasattr(dq.nn, name)
    assert {"solver", "adjoint", "name"} <= set(inspect.signature(dq.nn.DEQ).parameters)
    assert hasattr(dq.nn, "WeightNorm") and hasattr(dq.nn, "VariationalDropout")
    assert hasattr(dq.regularization, "JacobianRegularizer")
    assert hasattr(dq.regularization, "AdaptiveGamma")
    assert callable(dq.training.fit) and callable(dq.data.load_fashion_mnist)


def test_shine_and_fixed_point_correction_names():
    assert issubclass(dq.ShineAdjoint, dq.Adjoint)
    assert hasattr(dq.solvers, "BroydenInverse")
    for name in [
        "correction_states",
        "correction_loss",
        "correction_weights",
        "uniform_sample_steps",
    ]:
        assert callable(getattr(dq, name))
    assert {"samples", "inverse_estimate"} <= set(dq.solvers.Solution._fields)


def test_solver_objects_and_summary_names():
    for name in [
        "FixedPointIteration",
        "Anderson",
        "Broyden",
        "Reversible",
        "GMRES",
        "BiCGStab",
        "NormalCG",
    ]:
        assert issubclass(getattr(dq.solvers, name), dq.solvers.Solver)
    for name in ["summarize", "as_solver", "from_dict"]:
        assert callable(getattr(dq.solvers, name))
