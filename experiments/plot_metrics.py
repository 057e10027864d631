"""Turns a training run's metrics JSONL (``deqjax.training.fit``) into PNG curves.

One panel per metric against the step, each with a legend: training records as lines, evaluation
records as markers, diagnostics records as dashed lines. Metrics constant over the run are listed
in a note instead of drawn as flat panels. The plotting lives in the library
(``deqjax.harness.plot_metrics``); this is its command line.

    python experiments/plot_metrics.py runs/fashion_mnist/metrics.jsonl
    python experiments/plot_metrics.py runs/x/metrics.jsonl --metrics loss accuracy --out curves.png
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from typing import Annotated

import tyro

from deqjax import harness
from deqjax.training import read_jsonl


@dataclasses.dataclass(frozen=True)
class Config:
    """The metrics file and the figure."""

    metrics_jsonl: Annotated[tyro.conf.Positional[str], tyro.conf.arg(metavar="METRICS_JSONL")]
    """JSONL written by deqjax.training.fit"""
    out: str | None = None  # PNG path (default: <jsonl stem>.png)
    metrics: tuple[str, ...] | None = None  # subset of metric names
    title: str | None = None  # figure title


def main(argv: Sequence[str] | None = None) -> None:
    c = harness.parse_config(Config, argv, description=__doc__)
    out = c.out or os.path.splitext(c.metrics_jsonl)[0] + ".png"
    names = harness.plot_metrics(read_jsonl(c.metrics_jsonl), out, metrics=c.metrics, title=c.title)
    print(f"wrote {out} ({', '.join(names)})")


if __name__ == "__main__":
    main()
