"""What a running experiment is handed: where it writes, and what every ``fit`` call shares.

:class:`RunContext` gives the output paths, the ``fit`` keywords of the run's trainings and
:meth:`RunContext.fit`, one named training summarised from its metrics file (:class:`Trained`);
:func:`run_until_interrupted` trains several in turn and stops after a SIGTERM.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import jax
import numpy as np

from deqjax._src.harness.metric_curves import plot_metrics
from deqjax._src.harness.run_dir import write_json
from deqjax._src.training.fit import FitResult, fit
from deqjax._src.training.metrics import read_jsonl


class Trained(NamedTuple):
    """One training of a run (:meth:`RunContext.fit`) and what its metrics file holds."""

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
    """Where a run writes, and the keyword arguments every ``fit`` call of the run shares.

    Attributes:
      out_dir: the run's output folder.
      config: the flat configuration plus the derived values (what ``config.json`` holds).
      resume: continue the run in ``out_dir`` (``--resume``).
      overwrite: a new run replaces an earlier one (``--overwrite``).
      progress: show progress bars (not ``--no_progress``).
      mode: the mode flag that is set (e.g. ``"sweep"``), or None.
      parallel: how each training runs over the devices (``--parallel``: ``"sharded"`` or
        ``"pmap"``).
    """

    out_dir: str
    config: dict
    resume: bool
    overwrite: bool
    progress: bool
    mode: str | None = None
    parallel: str = "sharded"

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

    def fit_kwargs(self, name: str | None = None, **overrides: Any) -> dict:
        """``checkpoint_dir``, ``metrics_path``, ``resume``, ``overwrite``, ``progress``,
        ``config``, ``parallel`` and ``print_fn`` for :func:`~deqjax.training.fit`
        (``overrides`` win).

        Args:
          name: one of several trainings of this run (one per seed, model or γ): it checkpoints
            to ``ckpt_<name>/`` and logs to ``metrics_<name>.jsonl``, and is resumed only if its
            checkpoint folder holds something (a run killed before this training started
            starts it afresh on ``--resume``). None: the run's one training (``ckpt/``,
            ``metrics.jsonl``).
          **overrides: keywords that replace these (e.g. another ``checkpoint_dir``).
        """
        suffix = f"_{name}" if name is not None else ""
        kwargs = {
            "checkpoint_dir": os.path.abspath(self.path(f"ckpt{suffix}")),
            "metrics_path": self.path(f"metrics{suffix}.jsonl"),
            "resume": self.resume,
            "overwrite": self.overwrite,
            "progress": self.progress,
            "config": self.config,
            "parallel": self.parallel,
            "print_fn": self.print,
        }
        kwargs |= overrides
        if name is not None and "resume" not in overrides:
            folder = kwargs["checkpoint_dir"]
            kwargs["resume"] = self.resume and os.path.isdir(folder) and bool(os.listdir(folder))
        return kwargs

    def fit(self, name: str, *, history: Sequence[str], batch_size: int, **kwargs: Any) -> Trained:
        """:func:`~deqjax.training.fit` of the training ``name`` (:meth:`fit_kwargs`), then its
        ``history`` metrics (one record per step: ``log_every=1``) and its step time.

        Args:
          name: the training (its ``ckpt_<name>/``, ``metrics_<name>.jsonl``).
          history: the metrics to read back from its train records.
          batch_size: the global batch (the step time is ``batch_size / examples_per_sec``).
          **kwargs: ``fit``'s other arguments (``params``, ``loss_fn``, ...).
        """
        t0 = time.perf_counter()
        result = fit(**kwargs, **self.fit_kwargs(name))
        seconds = time.perf_counter() - t0
        hist = self.train_history(name, (*history, "examples_per_sec"))
        speeds = hist.pop("examples_per_sec")
        step_s = float(np.median([batch_size / v for v in speeds[1:] or speeds]))
        params = int(sum(x.size for x in jax.tree.leaves(result.state.params)))
        return Trained(result, hist, seconds, step_s, params)

    def train_records(self, name: str | None) -> list[dict]:
        """The train records of the training ``name`` (see :meth:`fit_kwargs`), read from its
        metrics file as one uninterrupted run."""
        path = self.path(f"metrics_{name}.jsonl" if name is not None else "metrics.jsonl")
        return [r for r in read_jsonl(path) if r.get("split") == "train"]

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
