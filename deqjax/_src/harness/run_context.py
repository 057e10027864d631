"""What a running experiment is handed: where it writes, and what every ``fit`` call shares."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from typing import Any

import jax

from deqjax._src.harness.metric_curves import plot_metrics
from deqjax._src.harness.run_dir import write_json
from deqjax._src.training.metrics import read_jsonl


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
    """

    out_dir: str
    config: dict
    resume: bool
    overwrite: bool
    progress: bool
    mode: str | None = None

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
        ``config`` and ``print_fn`` for :func:`~deqjax.training.fit` (``overrides`` win).

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
            "print_fn": self.print,
        }
        kwargs |= overrides
        if name is not None and "resume" not in overrides:
            folder = kwargs["checkpoint_dir"]
            kwargs["resume"] = self.resume and os.path.isdir(folder) and bool(os.listdir(folder))
        return kwargs

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
