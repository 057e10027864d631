"""Turns a training run's metrics JSONL (``deqjax.training.fit``) into PNG curves.

One panel per metric against the step, each with a legend: training records as lines, evaluation
records as markers, diagnostics records as dashed lines. Metrics constant over the run are listed
in a note instead of drawn as flat panels. The plotting lives in the library
(``deqjax.training.plot_metrics``); this is its command line.

    python experiments/plot_metrics.py runs/fashion_mnist/metrics.jsonl
    python experiments/plot_metrics.py runs/x/metrics.jsonl --metrics loss accuracy --out curves.png
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence

from deqjax.training import plot_metrics, read_jsonl


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("metrics_jsonl", help="JSONL written by deqjax.training.fit")
    parser.add_argument("--out", default=None, help="PNG path (default: <jsonl stem>.png)")
    parser.add_argument("--metrics", nargs="*", default=None, help="subset of metric names")
    parser.add_argument("--title", default=None, help="figure title")
    args = parser.parse_args(argv)
    out = args.out or os.path.splitext(args.metrics_jsonl)[0] + ".png"
    names = plot_metrics(
        read_jsonl(args.metrics_jsonl), out, metrics=args.metrics, title=args.title
    )
    print(f"wrote {out} ({', '.join(names)})")


if __name__ == "__main__":
    main()
