"""``import deqjax`` and the core (solvers, fixed_point, adjoints, jacobian, initializers, theory,
regularization) load only JAX; the Haiku layer and the training code load on first use.

Each check runs in a fresh interpreter: this test process has Haiku loaded already.
"""

import ast
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
HEAVY = ("haiku", "optax", "orbax", "matplotlib", "tqdm", "sentencepiece", "tensorflow_datasets")

USE_THE_CORE = """
import functools
import sys

import jax
import jax.numpy as jnp

import deqjax as dq

f = lambda p, x, z: jnp.tanh(p * z + x)
p, x, z0 = jnp.asarray(0.5), jnp.ones(3), jnp.zeros(3)
adjoint = dq.ImplicitAdjoint()
z, sol = dq.fixed_point(f, p, x, z0, solver=dq.solvers.anderson, adjoint=adjoint)
jax.grad(lambda p: dq.fixed_point(f, p, x, z0, adjoint=adjoint)[0].sum())(p)
dq.solvers.anderson(lambda z: jnp.cos(z), jnp.zeros(3))
key = jax.random.key(0)
dq.jacobian.frobenius_sq(lambda z: jnp.tanh(z), jnp.ones(3), key)
dq.initializers.GOE(1.0)
dq.initializers.goe(key, (4, 4), scale=0.5)
dq.theory.spectral_radius(0.9, "goe", 1.0, "tanh")
reg = dq.regularization.JacobianRegularizer(1.0, p=0.5)
reg.penalty(lambda z: jnp.tanh(z), jnp.ones(3), key)
"""


def _run(code: str) -> str:
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_the_core_loads_only_jax():
    code = USE_THE_CORE + f"\nprint(sorted(set(sys.modules) & set({HEAVY!r})))\n"
    assert _run(code).strip() == "[]"


LAYERS = [("nn", "haiku"), ("models", "haiku"), ("training", "optax")]


@pytest.mark.parametrize("name, heavy", LAYERS)
def test_the_layers_above_load_on_first_use(name, heavy):
    code = f"""
    import sys
    import deqjax as dq
    assert {heavy!r} not in sys.modules
    assert {name!r} in dir(dq)
    module = dq.{name}
    from deqjax import {name} as again
    assert again is module
    print({heavy!r} in sys.modules, module.__name__)
    """
    assert _run(code).split() == ["True", f"deqjax.{name}"]


def test_unknown_attribute_is_an_attribute_error():
    import deqjax as dq

    with pytest.raises(AttributeError, match="no_such_thing"):
        dq.no_such_thing  # noqa: B018


def test_theory_package_does_not_import_haiku_or_initializers():
    imported = set()
    for path in (ROOT / "deqjax" / "_src" / "theory").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                imported.add(node.module or "")
                imported.update(f"{node.module}.{alias.name}" for alias in node.names)
    assert imported, "no theory modules found"
    assert not any("haiku" in name or "initializers" in name for name in imported), imported


def _imported_modules(path: pathlib.Path) -> list[tuple[int, str]]:
    """``(line, module)`` of every absolute import in ``path``, function bodies included:
    ``from deqjax import solvers`` gives ``deqjax.solvers``, ``import deqjax as dq`` ``deqjax``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
    return found


def _is_public_face(module: str) -> bool:
    """``deqjax`` itself or a module of it outside ``deqjax._src``."""
    parts = module.split(".")
    return parts[0] == "deqjax" and (len(parts) == 1 or parts[1] != "_src")


def test_the_public_face_check_sees_public_imports(tmp_path):
    source = tmp_path / "m.py"
    source.write_text(
        "import deqjax as dq\nfrom deqjax import solvers\nfrom deqjax._src import tree\n"
        "def f():\n    import deqjax.nn\n"
    )
    faces = [m for _, m in _imported_modules(source) if _is_public_face(m)]
    assert faces == ["deqjax", "deqjax.solvers", "deqjax.nn"]


def test_the_implementation_imports_the_implementation_never_the_public_faces():
    """Code under ``deqjax/_src`` imports the ``_src`` module that defines a name, not ``deqjax``
    or ``deqjax.<module>`` (whose imports would run first and can cycle back)."""
    offenders = [
        f"{path.relative_to(ROOT)}:{line} imports {module}"
        for path in sorted((ROOT / "deqjax" / "_src").rglob("*.py"))
        for line, module in _imported_modules(path)
        if _is_public_face(module)
    ]
    assert not offenders, offenders


def test_the_library_never_imports_the_experiments():
    offenders = [
        f"{path.relative_to(ROOT)}:{line} imports {module}"
        for path in sorted((ROOT / "deqjax").rglob("*.py"))
        for line, module in _imported_modules(path)
        if module.split(".")[0] in ("experiments", "benchmarks", "notebooks", "tests")
    ]
    assert not offenders, offenders
