"""The run section every experiment's configuration holds (as its field ``run``).

``--seed``, ``--out_dir`` (the runner's default: ``runs/<name>[_<mode>][_smoke]``), ``--smoke``,
``--no_progress`` (alias ``--quiet``), ``--overwrite`` and ``--compilation_cache`` (JAX's persistent
compilation cache, :mod:`~deqjax._src.harness.compilation_cache`); :class:`ResumableRunConfig` adds,
for the experiments that train through :func:`~deqjax.training.fit`, ``--resume`` and ``--force``
(what the run folder does with them is :func:`~deqjax.harness.prepare_run_dir`'s) and where a
training's records go besides its JSONL file: TensorBoard event files (on unless
``--no_tensorboard``), Weights & Biases (``--wandb``), and a profiler trace of a window of steps
(``--profile_steps A:B``). :meth:`ResumableRunConfig.actions` and
:meth:`ResumableRunConfig.writers` build a training's periodic actions and metric writers for
``fit``, as Flax's ``train.py`` builds its hooks.
"""

from __future__ import annotations

import dataclasses
import os
from typing import TYPE_CHECKING, Annotated

import tyro

from deqjax._src.harness.compilation_cache import DEFAULT as COMPILATION_CACHE
from deqjax._src.harness.flag_types import StepWindow, Switch, step_window
from deqjax._src.training.actions.action import Action
from deqjax._src.training.actions.default_actions import default_actions
from deqjax._src.training.actions.profile_steps import ProfileSteps
from deqjax._src.training.writers.jsonl_writer import JsonlWriter
from deqjax._src.training.writers.metric_writer import MetricWriter, require
from deqjax._src.training.writers.tensorboard_writer import TensorBoardWriter
from deqjax._src.training.writers.wandb_writer import WandbWriter

if TYPE_CHECKING:
    from deqjax._src.harness.run_context import RunContext


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

    def check(self) -> str | None:
        """A usage error of these flags found before the run starts (None: none)."""
        return None


@dataclasses.dataclass(frozen=True)
class ResumableRunConfig(RunConfig):
    """Run: seed, output folder, smoke mode, progress bar, overwriting or resuming a run, where
    the metrics go (TensorBoard, W&B), a profiler window."""

    resume: Switch = False
    """continue the run in --out_dir from its newest good checkpoint (refused if a flag changed)"""
    force: Switch = False
    """with --resume: accept changes of the flags safe to change (e.g. a longer --epochs)"""
    tensorboard: bool = True
    """TensorBoard event files of the metrics in <out_dir>/tensorboard, beside the JSONL (view:
    pip install tensorboard && tensorboard --logdir <out_dir>)"""
    wandb: Switch = False
    """also log the metrics to Weights & Biases, project deqjax-<experiment> (pip install wandb)"""
    profile_steps: StepWindow = ""
    """trace the training steps A to B (A:B) with jax.profiler into <out_dir>/profile ('': no
    trace)"""

    def check(self) -> str | None:
        """``--wandb`` without the ``wandb`` package: the message names ``pip install wandb``."""
        if self.wandb:
            try:
                require("wandb", "wandb", "--wandb")
            except ModuleNotFoundError as e:
                return str(e)
        return None

    def writers(self, ctx: RunContext, name: str | None = None) -> list[MetricWriter]:
        """Where the records of the training ``name`` go (None: the run's one training): its
        JSONL file (``ctx.metrics_path(name)``), TensorBoard event files in
        ``<out_dir>/tensorboard[/<name>]`` unless ``--no_tensorboard``, and W&B with ``--wandb``
        (its files in ``<out_dir>`` or ``<out_dir>/wandb_<name>``)."""
        writers: list[MetricWriter] = [JsonlWriter(ctx.metrics_path(name))]
        if self.tensorboard:
            logdir = ctx.path("tensorboard" if name is None else os.path.join("tensorboard", name))
            writers.append(TensorBoardWriter(logdir))
        if self.wandb:
            folder = ctx.out_dir if name is None else ctx.path(f"wandb_{name}")
            writers.append(WandbWriter(f"deqjax-{ctx.experiment}", folder, ctx.config))
        return writers

    def actions(
        self, *extra: Action, log_every: int, max_nonfinite_steps: int | None = 10
    ) -> list[Action]:
        """A training's periodic actions (:func:`~deqjax.training.default_actions`): the train
        record and the non-finite guard every ``log_every`` steps, then ``extra`` (e.g. an
        :class:`~deqjax.training.Evaluate`) and the profiler window of ``--profile_steps``
        (:class:`~deqjax.training.ProfileSteps`), the stop at a SIGTERM, and the progress bar
        unless ``--no_progress``.

        Args:
          *extra: the experiment's own actions, run after the logging ones, in this order.
          log_every: steps between train records (and metric fetches).
          max_nonfinite_steps: the streak of non-finite steps that stops the run.
        """
        window = step_window(self.profile_steps)
        profile = [] if window is None else [ProfileSteps(*window)]
        return default_actions(
            *extra,
            *profile,
            log_every=log_every,
            max_nonfinite_steps=max_nonfinite_steps,
            progress=self.progress,
        )
