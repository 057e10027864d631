"""The documentation's shape: a README that is a README, a design note that names only what
exists, the backward's fallback rule told once, and no machine timings in the library's
docstrings (they live in BENCHMARKS.md, with their commands).

The public names are checked in tests/test_public_api.py (docs/api.md is generated); the README's
and the guide's code and links in tests/test_first_contact.py.
"""

from __future__ import annotations

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DESIGN_MD = ROOT / "docs" / "design.md"
GUIDE = sorted((ROOT / "docs" / "guide").glob("*.md"))

# The README's two commands, as .ci/run and a fresh machine run them.
MAIN_JOB = (
    "apt-get update && apt-get install -y dataset-fashion-mnist && python3 -m venv .venv && "
    '. .venv/bin/activate && pip install -e ".[experiments]" && python experiments/fashion_mnist.py'
)
TESTS = (
    'python3 -m venv .venv && . .venv/bin/activate && pip install -e ".[test,experiments,notebooks,'
    'dev]" && python -m pytest -n 2'
)


def test_the_readme_is_short_and_opens_with_exactly_the_two_commands():
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 120
    first_screen = "\n".join(text.splitlines()[:30])
    commands = re.findall(r"```(?:bash|sh|console)\n(.*?)```", text, re.S)
    assert [c.strip() for c in commands] == [MAIN_JOB, TESTS]
    assert MAIN_JOB in first_screen and TESTS in first_screen


def test_ci_runs_the_readmes_test_command():
    assert "python -m pytest -n 2\n" in (ROOT / ".ci" / "run").read_text(encoding="utf-8")


def _named_paths(text: str) -> set[str]:
    """The file and folder paths a document names in backticks (``a/b.py``, ``a/b/``)."""
    return set(re.findall(r"`([\w./-]+/(?:[\w-]+\.(?:py|sh|md)|))`", text))


def test_every_path_design_md_names_exists():
    bases = [ROOT, ROOT / "deqjax", ROOT / "deqjax" / "_src"]
    paths = _named_paths(DESIGN_MD.read_text(encoding="utf-8"))
    assert len(paths) > 15
    gone = sorted(p for p in paths if not any((base / p).exists() for base in bases))
    assert not gone, f"docs/design.md names paths that do not exist: {gone}"


def test_design_md_is_a_note_not_a_reference():
    """Architecture and decisions, read in minutes: no module table, no API restated."""
    text = DESIGN_MD.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 250
    rows = re.findall(r"^\| `deqjax/", text, re.M)
    assert len(rows) < 5, "docs/design.md: a table of modules (api.md and the code list them)"
    for walk in ("Adding a solver", "Adding a gradient strategy", "python docs/make_api.py"):
        assert walk in text


def test_the_fallback_rule_is_told_once_in_the_docs():
    """The backward's fallback rule is stated on one page; the others link to it."""
    pages = [README, DESIGN_MD, *GUIDE]
    telling = [p.name for p in pages if "fallback_factor" in p.read_text(encoding="utf-8")]
    assert telling == ["implicit_backward.md"], telling


def _benchmark_sections_cited() -> list[tuple[str, str]]:
    """``(file, section)`` of every ``BENCHMARKS.md, "Section"`` citation in the docs and code."""
    files = [README, DESIGN_MD, *GUIDE, ROOT / "REPRODUCTION.md"]
    files += sorted((ROOT / "deqjax").rglob("*.py"))
    cited = []
    for path in files:
        text = re.sub(r"\n\s*#?\s*", " ", path.read_text(encoding="utf-8"))  # lines joined
        for match in re.finditer(r'BENCHMARKS\.md(?:\]\([^)]*\))?[,:]? "([^"]+)"', text):
            cited.append((path.relative_to(ROOT).as_posix(), match.group(1)))
    return cited


def test_every_cited_benchmarks_section_exists():
    text = (ROOT / "BENCHMARKS.md").read_text(encoding="utf-8")
    headings = [h.strip() for h in re.findall(r"^#+ (.*)$", text, re.M)]
    cited = _benchmark_sections_cited()
    assert len(cited) > 15
    missing = [(f, s) for f, s in cited if not any(h.startswith(s) for h in headings)]
    assert not missing, f"sections BENCHMARKS.md does not have: {missing}"


# A number with a unit of time, or a named machine: a measurement, which belongs in BENCHMARKS.md.
TIMING = re.compile(
    r"\b\d+(?:\.\d+)?(?:[–-]\d+(?:\.\d+)?)? ?(?:s|ms|µs|us|ns|seconds|minutes)\b(?![\w(])"
    r"|\bH\d00\b|\bA100\b|\bCPU cores\b"
)


def _timings(path: pathlib.Path) -> list[str]:
    """The lines of one module's docstrings and comments that quote a machine measurement."""
    hits = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if TIMING.search(line):
            hits.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    return hits


def test_no_machine_timings_in_the_library():
    hits = [hit for path in sorted((ROOT / "deqjax").rglob("*.py")) for hit in _timings(path)]
    assert not hits, "measurements belong in BENCHMARKS.md (with their command):\n" + "\n".join(
        hits
    )


def test_the_timing_check_sees_timings_and_only_them():
    for measured in [
        "about 0.2 ms a step",
        "took 1.3–1.9 s",
        "41.5 µs per iteration",
        "on 2 CPU cores",
        "measured on an H200",
        "slow import (~3 s)",
    ]:
        assert TIMING.search(measured), measured
    for setting in ["max_steps=5", "10 steps", "2 devices", "d = 512", "over a second", "3s_"]:
        assert not TIMING.search(setting), setting
