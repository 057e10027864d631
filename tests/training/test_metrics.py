"""Metrics on the host: the append-only JSONL file, number formatting, JSON-able configs."""

import dataclasses
import functools
import json

import numpy as np
import pytest

from deqjax import training
from deqjax._src.training.metrics import format_value, to_python


def test_metrics_writer_is_append_only_across_resumes(tmp_path):
    path = tmp_path / "run" / "metrics.jsonl"
    with training.MetricsWriter(path) as w:
        for step in range(1, 6):
            w.write({"step": step, "loss": np.float32(1.0 / step), "bad": float("nan")})
    with open(path, "a") as f:
        f.write('{"step": 6, "lo')  # a line torn by a kill
    records = training.read_jsonl(path)
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5]
    assert np.isnan(records[0]["bad"]) and records[1]["loss"] == pytest.approx(0.5)
    before = path.read_bytes()
    with training.MetricsWriter(path, keep_until_step=3) as w:  # resumed from step 3
        w.write({"step": 4, "loss": 9.0})
    assert path.read_bytes().startswith(before)  # nothing rewritten
    assert [(r["step"], r["loss"]) for r in training.read_jsonl(path)][2:] == [
        (3, float(np.float32(1 / 3))),
        (4, 9.0),
    ]
    assert [r["step"] for r in training.read_jsonl(path, raw=True)] == [1, 2, 3, 4, 5, 3, 4]
    with pytest.raises(FileExistsError, match="earlier run"):
        training.MetricsWriter(path)  # a fresh run never silently deletes another's metrics
    with training.MetricsWriter(path, overwrite=True):
        pass
    assert training.read_jsonl(path) == []


def test_format_value_prints_nonfinite_and_strings():
    fmt = format_value
    assert fmt(float("nan"), ".2e") == "nan" and fmt("nan", ".4f") == "nan"
    assert fmt("inf", ".2e") == "inf" and fmt(np.float32(0.5), ".2f") == "0.50"
    assert fmt(None) == "None" and fmt("n/a") == "n/a"


@dataclasses.dataclass(frozen=True)
class _Solver:
    max_steps: int = 20
    tol: float = 1e-3


def _f(x, *, a):
    return x


def test_to_python_writes_configuration_objects_field_by_field():
    out = to_python(
        {"solver": _Solver(), "partial": functools.partial(_f, a=2), "fn": _f, "arr": np.ones(2)}
    )
    assert out == {
        "solver": {"type": "_Solver", "max_steps": 20, "tol": 1e-3},
        "partial": {"function": "_f", "a": 2},
        "fn": "_f",
        "arr": [1.0, 1.0],
    }
    json.dumps(out)
