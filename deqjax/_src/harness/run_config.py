"""The run section every experiment's configuration holds (as its field ``run``).

``--seed``, ``--out_dir`` (the runner's default: ``runs/<name>[_<mode>][_smoke]``), ``--smoke``,
``--no_progress`` (alias ``--quiet``), ``--overwrite`` and ``--compilation_cache`` (JAX's persistent
compilation cache, :mod:`~deqjax._src.harness.compilation_cache`); :class:`ResumableRunConfig` adds
``--resume`` and ``--force`` for experiments that checkpoint. What the run folder does with them
is :func:`~deqjax.harness.prepare_run_dir`'s.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated

import tyro

from deqjax._src.harness.compilation_cache import DEFAULT as COMPILATION_CACHE
from deqjax._src.harness.flag_types import Switch


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """Run: seed, output folder, smoke mode, progress bar, overwriting an earlier run."""

    seed: int = 0  # seed of init, data and order
    out_dir: str = "runs/run"  # output folder
    smoke: Switch = False  # tiny run for tests (minutes on a CPU; --smoke --help: its defaults)
    progress: Annotated[Switch, tyro.conf.arg(aliases=("--quiet",))] = True
    """hide the progress bar (default: the bar is shown)"""
    overwrite: Switch = False
    """start afresh in an --out_dir holding an earlier run, deleting that run's files"""
    compilation_cache: str = COMPILATION_CACHE
    """folder where JAX keeps the programs that took over a second to compile, for later runs to
    load ('': off; DEQJAX_COMPILATION_CACHE_DIR, if set, replaces the default; a
    JAX_COMPILATION_CACHE_DIR set in the environment is used instead of either)"""


@dataclasses.dataclass(frozen=True)
class ResumableRunConfig(RunConfig):
    """Run: seed, output folder, smoke mode, progress bar, overwriting or resuming a run."""

    resume: Switch = False
    """continue the run in --out_dir from its newest good checkpoint (refused if a flag changed)"""
    force: Switch = False
    """with --resume: accept changes of the flags safe to change (e.g. a longer --epochs)"""
