"""``experiments/plot_metrics.py``: a metrics JSONL to a PNG from the command line."""

import json

import pytest

from experiments import plot_metrics


def test_plot_metrics_command(tmp_path, capsys):
    records = [{"split": "train", "step": s, "loss": 1.0 / s, "accuracy": s / 4} for s in (1, 2, 3)]
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    plot_metrics.main([str(path), "--metrics", "loss", "--title", "t"])
    assert (tmp_path / "metrics.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "wrote" in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:
        plot_metrics.main([])
    assert e.value.code == 2  # the JSONL is required
