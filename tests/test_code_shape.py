"""The shape the library keeps: short files, short functions (design note, "One file per idea")."""

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1] / "deqjax"
MAX_FILE_LINES = 400
MAX_FUNCTION_LINES = 100
# Files with a tighter bound: the composition they hold must stay readable at a glance.
TIGHTER = {"_src/training/fit.py": 150, "_src/adjoints/implicit.py": 250}


def _sources():
    return sorted(ROOT.rglob("*.py"))


def test_no_file_over_its_bound():
    too_long = []
    for path in _sources():
        bound = TIGHTER.get(path.relative_to(ROOT).as_posix(), MAX_FILE_LINES)
        lines = len(path.read_text().splitlines())
        if lines > bound:
            too_long.append(f"{path.relative_to(ROOT.parent)}: {lines} lines > {bound}")
    assert not too_long, "\n".join(too_long)


def test_no_function_over_100_lines():
    too_long = []
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    too_long.append(f"{path.relative_to(ROOT.parent)}:{node.lineno} {node.name}")
    assert not too_long, "\n".join(too_long)


def test_the_bounds_see_what_they_bound():
    # The walk reaches nested packages and measures whole definitions (docstring included).
    assert any(p.match("_src/training/actions/*.py") for p in _sources())
    source = "def f():\n" + "    x = 1\n" * MAX_FUNCTION_LINES
    (node,) = ast.parse(source).body
    assert node.end_lineno - node.lineno + 1 == MAX_FUNCTION_LINES + 1
