"""Metric curves of a run: one panel per varying metric, legends, constants in a note."""

from __future__ import annotations

import pytest

from deqjax import harness
from deqjax._src.harness import metric_curves


def test_curves_have_legends_and_no_flat_panels():
    records = []
    for step in (10, 20, 30):
        records.append({"split": "train", "step": step, "loss": 1.0 / step, "jr/gamma": 1.0})
        records.append({"split": "diagnostics", "step": step, "spectral_radius": 0.5 + step})
    records.append({"split": "eval", "step": 30, "loss": 0.05})
    fig, names, constant = metric_curves.make_figure(records)
    assert names == ["loss", "spectral_radius"] and constant == {"jr/gamma": 1.0}
    panels = [ax for ax in fig.axes if ax.get_visible() and ax.axison]
    assert len(panels) == 2
    for ax in panels:  # a diagnostics-only panel too says what its line is
        assert ax.get_legend() is not None, ax.get_title()
    assert any("jr/gamma = 1" in t.get_text() for t in fig.texts)


def test_plot_metrics_writes_the_metrics_asked_for(tmp_path):
    records = [{"split": "train", "step": s, "loss": 1.0 / s, "accuracy": s / 10} for s in (1, 2)]
    names = harness.plot_metrics(records, str(tmp_path / "c.png"), metrics=["loss", "nope"])
    assert names == ["loss"] and (tmp_path / "c.png").stat().st_size > 0
    with pytest.raises(ValueError, match="nothing to plot"):
        harness.plot_metrics(records, str(tmp_path / "d.png"), metrics=["nope"])
