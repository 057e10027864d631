"""What a new user meets first: the README's and the guide's code, the scripts' --help, smoke-run
folders, errors.

The Python blocks of README.md and docs/guide/*.md are executed as written (each in a fresh
interpreter), so an example that stops working fails here; a block right after a line
``<!-- test: slow -->`` runs in the slow lane. Every script's ``--help`` shows help text for every
flag and a description in whole sentences; ``--smoke`` never writes into the full run's folder;
every command README.md, the guide, BENCHMARKS.md and REPRODUCTION.md show parses, and their
links inside the repository lead somewhere.
"""

from __future__ import annotations

import dataclasses
import importlib
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
from deqjax import harness

ROOT = pathlib.Path(__file__).resolve().parents[1]
EXPERIMENTS = [
    "fashion_mnist",
    "solver_demo",
    "init_theory",
    "synthetic_1d",
    "repro_1d",
    "copy_memory",
    "language_model",
    "cifar10_mdeq",
]
SCRIPTS = [*EXPERIMENTS, "plot_metrics", "repro_lm_init", "repro_preln", "repro_init_sweep"]


GUIDE = sorted((ROOT / "docs" / "guide").glob("*.md"))
USER_DOCS = [ROOT / "README.md", *GUIDE]  # the pages whose code must run as written
SLOW = "<!-- test: slow -->"  # the line before a Python block that runs in the slow lane


def _python_blocks(path: pathlib.Path) -> list[tuple[str, bool]]:
    """``(code, slow)`` of each Python block of one Markdown file."""
    text = path.read_text(encoding="utf-8")
    blocks = re.finditer(
        r"^(?:(" + re.escape(SLOW) + r")\n)?```python\n(.*?)^```", text, re.M | re.S
    )
    return [(m.group(2), m.group(1) is not None) for m in blocks]


def test_readme_has_a_deq_module_and_optax_example():
    blocks = [code for code, _ in _python_blocks(ROOT / "README.md")]
    assert any("dq.nn.DEQ" in b and "optax" in b for b in blocks)


def test_the_guide_has_pages_with_code():
    assert len(GUIDE) >= 10 and (ROOT / "docs" / "guide" / "README.md") in GUIDE
    assert sum(len(_python_blocks(page)) for page in GUIDE) >= 8


def _block_params() -> list:
    """One parameter per Python block of the user docs, ``slow`` where marked so."""
    params = []
    for path in USER_DOCS:
        for i, (_, slow) in enumerate(_python_blocks(path)):
            name = path.relative_to(ROOT).as_posix()
            marks = [pytest.mark.slow] if slow else []
            params.append(pytest.param(name, i, marks=marks, id=f"{name}:{i}"))
    return params


@pytest.mark.parametrize(("doc", "index"), _block_params())
def test_python_blocks_of_the_readme_and_the_guide_run(doc, index, tmp_path):
    # As a user would run it: a fresh interpreter (float32, default promotion), another directory.
    code = _python_blocks(ROOT / doc)[index][0]
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


