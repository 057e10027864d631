"""JAX's persistent compilation cache, for the duration of a run (``--compilation_cache``)."""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest
from jax.experimental.compilation_cache import compilation_cache

from deqjax import harness
from deqjax._src.harness import compilation_cache as cache_module
from deqjax._src.harness.compilation_cache import (
    ACCESS_TIME,
    DEFAULT,
    ENV_VAR,
    MAX_BYTES,
    PROGRAM,
    folder_of,
    persistent_compilation_cache,
)

_hits = [0]


def _on_event(event: str, *args, **kwargs) -> None:
    if event == "/jax/compilation_cache/cache_hits":
        _hits[0] += 1


jax.monitoring.register_event_listener(_on_event)


@pytest.fixture(autouse=True)
def cache_every_program():
    """JAX keeps only programs that compiled for at least 1 s; these compile in milliseconds."""
    before = jax.config.jax_persistent_cache_min_compile_time_secs
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    yield
    jax.config.update("jax_persistent_cache_min_compile_time_secs", before)


def _program(scale: float):
    """A fresh jitted function (nothing in the in-memory caches)."""
    return jax.jit(lambda x: jnp.tanh(x * scale).sum())


def test_a_second_run_loads_what_the_first_compiled_and_the_setting_is_restored(tmp_path):
    assert jax.config.jax_compilation_cache_dir is None
    folder = tmp_path / "cache"
    with persistent_compilation_cache(str(folder)) as used:
        assert used == str(folder) and jax.config.jax_compilation_cache_dir == str(folder)
        assert jax.config.jax_compilation_cache_max_size == MAX_BYTES  # bounded, and locked
        _program(1.25)(jnp.ones(3))
    assert jax.config.jax_compilation_cache_dir is None  # restored after the run
    assert jax.config.jax_compilation_cache_max_size == -1
    assert (folder / ".lockfile").exists()
    assert len(os.listdir(folder)) >= 1
    hits = _hits[0]
    _program(1.25)(jnp.ones(3))  # no cache outside a run: compiled again
    assert _hits[0] == hits
    with persistent_compilation_cache(str(folder)):
        _program(1.25)(jnp.ones(3))  # the same program: loaded
    assert _hits[0] == hits + 1


def test_an_empty_folder_name_or_a_folder_set_through_jax_leaves_the_setting_alone(tmp_path):
    with persistent_compilation_cache("") as used:
        assert used is None and jax.config.jax_compilation_cache_dir is None
    mine = str(tmp_path / "mine")
    jax.config.update("jax_compilation_cache_dir", mine)
    try:
        with persistent_compilation_cache(str(tmp_path / "other")) as used:
            assert used == mine and jax.config.jax_compilation_cache_dir == mine
        assert jax.config.jax_compilation_cache_dir == mine
    finally:
        jax.config.update("jax_compilation_cache_dir", None)
        compilation_cache.reset_cache()


@dataclasses.dataclass(frozen=True)
class _Config:
    """Runs one small jitted program."""

    scale: float = 0.75
    run: harness.RunConfig = harness.RunConfig()


def _run(c: _Config, inputs, ctx):
    return {
        "value": float(_program(c.scale)(jnp.ones(4))),
        "cache": ctx.config["compilation_cache"],
    }


_EXPERIMENT = harness.Experiment(
    name="cache_toy",
    doc="Compiles one program.",
    config=_Config(),
    setup=lambda c: ({}, {}),
    run=_run,
)


def test_the_runner_keeps_the_programs_of_a_run_in_the_folder_of_the_flag(tmp_path):
    folder = tmp_path / "xla"
    argv = ["--out_dir", str(tmp_path / "run"), "--compilation_cache", str(folder)]
    res = harness.run(_EXPERIMENT, argv)
    assert res["cache"] == str(folder) and len(os.listdir(folder)) >= 1
    assert jax.config.jax_compilation_cache_dir is None
    hits = _hits[0]
    harness.run(_EXPERIMENT, [*argv, "--overwrite"])
    assert _hits[0] == hits + 1
    off = tmp_path / "off"
    harness.run(_EXPERIMENT, ["--out_dir", str(off), "--compilation_cache", "", "--scale", "2"])
    assert _hits[0] == hits + 1 and sorted(os.listdir(off)) == ["config.json", "results.json"]


ROOT = pathlib.Path(__file__).resolve().parents[2]

