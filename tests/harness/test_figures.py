"""PNG figures: labelled curves, per-step histories, stacked panels with moving averages."""

from __future__ import annotations

import numpy as np

from deqjax import harness

PNG = b"\x89PNG\r\n\x1a\n"


def test_line_plot_and_per_step_curves(tmp_path, monkeypatch):
    drawn, plot = [], harness.pyplot().Axes.plot

    def record(self, xs, ys, **kw):
        drawn.append((list(xs), ys))
        return plot(self, xs, ys, **kw)

    monkeypatch.setattr(harness.pyplot().Axes, "plot", record)
    path = harness.line_plot(
        tmp_path / "a.png", {"a": [3.0, 2.0, 1.0]}, per_step=True, logy=True, hline=1.5
    )
    assert drawn == [([1, 2, 3], [3.0, 2.0, 1.0])]
    assert open(path, "rb").read()[:8] == PNG


def test_panels_draw_moving_averages(tmp_path, monkeypatch):
    drawn, plot = [], harness.pyplot().Axes.plot

    def record(self, xs, ys, **kw):
        drawn.append((xs, list(ys)))
        return plot(self, xs, ys, **kw)

    monkeypatch.setattr(harness.pyplot().Axes, "plot", record)
    values = np.arange(1.0, 6.0)
    panels = {"smooth": {"r": (np.arange(1, 6), values)}, "raw": {"r": (np.arange(1, 6), values)}}
    harness.plot_panels(tmp_path / "p.png", panels, moving_average={"smooth": 2})
    (xs, ys), (raw_xs, raw_ys) = drawn
    assert list(xs) == [2, 3, 4, 5] and ys == [1.5, 2.5, 3.5, 4.5]  # at the window's last x
    assert list(raw_xs) == [1, 2, 3, 4, 5] and raw_ys == list(values)
    harness.plot_panels(tmp_path / "q.png", panels, moving_average={"smooth": 64})  # clipped
    assert drawn[-2][1] == [3.0]


def test_plot_sweep(tmp_path):
    rows = [{"family": "g", "scale": s, "median_error": 0.1 * s, "mean_error": 0.2} for s in (1, 2)]
    path = harness.plot_sweep(rows, tmp_path / "s.png", title="sweep")
    assert open(path, "rb").read()[:8] == PNG
