"""Tables of result rows: CSV and Markdown."""

import csv

from deqjax import harness


def test_csv_and_markdown(tmp_path):
    rows = [{"family": "goe", "error": 0.123456, "n": 3}, {"family": "gaussian", "error": 1.0}]
    path = harness.write_csv(tmp_path / "t.csv", rows[:1])
    assert list(csv.DictReader(open(path))) == [{"family": "goe", "error": "0.123456", "n": "3"}]
    assert harness.markdown_table(rows, ["family", "error", "n"]).splitlines() == [
        "| family | error | n |",
        "|---|---|---|",
        "| goe | 0.1235 | 3 |",
        "| gaussian | 1 |  |",
    ]
