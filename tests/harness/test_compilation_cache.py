"""JAX's persistent compilation cache, for the duration of a run (``--compilation_cache``)."""

from __future__ import annotations

import dataclasses
import os

import jax
import jax.numpy as jnp
import pytest

from deqjax import harness
from deqjax._src.harness.compilation_cache import MAX_BYTES, persistent_compilation_cache

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
        jax.experimental.compilation_cache.compilation_cache.reset_cache()


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
