"""tests/helpers/lanes.py: the cases it sends to the slow lane, and how it writes them."""

import pytest

from tests.helpers.lanes import default_first


def _marks(param):
    return [m.name for m in getattr(param, "marks", ())]


def test_the_first_cases_stay_and_the_rest_are_slow_with_their_ids_and_marks():
    cases = default_first(
        ["a", ("b", 2), pytest.param("c", id="see", marks=pytest.mark.xfail)], keep=1
    )
    assert cases[0] == "a"
    assert cases[1].values == ("b", 2) and _marks(cases[1]) == ["slow"]  # a tuple is spread
    assert cases[2].id == "see" and _marks(cases[2]) == ["xfail", "slow"]
    assert default_first({"x": 1, "y": 2}, keep=2) == ["x", "y"]  # a dict gives its keys