def _slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@pytest.mark.parametrize("path", USER_DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_links_point_inside_the_repository_and_arrive(path):
    text = path.read_text(encoding="utf-8")
    assert "../shared" not in text
    for target, anchor in re.findall(r"\]\(([^)#:]*)(?:#([^)]*))?\)", text):
        where = (path.parent / target).resolve() if target else path
        assert where.exists(), f"{path.name}: {target}"
        if anchor:
            headings = re.findall(r"^#+ (.*)$", where.read_text(encoding="utf-8"), re.M)
            assert anchor in {_slug(h) for h in headings}, f"{path.name}: {target}#{anchor}"


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


def _module(name: str):
    return importlib.import_module(f"experiments.{name}")


def _help(name: str, capsys, monkeypatch) -> str:
    """The script's ``--help`` as a terminal 80 columns wide shows it (one box per group)."""
    monkeypatch.setenv("COLUMNS", "80")
    with pytest.raises(SystemExit) as exit_:
        _module(name).main(["--help"])
    assert exit_.value.code == 0
    return capsys.readouterr().out


def _settings(name: str) -> set[str]:
    """The names of a script's settings: its flags, ``--<name>`` (bools also ``--no_<name>``)."""
    module = _module(name)
    if hasattr(module, "EXPERIMENT"):
        return set(harness.flat_dict(module.EXPERIMENT.config))
    fields = dataclasses.fields(module.Config)
    return {f.name for f in fields if f.default is not dataclasses.MISSING}


def _options(help_text: str, settings: set[str]) -> dict[str, str]:
    """``{setting: its help text}`` of tyro's option groups (default notes removed).

    Each group is a box (``│ line │``) or, where stdout is not UTF-8, lines indented by two
    spaces; in it an option line starts with the option's flags, its help follows after two
    spaces or on the indented lines below (a long metavar may take a line of its own first).
    """
    options: dict[str, str] = {}
    name = None
    for line in help_text.splitlines():
        if line.startswith("│ "):
            content = line[2:].rstrip("│ ")
        elif line.startswith("  "):
            content = line[2:].rstrip()
        else:
            name = None
            continue
        spec, _, text = content.partition("  ")
        flags = [f.strip(",").removeprefix("--") for f in spec.split() if f.startswith("--")]
        names = [f for flag in flags for f in (flag, flag.removeprefix("no_")) if f in settings]
        if content.startswith("--") and names:
            name = names[0]
            options[name] = text.strip()
        elif content.startswith(" ") and name is not None:
            options[name] += " " + content.strip()
        elif name is not None and options[name]:
            name = None  # the next group, or the end of the options
    return {k: re.sub(r"\(default: .*?\)", "", text).strip() for k, text in options.items()}


@pytest.mark.parametrize("name", SCRIPTS)
def test_every_flag_has_help_and_the_description_is_whole_sentences(name, capsys, monkeypatch):
    text = _help(name, capsys, monkeypatch)
    settings = _settings(name)
    options = _options(text, settings)
    assert set(options) == settings, sorted(settings - set(options))
    missing = [flag for flag, help_text in options.items() if not help_text]
    assert missing == [], missing
    description = text.split("\n\n", 1)[1]  # after the usage line
    first_paragraph = description.strip().split("\n\n")[0]
    assert first_paragraph.endswith("."), first_paragraph[-80:]
    doc = "".join(_module(name).__doc__.split())
    assert "".join(first_paragraph.split()) in doc  # the module docstring's first paragraph


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_smoke_runs_never_write_into_the_full_runs_folder(name):
    experiment = _module(name).EXPERIMENT
    full, smoke = experiment.parse([]).run.out_dir, experiment.parse(["--smoke"]).run.out_dir
    assert smoke != full and smoke.endswith("_smoke"), (full, smoke)


def _documented_commands() -> list[tuple[str, str, list[str]]]:
    """``(document, script, argv)`` of every experiment command in the README, the guide,
    BENCHMARKS.md and REPRODUCTION.md, with their placeholders (``S``, ``G``, ``OUT``,
    ``[--optional]``) filled in."""
    commands = []
    docs = ["README.md", *(p.relative_to(ROOT).as_posix() for p in GUIDE)]
    for doc in (*docs, "BENCHMARKS.md", "REPRODUCTION.md"):
        text = re.sub(r"\\\n\s*", " ", (ROOT / doc).read_text())  # continued lines
        pattern = r"python3? (?:-m experiments\.|experiments/)(\w+)(?:\.py)?([^`\n#|]*)"
        for match in re.finditer(pattern, text):
            argv = re.sub(r"[\[\]]", "", match.group(2)).split()
            argv = [PLACEHOLDERS.get(a, a) for a in argv]
            commands.append((doc, match.group(1), argv))
    return commands


PLACEHOLDERS = {"S": "0", "G": "1", "N": "2", "I": "0", "OUT": "runs/out", "HOST:PORT": "h:1"}


def _parse_command(script: str, argv: list[str]) -> None:
    module = _module(script)
    if hasattr(module, "EXPERIMENT"):
        module.EXPERIMENT.parse(argv)
    elif script == "repro_lm_init":  # its own flags, then the language model's after "--"
        cut = argv.index("--") if "--" in argv else len(argv)
        harness.parse_config(module.Config(), argv[:cut])
        _module("language_model").EXPERIMENT.parse(argv[cut + 1 :])
    else:
        harness.parse_config(module.Config(), argv)


def test_every_documented_command_parses():
    commands = _documented_commands()
    assert len(commands) > 30 and {script for _, script, _ in commands} >= set(EXPERIMENTS)
    for doc, script, argv in commands:
        try:
            _parse_command(script, argv)
        except SystemExit as e:
            pytest.fail(f"{doc}: python -m experiments.{script} {' '.join(argv)} (exit {e.code})")
