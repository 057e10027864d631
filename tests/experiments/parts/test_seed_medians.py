"""The 1D experiment's medians over seeds."""

from __future__ import annotations

import pytest

from experiments.parts.seed_medians import median_rows

ROWS = [
    {"family": "g", "scale": 1.0, "seed": 0, "test_error": 0.1, "test_nfe": 4.0},
    {"family": "g", "scale": 1.0, "seed": 1, "test_error": 0.3, "test_nfe": 6.0},
    {"family": "o", "scale": 1.0, "seed": 0, "test_error": 0.2, "test_nfe": 5.0},
]


def test_median_rows_by_group_in_first_seen_order():
    medians = median_rows(ROWS, by=("family",))
    expected = {"family": "g", "scale": 1.0, "seed": 0.5, "test_error": 0.2, "test_nfe": 5.0}
    assert medians[0] == pytest.approx(expected)
    assert list(medians[0]) == list(expected)
    assert medians[1] == pytest.approx(
        {"family": "o", "scale": 1.0, "seed": 0.0, "test_error": 0.2, "test_nfe": 5.0}
    )
    assert median_rows(ROWS[::-1], by=("family",))[0]["family"] == "o"
