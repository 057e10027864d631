"""The public API: each public module's ``__all__`` is the only list of public names, docs/api.md
is generated from them and kept fresh, and DESIGN.md's contract names and keywords are present.

Growing or shrinking the API is an edit of the module's ``__all__``, then ``python
docs/make_api.py`` to regenerate docs/api.md (the test below fails, naming that command, until it
is run).
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import inspect
import pathlib

import pytest

import deqjax as dq

ROOT = pathlib.Path(__file__).resolve().parent.parent
API_MD = ROOT / "docs" / "api.md"


def _make_api():
    """docs/make_api.py, the script that writes docs/api.md, as a module."""
    spec = importlib.util.spec_from_file_location("make_api", ROOT / "docs" / "make_api.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


make_api = _make_api()
MODULES = make_api.public_modules()


def test_every_public_face_is_a_public_module():
    """Each ``deqjax/<name>.py`` is named in ``deqjax.__all__`` (so it gets its api.md section)."""
    faces = {f"deqjax.{p.stem}" for p in (ROOT / "deqjax").glob("*.py") if p.stem != "__init__"}
    assert faces == set(MODULES) - {"deqjax"}


@pytest.mark.parametrize("module", MODULES)
def test_all_names_each_public_name_once_and_it_exists(module):
    mod = importlib.import_module(module)
    names = mod.__all__
    assert len(names) == len(set(names)), f"{module}.__all__ names something twice"
    missing = [name for name in names if not hasattr(mod, name)]
    assert not missing, f"{module}.__all__ names what it lacks: {missing}"


@pytest.mark.parametrize("module", MODULES)
def test_every_public_name_has_a_docstring_summary(module):
    mod = importlib.import_module(module)
    for name in mod.__all__:
        obj = getattr(mod, name)
        if make_api.kind(obj) in ("module", "class", "function"):
            assert make_api.summary(obj), f"{module}.{name} has no docstring of its own"


def test_api_md_is_what_make_api_writes_now():
    written, fresh = API_MD.read_text(encoding="utf-8"), make_api.render()
    if written != fresh:
        diff = difflib.unified_diff(
            written.splitlines(), fresh.splitlines(), "docs/api.md", "generated", lineterm="", n=1
        )
        pytest.fail(
            f"docs/api.md is stale: run `{make_api.REGENERATE}`.\n" + "\n".join(list(diff)[:40])
        )


def test_a_name_added_to_all_changes_the_generated_file(monkeypatch):
    """The freshness check can fail: a public name less (or more) is another api.md."""
    before = make_api.render()
    names = list(dq.jacobian.__all__)
    monkeypatch.setattr(dq.jacobian, "__all__", names[1:])
    assert make_api.render() != before
    monkeypatch.setattr(dq.jacobian, "hutchinson", dq.jacobian.frobenius_sq, raising=False)
    monkeypatch.setattr(dq.jacobian, "__all__", [*names, "hutchinson"])
    assert "### `hutchinson` (function)" in make_api.render()


def test_api_md_says_it_is_generated_and_how():
    text = API_MD.read_text(encoding="utf-8")
    assert "do not edit" in text.split("\n\n")[1] and make_api.REGENERATE in text[:400]


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
