"""The init paper's Fig. 5 sweep: test error against the recurrent weights' family and scale.

The main job's ``--sweep`` (``experiments/fashion_mnist.py``). Flags ``--sweep --sweep_families
--sweep_scales --sweep_seeds``; :meth:`InitSweepConfig.runs` lists the runs (one per family ×
scale × seed, trained by ``short_runs.short_runs``) and :func:`report_sweep` writes their
rows, their summary and its plot.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from typing import Any

import deqjax as dq
from deqjax import harness
from deqjax.harness import FloatList, IntList, Switch

# The recurrent weights' families (dq.models.recurrent_init), as a comma-separated list.
InitFamilyList = harness.choice_list(sorted(dq.models.INIT_FAMILIES))


@dataclasses.dataclass(frozen=True)
class InitSweepConfig:
    """Init sweep (init paper Fig. 5): test error vs the recurrent weights' family and scale."""

    sweep: Switch = False  # the Fig. 5 sweep instead of one run
    sweep_families: InitFamilyList = ("gaussian", "orthogonal", "goe")  # families swept
    sweep_scales: FloatList = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0)  # initialisation scales swept
    sweep_seeds: IntList = (0, 1, 2)  # seeds per point

    def runs(self) -> list[dict]:
        """One ``{"family", "scale", "seed"}`` per run (:func:`~deqjax.harness.grid`)."""
        return harness.grid(
            family=self.sweep_families, scale=self.sweep_scales, seed=self.sweep_seeds
        )


def report_sweep(
    rows: Sequence[Mapping[str, Any]],
    out_dir: str | os.PathLike,
    *,
    by: Sequence[str] = ("family", "scale"),
    title: str = "",
) -> list[dict]:
    """Writes a sweep's ``sweep.csv`` (``rows``), ``sweep_summary.csv``
    (:func:`~deqjax.harness.summarize_runs` of ``test_error`` by ``by``) and ``sweep.png``
    (:func:`~deqjax.harness.plot_sweep`), prints the summary as a Markdown table; returns the
    summary."""
    summary = harness.summarize_runs(rows, by, "test_error")
    harness.write_csv(os.path.join(out_dir, "sweep.csv"), rows)
    harness.write_csv(os.path.join(out_dir, "sweep_summary.csv"), summary)
    path = os.path.join(out_dir, "sweep.png")
    harness.plot_sweep(summary, path, x=by[-1], group=by[0], title=title)
    print(harness.markdown_table(summary))
    return summary
