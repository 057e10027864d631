"""What a running experiment is handed: where it writes, the devices it trains on, and the files
and resume policy of each of its trainings.

:class:`RunContext` gives the output paths, the :class:`~deqjax.training.DataParallel` the runner
built once from ``--parallel``, and per training (the run's one, or one of several named ones)
its checkpoint folder, metrics file and :class:`~deqjax.training.RunPolicy`; the experiment builds
the rest of :func:`~deqjax.training.fit`'s arguments from its configuration.
:meth:`RunContext.trained` summarises a named training from its metrics file (:class:`Trained`);
:func:`run_until_interrupted` trains several in turn and stops after a SIGTERM.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import jax
import numpy as np

from deqjax._src.harness.metric_curves import plot_metrics
from deqjax._src.harness.run_dir import write_json
from deqjax._src.training.data_parallel import DataParallel
from deqjax._src.training.fit import FitResult
from deqjax._src.training.metrics import read_jsonl
from deqjax._src.training.run_policy import RunPolicy


class Trained(NamedTuple):
    """One training of a run (:meth:`RunContext.trained`) and what its metrics file holds."""

    result: FitResult  # what ``fit`` returned (the parameters: ``result.state.params``)
    history: dict[str, list]  # {metric: [value per train record]}, as one uninterrupted run
    seconds: float  # wall time of the ``fit`` call
    step_seconds: float  # median seconds per step after the first (from examples_per_sec)
    num_params: int  # parameter count

    def tail(self, key: str) -> float:
        """The mean of ``key`` over the last tenth of the records (at least the last one)."""
        values = self.history[key]
        return float(np.mean(values[-max(1, len(values) // 10) :]))


@dataclasses.dataclass
class RunContext:
    """Where a run writes, and what its trainings share.

    Attributes:
      out_dir: the run's output folder.
      config: the flat configuration plus the derived values (what ``config.json`` holds).
      resume: continue the run in ``out_dir`` (``--resume``).
      overwrite: a new run replaces an earlier one (``--overwrite``).
      progress: show progress bars (not ``--no_progress``).
      mode: the mode flag that is set (e.g. ``"sweep"``), or None.
      data_parallel: how each training runs over the devices, built once by the runner from
        ``--parallel`` (``training.data_parallel("sharded")`` or ``"pmap"``); None outside a
        run.
      experiment: the experiment's name (e.g. the W&B project's).
    """

    out_dir: str
    config: dict
    resume: bool
    overwrite: bool
    progress: bool
    mode: str | None = None
    data_parallel: DataParallel | None = None
    experiment: str = "run"

    @property
    def is_main(self) -> bool:
        """Process 0 of a (multi-host) run: the one that writes files and prints."""
        return jax.process_index() == 0

    def path(self, name: str) -> str:
        """``out_dir/name``."""
        return os.path.join(self.out_dir, name)

    def print(self, line: str) -> None:
        """Prints on process 0 without breaking a progress bar."""
        if self.is_main:
            import tqdm

            tqdm.tqdm.write(line)

    def checkpoint_dir(self, name: str | None = None) -> str:
        """The checkpoint folder of the training ``name``: ``ckpt_<name>/`` (None: the run's one
        training, ``ckpt/``), an absolute path."""
        return os.path.abspath(self.path(f"ckpt_{name}" if name is not None else "ckpt"))

    def metrics_path(self, name: str | None = None) -> str:
        """The metrics file of the training ``name``: ``metrics_<name>.jsonl`` (None:
        ``metrics.jsonl``)."""
        return self.path(f"metrics_{name}.jsonl" if name is not None else "metrics.jsonl")

    def policy(self, name: str | None = None, *, checkpoint_dir: str | None = None) -> RunPolicy:
        """The :class:`~deqjax.training.RunPolicy` of the training ``name`` (``--resume``,
        ``--overwrite``).

        One of several named trainings resumes only if its checkpoint folder holds something: a
        run killed before this training started starts it afresh on ``--resume``. The run's one
        training (``name`` None) resumes with ``--resume``.

        Args:
          name: the training (None: the run's one training).
          checkpoint_dir: its checkpoint folder, if not :meth:`checkpoint_dir` ``(name)``.
        """
        resume = self.resume
        if name is not None:
            folder = checkpoint_dir if checkpoint_dir is not None else self.checkpoint_dir(name)
            resume = resume and os.path.isdir(folder) and bool(os.listdir(folder))
        return RunPolicy(resume=resume, overwrite=self.overwrite)

    def trained(
        self,
        name: str,
        result: FitResult,
        *,
        history: Sequence[str],
        batch_size: int,
        seconds: float,
    ) -> Trained:
        """The training ``name`` that ``fit`` returned ``result`` for in ``seconds``, with its
        ``history`` metrics read from its metrics file (one record per step: ``log_every=1``)
        and its step time.

        Args:
          name: the training (its ``metrics_<name>.jsonl``).
          result: what :func:`~deqjax.training.fit` returned.
          history: the metrics to read back from its train records.
          batch_size: the global batch (the step time is ``batch_size / examples_per_sec``).
          seconds: the wall time of the ``fit`` call.
        """
        hist = self.train_history(name, (*history, "examples_per_sec"))
        speeds = hist.pop("examples_per_sec")
        step_s = float(np.median([batch_size / v for v in speeds[1:] or speeds]))
        params = int(sum(x.size for x in jax.tree.leaves(result.state.params)))
        return Trained(result, hist, seconds, step_s, params)

    def train_records(self, name: str | None) -> list[dict]:
        """The train records of the training ``name`` (see :meth:`metrics_path`), read from its
        metrics file as one uninterrupted run."""
        return [r for r in read_jsonl(self.metrics_path(name)) if r.get("split") == "train"]

    def train_history(self, name: str | None, keys: Sequence[str]) -> dict[str, list]:
        """``{key: [value per train record]}`` of the training ``name``."""
        records = self.train_records(name)
        return {k: [r[k] for r in records] for k in keys}

    def plot_metrics(
        self, *, metrics: Sequence[str] | None = None, title: str = "", name: str = "curves.png"
    ) -> str | None:
        """Plots this run's ``metrics.jsonl`` to ``name`` (process 0); returns the path."""
        if not self.is_main:
            return None
        records = read_jsonl(self.path("metrics.jsonl"))
        plot_metrics(records, self.path(name), metrics=metrics, title=title)
        return self.path(name)

    def write_text(self, name: str, text: str) -> str:
        """Writes ``text`` to ``out_dir/name`` (process 0); returns the path."""
        if self.is_main:
            with open(self.path(name), "w") as f:
                f.write(text)
        return self.path(name)

    def write_json(self, name: str, obj: Mapping[str, Any]) -> str:
        """Writes ``obj`` to ``out_dir/name`` atomically (process 0); returns the path."""
        return write_json(self.path(name), obj) if self.is_main else self.path(name)


def run_until_interrupted(items: Sequence[Any], train: Any) -> list[dict]:
    """``[train(item) for item in items]``, stopping after a result whose ``"interrupted"`` is
    True (SIGTERM: the run saved its checkpoint and must stop; ``--resume`` continues it)."""
    results = []
    for item in items:
        results.append(train(item))
        if results[-1].get("interrupted"):
            break
    return results
