"""PNG figures of the experiments: labelled curves on one axis, stacked panels, a sweep's errors.

:func:`line_plot` draws labelled curves on one axis (sweeps, solver traces), :func:`plot_panels`
stacks panels that share the x axis, :func:`plot_sweep` draws a sweep's median and mean error
against the initialisation scale. matplotlib (the ``experiments`` extra) is imported only when a
figure is made (:func:`pyplot`), with the non-interactive Agg backend; :func:`save_figure` writes
and closes it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np


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
    per_step: bool = False,
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
      per_step: the curves are ``{label: ys}``, one value per step (x: 1, 2, ...).
      size: figure size in inches.
    """
    plt = pyplot()
    fig, ax = plt.subplots(figsize=size)
    if per_step:
        curves = {label: (range(1, len(ys) + 1), ys) for label, ys in curves.items()}
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
    ``group`` value, from :func:`~deqjax.harness.summarize_runs` rows (log y; log₂ x when every
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
    moving_average: Mapping[str, int] | None = None,
    size: tuple[float, float] | None = None,
) -> str:
    """Stacked panels sharing the x axis: ``{ylabel: {label: (xs, ys)}}``, one panel each.

    Args:
      path: the PNG to write.
      panels: per panel (its y label), the labelled curves; the first panel has the legend.
      xlabel: label of the shared x axis.
      styles: per-label ``matplotlib`` keyword arguments (the same in every panel).
      hlines: ``{ylabel: (y, label)}``: a dotted horizontal line in that panel.
      moving_average: ``{ylabel: window}``: that panel draws each curve's moving average over
        ``window`` points, at most all of them (at the window's last x), e.g. a noisy signal.
      size: figure size (default 8 wide, 3 per panel).

    Returns:
      ``path``.
    """
    plt = pyplot()
    size = size or (8.0, 3.0 * len(panels))
    fig, axes = plt.subplots(len(panels), 1, figsize=size, sharex=True, squeeze=False)
    for ax, (ylabel, curves) in zip(axes[:, 0], panels.items()):
        window = (moving_average or {}).get(ylabel)
        for label, (xs, ys) in curves.items():
            xs, ys = list(xs), list(ys)
            if window:
                w = min(window, len(ys))  # no more than the points there are
                xs, ys = xs[w - 1 :], np.convolve(ys, np.ones(w) / w, "valid")
            ax.plot(xs, list(ys), label=label, **dict((styles or {}).get(label, {})))
        if hlines and ylabel in hlines:
            y, label = hlines[ylabel]
            ax.axhline(y, color="k", ls=":", lw=1, label=label)
        ax.set_ylabel(ylabel)
    axes[-1, 0].set_xlabel(xlabel)
    axes[0, 0].legend(fontsize=8, ncol=2)
    fig.tight_layout()
    return save_figure(fig, path)
