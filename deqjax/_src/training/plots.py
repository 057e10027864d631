"""PNG plots of training runs: metric curves from a metrics JSONL, and simple line charts.

:func:`plot_metrics` turns the records :func:`~deqjax.training.fit` logs into one panel per metric
against the step: training records as lines, evaluation records as markers, diagnostics records as
dashed lines; metrics constant over the run are listed in a note instead of drawn as flat panels.
:func:`line_plot` draws labelled curves on one axis (sweeps, solver traces). matplotlib (the
``experiments`` extra) is imported only when a plot is made, with the non-interactive Agg backend.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from typing import Any


def pyplot():
    """``matplotlib.pyplot`` on the Agg backend (files only, no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, path: str | os.PathLike, *, dpi: int = 110) -> str:
    """Saves ``fig`` to ``path`` (creating its folder) and closes it; returns the path."""
    path = os.fspath(path)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=dpi)
    pyplot().close(fig)
    return path


def line_plot(
    path: str | os.PathLike,
    curves: Mapping[str, tuple[Sequence[float], Sequence[float]]],
    *,
    xlabel: str = "",
    ylabel: str = "",
    title: str = "",
    logx: float | None = None,
    logy: bool = False,
    styles: Mapping[str, Mapping[str, Any]] | None = None,
    hline: float | None = None,
    size: tuple[float, float] = (5.5, 3.8),
) -> str:
    """One axis of labelled curves ``{label: (x, y)}``; returns ``path``.

    Args:
      path: the PNG to write.
      curves: ``{label: (xs, ys)}`` drawn in order (colours C0, C1, ...).
      xlabel, ylabel, title: axis labels and title.
      logx: log base of the x axis (None: linear).
      logy: log-scale y axis.
      styles: per-label ``matplotlib`` keyword arguments (e.g. ``{"ls": "--", "color": "C0"}``).
      hline: draw a dotted horizontal line at this y (e.g. a tolerance).
      size: figure size in inches.
    """
    plt = pyplot()
    fig, ax = plt.subplots(figsize=size)
    for i, (label, (xs, ys)) in enumerate(curves.items()):
        style = {"color": f"C{i}", **dict((styles or {}).get(label, {}))}
        ax.plot(list(xs), list(ys), label=label, **style)
    if hline is not None:
        ax.axhline(hline, color="k", ls=":", lw=0.8)
    if logx:
        ax.set_xscale("log", base=logx)
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    if title:
        ax.set_title(title, fontsize=8)
    fig.tight_layout()
    return save_figure(fig, path)


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
    height = fig.get_size_inches()[1]
    fig.tight_layout(rect=(0, 0.3 / height if constant else 0, 1, 1))
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


def plot_sweep(
    summary: Sequence[Mapping[str, Any]],
    path: str | os.PathLike,
    *,
    x: str = "scale",
    group: str = "family",
    name: str = "error",
    title: str = "",
) -> str:
    """Median (solid, markers) and mean (dashed) of ``name`` against ``x``, one colour per
    ``group`` value, from :func:`~deqjax.training.summarize_runs` rows (log y; log₂ x when every
    ``x`` is positive). Returns ``path``."""
    curves, styles = {}, {}
    groups = list(dict.fromkeys(r[group] for r in summary))
    for i, g in enumerate(groups):
        rs = sorted((r for r in summary if r[group] == g), key=lambda r: r[x])
        xs = [r[x] for r in rs]
        curves[f"{g} median"] = (xs, [r[f"median_{name}"] for r in rs])
        curves[f"{g} mean"] = (xs, [r[f"mean_{name}"] for r in rs])
        styles[f"{g} median"] = {"color": f"C{i}", "marker": "o"}
        styles[f"{g} mean"] = {"color": f"C{i}", "ls": "--"}
    positive = all(r[x] > 0 for r in summary)
    xlabel = "initialisation scale σ" if x == "scale" else x
    return line_plot(
        path,
        curves,
        xlabel=xlabel,
        ylabel=f"test {name}",
        title=title,
        logx=2 if positive else None,
        logy=True,
        styles=styles,
    )


def plot_panels(
    path: str | os.PathLike,
    panels: Mapping[str, Mapping[str, tuple[Sequence[float], Sequence[float]]]],
    *,
    xlabel: str = "step",
    styles: Mapping[str, Mapping[str, Any]] | None = None,
    hlines: Mapping[str, tuple[float, str]] | None = None,
    size: tuple[float, float] | None = None,
) -> str:
    """Stacked panels sharing the x axis: ``{ylabel: {label: (xs, ys)}}``, one panel each.

    Args:
      path: the PNG to write.
      panels: per panel (its y label), the labelled curves; the first panel has the legend.
      xlabel: label of the shared x axis.
      styles: per-label ``matplotlib`` keyword arguments (the same in every panel).
      hlines: ``{ylabel: (y, label)}``: a dotted horizontal line in that panel.
      size: figure size (default 8 wide, 3 per panel).

    Returns:
      ``path``.
    """
    plt = pyplot()
    size = size or (8.0, 3.0 * len(panels))
    fig, axes = plt.subplots(len(panels), 1, figsize=size, sharex=True, squeeze=False)
    for ax, (ylabel, curves) in zip(axes[:, 0], panels.items()):
        for label, (xs, ys) in curves.items():
            ax.plot(list(xs), list(ys), label=label, **dict((styles or {}).get(label, {})))
        if hlines and ylabel in hlines:
            y, label = hlines[ylabel]
            ax.axhline(y, color="k", ls=":", lw=1, label=label)
        ax.set_ylabel(ylabel)
    axes[-1, 0].set_xlabel(xlabel)
    axes[0, 0].legend(fontsize=8, ncol=2)
    fig.tight_layout()
    return save_figure(fig, path)
