"""Sweeps: the grid of runs, summaries by group."""

from __future__ import annotations

import pytest

from deqjax import harness


def test_grid_varies_the_last_axis_fastest():
    runs = harness.grid(family=("a", "b"), seed=(0, 1))
    assert runs == [
        {"family": "a", "seed": 0},
        {"family": "a", "seed": 1},
        {"family": "b", "seed": 0},
        {"family": "b", "seed": 1},
    ]


ROWS = [
    {"family": "g", "scale": 1.0, "seed": 0, "test_error": 0.1, "test_nfe": 4.0},
    {"family": "g", "scale": 1.0, "seed": 1, "test_error": 0.3, "test_nfe": 6.0},
    {"family": "o", "scale": 1.0, "seed": 0, "test_error": 0.2, "test_nfe": 5.0},
]


def test_summaries_by_group():
    (g, o) = harness.summarize_runs(ROWS, ("family", "scale"), "test_error")
    assert g == {
        "family": "g",
        "scale": 1.0,
        "n": 2,
        "median_error": pytest.approx(0.2),
        "mean_error": pytest.approx(0.2),
        "min_error": 0.1,
        "max_error": 0.3,
        "mean_test_nfe": 5.0,
    }
    assert o["n"] == 1
