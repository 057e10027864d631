"""Metric curves of a training run: one panel per metric of a metrics JSONL, against the step.

:func:`plot_metrics` turns the records :func:`~deqjax.training.fit` logs into one panel per metric:
training records as lines, evaluation records as markers, diagnostics records as dashed lines;
metrics constant over the run are listed in a note instead of drawn as flat panels.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from deqjax._src.harness.figures import pyplot, save_figure

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
    """``(figure, plotted names, {constant name: value})``; see :func:`plot_metrics`."""
    plt = pyplot()
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
    # Fixed margins (in inches, for the fixed panel size above) rather than tight_layout, which
    # draws every panel's ticks and labels once more to measure them: most of the time this figure
    # took for a run's 24 panels (BENCHMARKS.md, "The main job's wall time outside the train
    # steps").
    width, height = fig.get_size_inches()
    top = 0.9 if title else 0.35
    bottom = 0.45 + (0.3 if constant else 0.0)
    fig.subplots_adjust(
        left=0.85 / width,
        right=1 - 0.15 / width,
        top=1 - top / height,
        bottom=bottom / height,
        wspace=0.3,
        hspace=0.55,
    )
    if constant:
        note = "constant over the run (not plotted): " + ", ".join(
            f"{k} = {v:.4g}" for k, v in sorted(constant.items())
        )
        fig.text(0.01, 0.05 / height, note, fontsize=7, ha="left", va="bottom", wrap=True)
    return fig, names, constant


def plot_metrics(
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
    fig, names, _ = make_figure(records, metrics=metrics, title=title)
    save_figure(fig, out_path)
    return names
