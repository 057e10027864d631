"""Metrics on the host: the append-only JSONL file, number formatting, JSON-able configs."""

import dataclasses
import functools
import json

import numpy as np
import pytest

from deqjax import training
from deqjax._src.training.metrics import format_value, to_python


def _written(path, records, *, restored_step=None, overwrite=False):
    writer = training.JsonlWriter(path)
    writer.open(restored_step, overwrite)
    try:
        for record in records:
            writer.write(record)
    finally:
        writer.close()


def test_jsonl_writer_is_append_only_across_resumes(tmp_path):
    path = tmp_path / "run" / "metrics.jsonl"
    writer = training.JsonlWriter(path)
    assert isinstance(writer, training.MetricWriter)
    steps = range(1, 6)
    _written(path, [{"step": s, "loss": np.float32(1.0 / s), "bad": float("nan")} for s in steps])
    with open(path, "a") as f:
        f.write('{"step": 6, "lo')  # a line torn by a kill
    records = training.read_jsonl(path)
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5]
    assert np.isnan(records[0]["bad"]) and records[1]["loss"] == pytest.approx(0.5)
    before = path.read_bytes()
    _written(path, [{"step": 4, "loss": 9.0}], restored_step=3)  # resumed from step 3
    assert path.read_bytes().startswith(before)  # nothing rewritten
    assert [(r["step"], r["loss"]) for r in training.read_jsonl(path)][2:] == [
        (3, float(np.float32(1 / 3))),
        (4, 9.0),
    ]
    assert [r["step"] for r in training.read_jsonl(path, raw=True)] == [1, 2, 3, 4, 5, 3, 4]
    with pytest.raises(FileExistsError, match="earlier run"):
        _written(path, [])  # a fresh run never silently deletes another's metrics
    _written(path, [], overwrite=True)
    assert training.read_jsonl(path) == []
    off = tmp_path / "off.jsonl"
    disabled = training.JsonlWriter(off, enabled=False)
    disabled.open(None, False)
    disabled.write({"step": 1})
    disabled.close()
    assert not off.exists()  # another process than 0 writes nothing


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
