"""Turns a training run's metrics JSONL (``deqjax.training.fit``) into PNG curves.

One panel per metric against the step, each with a legend: training records as lines, evaluation
records as markers, diagnostics records as dashed lines. Metrics constant over the run are listed
in a note instead of drawn as flat panels.

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
_STYLE = {
    "train": {"lw": 1.2, "color": "C0"},
    "eval": {"marker": "o", "ls": "none", "color": "C1"},
    "diagnostics": {"ls": "--", "color": "C2"},
}


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


_LABELS = {
    "train": "train (batch)",
    "eval": "eval (test set)",
    "diagnostics": "diagnostics (training batch)",
}


def split_constant(
    series: dict[str, dict[str, tuple[list, list]]], names: Sequence[str]
) -> tuple[list[str], dict[str, float]]:
    """``(varying, constant)``: the names whose values change, and ``{name: value}`` of the others.

    A metric that never changes (e.g. ``jr/gamma`` without adaptive γ, ``skipped_updates`` of a
    healthy run) would be a flat panel: it is reported as a note instead. A metric with a single
    point counts as varying (it is the only evidence there is).
    """
    varying, constant = [], {}
    for name in names:
        values = [v for _, vals in series[name].values() for v in vals]
        finite = [v for v in values if math.isfinite(v)]
        if len(values) > 1 and len(finite) == len(values) and max(finite) == min(finite):
            constant[name] = finite[0]
        else:
            varying.append(name)
    return varying, constant


def make_figure(
    records: Sequence[dict],
    *,
    metrics: Sequence[str] | None = None,
    title: str | None = None,
):
    """``(figure, plotted names, {constant name: value})``; see :func:`plot`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = collect(records)
    names = [m for m in (metrics or sorted(series)) if m in series]
    if not names:
        raise ValueError(f"nothing to plot: metrics {list(metrics or [])} not in {sorted(series)}.")
    names, constant = split_constant(series, names)
    if not names:  # everything constant: still show them, flat, rather than an empty figure
        names, constant = list(constant), {}
    cols = min(3, len(names))
    rows = math.ceil(len(names) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.0 * rows + 0.4), squeeze=False)
    for ax, name in zip(axes.flat, names):
        for split, (steps, values) in sorted(series[name].items()):
            label = _LABELS.get(split, split)
            ax.plot(steps, values, label=label, **_STYLE.get(split, {}))
        positive = all(v > 0 for _, vals in series[name].values() for v in vals)
        if positive and ("residual" in name or name.startswith("loss")):
            ax.set_yscale("log")
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("step", fontsize=8)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)  # always: which split a line is, even when it is the only one
    for ax in list(axes.flat)[len(names) :]:
        ax.axis("off")
    if title:
        fig.suptitle(title)
    height = fig.get_size_inches()[1]
    fig.tight_layout(rect=(0, 0.3 / height if constant else 0, 1, 1))
    if constant:
        note = "constant over the run (not plotted): " + ", ".join(
            f"{k} = {v:.4g}" for k, v in sorted(constant.items())
        )
        fig.text(0.01, 0.05 / height, note, fontsize=7, ha="left", va="bottom", wrap=True)
    return fig, names, constant


def plot(
    records: Sequence[dict],
    out_path: str,
    *,
    metrics: Sequence[str] | None = None,
    title: str | None = None,
) -> list[str]:
    """Writes the figure to ``out_path``; returns the metric names plotted.

    One panel per metric whose value changes, each with a legend naming its splits; metrics that
    stay constant over the run are listed in a note at the bottom instead of as flat panels.

    Raises:
      ValueError: if there is nothing to plot (no records, or none of ``metrics``).
    """
    import matplotlib.pyplot as plt

    fig, names, _ = make_figure(records, metrics=metrics, title=title)
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
