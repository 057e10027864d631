"""``benchmarks/checkpoint_save.py`` runs end to end and its table reads what it measured."""

import argparse

import jax
import pytest

from benchmarks import checkpoint_save


def test_the_table_reports_each_save_against_the_steps_alone():
    args = argparse.Namespace(steps_after=2)
    trial = lambda blocked, during, total: {  # noqa: E731
        "blocked": blocked,
        "steps": [0.1, 0.1],
        "during": during,
        "total": total,
    }
    measured = {
        "state_bytes": 2**20,
        "alone": [{"steps": [0.1, 0.1], "total": 0.2}] * 3,
        "results": {
            "sync": [trial(1.0, [], 1.2), trial(2.0, [], 2.2), trial(1.5, [], 1.7)],
            "async": [trial(0.1, [0.3], 0.6), trial(0.2, [0.5, 0.1], 0.8), trial(0.1, [], 0.7)],
        },
    }
    lines = checkpoint_save.table(measured, args)
    assert lines[0].split("|")[1:-1] == [
        " save ",
        " save() blocks (ms) ",
        " step during the write (ms) ",
        " step, all (ms) ",
        " save + 2 steps (s) ",
        " cost of the save (s) ",
    ]
    cells = {line.split("|")[1].strip(): line.split("|")[2:-1] for line in lines[2:]}
    assert [c.strip() for c in cells["none"]] == ["–", "–", "100", "0.20", "+0.00"]
    assert [c.strip() for c in cells["synchronous"]] == ["1500", "–", "100", "1.70", "+1.50"]
    assert [c.strip() for c in cells["asynchronous"]] == ["100", "300", "100", "0.70", "+0.50"]


@pytest.mark.slow  # the benchmark's own run; its table parsing is checked above
def test_the_benchmark_runs_on_a_tiny_model(tmp_path):
    out = tmp_path / "table.md"
    with jax.numpy_dtype_promotion("standard"):  # as a user runs it (optax's Adam promotes)
        checkpoint_save.main(
            ["--d_model", "8", "--num_heads", "2", "--vocab_size", "20", "--depth", "2"]
            + ["--seq_len", "4", "--batch_size", "2", "--steps_after", "1", "--repeats", "1"]
            + ["--out", str(out)]
        )
    text = out.read_text()
    assert "| synchronous |" in text and "| asynchronous |" in text and "| none |" in text
