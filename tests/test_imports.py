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
HEAVY = (
    "haiku",
    "optax",
    "orbax",
    "matplotlib",
    "tqdm",
    "sentencepiece",
    "tensorflow_datasets",
    "flax",
    "equinox",
)

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
dq.initializers.HaarOrthogonal(0.5)(key, (4, 4), jnp.float32)  # JAX's protocol: no Haiku
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


FRONT_ENDS = [("nnx", "flax"), ("equinox", "equinox")]


@pytest.mark.parametrize("name, framework", FRONT_ENDS)
def test_each_front_end_loads_its_framework_and_not_haiku(name, framework):
    other = {"flax": "equinox", "equinox": "flax"}[framework]
    code = f"""
    import sys
    import deqjax as dq
    assert {framework!r} not in sys.modules
    assert {name!r} in dir(dq) and {name!r} in dq.__all__
    module = dq.{name}
    from deqjax import {name} as again
    assert again is module and module.DEQ.__module__.startswith("deqjax._src")
    print({framework!r} in sys.modules, {other!r} in sys.modules, "haiku" in sys.modules)
    """
    assert _run(code).split() == ["True", "False", "False"]


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


def _module_name(root: pathlib.Path, path: pathlib.Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports_outside_functions(body: list[ast.stmt]) -> list[ast.Import | ast.ImportFrom]:
    """The import statements that run when a module is imported or type-checked: at module
    level, in class bodies and in ``if``/``try``/``with`` blocks, ``if TYPE_CHECKING:``
    included; not those inside functions (they run on call)."""
    found = []
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        elif not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for field in ("body", "orelse", "finalbody", "handlers"):
                found += _imports_outside_functions(getattr(node, field, []))
    return found


def _import_graph(root: pathlib.Path, package: str) -> dict[str, set[str]]:
    """``module -> the package modules it imports`` for every module of ``package`` under
    ``root``, read from the source. ``from a.b import c`` names module ``a.b.c`` where that is a
    module, else ``a.b``; importing a submodule is not counted as importing its parents."""
    paths = {_module_name(root, p): p for p in (root / package).rglob("*.py")}
    graph = {}
    for name, path in paths.items():
        deps = set()
        for node in _imports_outside_functions(ast.parse(path.read_text(encoding="utf-8")).body):
            if isinstance(node, ast.Import):
                deps.update(alias.name for alias in node.names)
                continue
            base = node.module or ""
            if node.level:  # relative: from the module's package, up level - 1
                here = name if path.name == "__init__.py" else name.rpartition(".")[0]
                up = here.rsplit(".", node.level - 1)[0] if node.level > 1 else here
                base = f"{up}.{base}" if base else up
            deps.update(
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in paths else base
                for alias in node.names
            )
        graph[name] = {d for d in deps if d in paths and d != name}
    return graph


def _a_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` as ``[a, b, ..., a]``, or ``None``."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for dep in sorted(graph[node]):
            if state.get(dep) == 1:
                return path[path.index(dep) :] + [dep]
            if dep not in state and (found := visit(dep)):
                return found
        state[node] = 2
        path.pop()
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start)):
            return found
    return None


def test_the_cycle_check_sees_type_checking_and_relative_imports(tmp_path):
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("from pkg.sub import a\n")
    (package / "sub" / "__init__.py").write_text("")
    (package / "sub" / "a.py").write_text("from pkg.sub import b\n")
    (package / "sub" / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import A\n"
        "def later():\n    import pkg.c\n"
    )
    (package / "c.py").write_text("import pkg.sub.a\n")
    graph = _import_graph(tmp_path, "pkg")
    assert graph["pkg.sub.b"] == {"pkg.sub.a"}  # the call-time import of pkg.c is not counted
    assert _a_cycle(graph) == ["pkg.sub.a", "pkg.sub.b", "pkg.sub.a"]
    (package / "sub" / "b.py").write_text("")
    assert _a_cycle(_import_graph(tmp_path, "pkg")) is None


def test_no_import_cycle_among_deqjax_modules():
    """No module of ``deqjax`` imports, directly or through others, a module that imports it:
    counting every import that runs at import time and those under ``if TYPE_CHECKING:`` (a
    cycle that only a type checker follows is still two floors that know each other), not
    the imports inside functions."""
    cycle = _a_cycle(_import_graph(ROOT, "deqjax"))
    assert cycle is None, " -> ".join(cycle)
