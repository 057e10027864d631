"""Turns a training run's metrics JSONL (``deqjax.training.fit``) into PNG curves.

One panel per metric against the step; training records as lines, evaluation records as markers,
diagnostics records as dashed lines.

    python experiments/plot_metrics.py runs/fashion_mnist/metrics.jsonl
    python experiments/plot_metrics.py runs/x/metrics.jsonl --metrics loss accuracy --out curves.png
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Sequence

from deqjax.training import read_jsonl

_SKIP = {"step", "epoch", "split", "time", "count"}
_STYLE = {"train": {"lw": 1.2}, "eval": {"marker": "o", "ls": "none"}, "diagnostics": {"ls": "--"}}


def collect(records: Sequence[dict]) -> dict[str, dict[str, tuple[list, list]]]:
    """``{metric: {split: (steps, values)}}`` for every numeric metric in the records."""
    series: dict[str, dict[str, tuple[list, list]]] = {}
    for r in records:
        split = r.get("split", "train")
        for name, value in r.items():
            if name in _SKIP or isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            steps, values = series.setdefault(name, {}).setdefault(split, ([], []))
            steps.append(r["step"])
            values.append(float(value))
    return series


def plot(
    records: Sequence[dict],
    out_path: str,
    *,
    metrics: Sequence[str] | None = None,
    title: str | None = None,
) -> list[str]:
    """Writes the figure to ``out_path``; returns the metric names plotted.

    Raises:
      ValueError: if there is nothing to plot (no records, or none of ``metrics``).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = collect(records)
    names = [m for m in (metrics or sorted(series)) if m in series]
    if not names:
        raise ValueError(f"nothing to plot: metrics {list(metrics or [])} not in {sorted(series)}.")
    cols = min(3, len(names))
    rows = math.ceil(len(names) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.0 * rows), squeeze=False)
    for ax, name in zip(axes.flat, names):
        for split, (steps, values) in sorted(series[name].items()):
            ax.plot(steps, values, label=split, **_STYLE.get(split, {}))
        positive = all(v > 0 for _, vals in series[name].values() for v in vals)
        if positive and ("residual" in name or name.startswith("loss")):
            ax.set_yscale("log")
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("step", fontsize=8)
        ax.grid(alpha=0.3)
        if len(series[name]) > 1:
            ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(names) :]:
        ax.axis("off")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
    fig.savefig(out_path, dpi=110)
    plt.close(fig)
    return names


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("metrics_jsonl", help="JSONL written by deqjax.training.fit")
    parser.add_argument("--out", default=None, help="PNG path (default: <jsonl stem>.png)")
    parser.add_argument("--metrics", nargs="*", default=None, help="subset of metric names")
    parser.add_argument("--title", default=None, help="figure title")
    args = parser.parse_args(argv)
    out = args.out or os.path.splitext(args.metrics_jsonl)[0] + ".png"
    names = plot(read_jsonl(args.metrics_jsonl), out, metrics=args.metrics, title=args.title)
    print(f"wrote {out} ({', '.join(names)})")


if __name__ == "__main__":
    main()