# A program: an experiment that compiles `--programs` small programs (kept however fast they
# compiled) and returns the cache folder in use.
TOY_SCRIPT = '''
import dataclasses, sys
import jax, jax.numpy as jnp
from deqjax import harness

jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)


@dataclasses.dataclass(frozen=True)
class Config:
    """Compiles a few small programs."""

    programs: int = 8  # how many
    run: harness.RunConfig = harness.RunConfig()


def run(c, inputs, ctx):
    for i in range(c.programs):
        jax.jit(lambda x, s=i + 0.5: jnp.tanh(x * s).sum())(jnp.ones(3)).block_until_ready()
    return {"cache": jax.config.jax_compilation_cache_dir}


harness.run(
    harness.Experiment(
        name="toy", doc="Compiles.", config=Config(), setup=lambda c: ({}, {}), run=run
    ),
    sys.argv[1:],
)
'''


def _start_toy(tmp_path, name: str, *flags: str, **env: str) -> subprocess.Popen:
    script = tmp_path / "toy.py"
    script.write_text(TOY_SCRIPT)
    python_path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    return subprocess.Popen(
        [sys.executable, str(script), "--out_dir", str(tmp_path / name), "--no_progress", *flags],
        env=dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=python_path, **env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _finish(proc: subprocess.Popen) -> str:
    """The process's stderr, once it exited 0."""
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, out[-2000:] + err[-4000:]
    return err


def _programs(folder) -> list[str]:
    return sorted(name for name in os.listdir(folder) if name.endswith(PROGRAM))


def test_concurrent_runs_share_a_folder_holding_a_program_without_access_time_and_never_warn(
    tmp_path,
):
    """JAX's bounded cache reads the access time of every program of the folder on every write:
    one program written without it (here by JAX's own, unbounded, setting, as by deqjax before
    the bound) made every write of every later run warn. Two runs at once, compiling the same
    programs, then find every program with its access time and say nothing."""
    folder = tmp_path / "cache"
    compilation_cache.reset_cache()
    jax.config.update("jax_compilation_cache_dir", str(folder))  # unbounded: no access times
    try:
        _program(3.5)(jnp.ones(3))
    finally:
        jax.config.update("jax_compilation_cache_dir", None)
        compilation_cache.reset_cache()
    assert [p for p in _programs(folder) if not (folder / p.replace(PROGRAM, ACCESS_TIME)).exists()]
    flags = ("--compilation_cache", str(folder), "--programs", "12")
    runs = [_start_toy(tmp_path, f"run{i}", *flags) for i in range(2)]
    errors = [_finish(run) for run in runs]
    for err in errors:
        assert "compilation cache" not in err, err[-2000:]
    programs = _programs(folder)
    assert len(programs) >= 13  # the first program, the runs' 12 (and their jnp.ones)
    assert all((folder / p.replace(PROGRAM, ACCESS_TIME)).exists() for p in programs)


def test_the_bound_is_set_before_the_folder_and_taken_off_after_it(tmp_path, monkeypatch):
    """A compilation of an earlier run still going on in the background never sees the folder
    without the bound (it would write programs without access times)."""
    seen = []
    update = jax.config.update

    def watch(name, value):
        update(name, value)
        seen.append(
            (jax.config.jax_compilation_cache_dir, jax.config.jax_compilation_cache_max_size)
        )

    monkeypatch.setattr(jax.config, "update", watch)
    with persistent_compilation_cache(str(tmp_path / "cache")):
        pass
    monkeypatch.undo()
    assert seen and all(size == MAX_BYTES for folder, size in seen if folder is not None)
    assert seen[-1] == (None, -1)


def test_without_filelock_a_run_has_no_cache_rather_than_an_unbounded_one(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.setattr(cache_module, "has_filelock", lambda: False)
    with persistent_compilation_cache(str(tmp_path / "cache")) as used:
        assert used is None and jax.config.jax_compilation_cache_dir is None
    assert "install filelock" in capsys.readouterr().err
    assert not (tmp_path / "cache").exists()


def test_the_suite_uses_a_temporary_folder_and_a_run_writes_nothing_into_home(tmp_path):
    """tests/conftest.py points the runner's default folder at a temporary one for the session,
    which subprocesses inherit: a run with the default flags (and HOME an empty folder here)
    keeps its programs there and creates nothing under HOME."""
    home = tmp_path / "home"
    home.mkdir()
    _finish(_start_toy(tmp_path, "run", "--programs", "2", HOME=str(home)))
    assert list(home.rglob("*")) == []
    session = os.path.abspath(os.environ[ENV_VAR])
    assert not session.startswith(os.path.expanduser("~") + os.sep)
    used = json.loads((tmp_path / "run" / "results.json").read_text())["cache"]
    assert used == session and len(_programs(used)) >= 2
    assert folder_of(DEFAULT) == session
