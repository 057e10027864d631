"""Smoke runs of ``experiments/copy_memory.py`` (issue 8).

The smoke run is a subprocess (``_run_experiment.run_smoke``); its outputs are checked for the
data-source label and finite metrics. The task generator and its reference loss are checked exactly.
"""

from __future__ import annotations

import math
import pathlib
import sys

import numpy as np
from _run_experiment import run_smoke


def test_copy_memory_smoke(tmp_path):
    summary = run_smoke("copy_memory.py", tmp_path, "--models", "deq:transformer,tied:trellis")
    assert summary["data_source"].startswith("synthetic copy-memory")
    models = [r["model"] for r in summary["results"]]
    assert models == ["deq:transformer", "tied:trellis"]
    for r in summary["results"]:
        assert math.isfinite(r["test_loss"]) and r["test_loss"] > 0
        assert 0.0 <= r["test_copy_accuracy"] <= 1.0
    deq, tied = summary["results"]
    assert 1 <= deq["forward_nfe_eval"] <= 4  # --smoke: Anderson max_steps=4
    assert tied["forward_nfe_eval"] == 2  # --smoke: depth 2
    assert (tmp_path / "loss.png").exists()


def _copy_memory_module():
    path = pathlib.Path(__file__).resolve().parents[1] / "experiments"
    sys.path.insert(0, str(path))
    try:
        import copy_memory
    finally:
        sys.path.remove(str(path))
    return copy_memory


def test_make_batch_layout_and_blank_only_loss():
    cm = _copy_memory_module()
    t = 7
    inputs, targets = cm.make_batch(np.random.default_rng(0), batch_size=64, seq_len=t)
    assert inputs.shape == targets.shape == (64, t + 20)
    digits = inputs[:, :10]
    assert digits.min() >= 1 and digits.max() <= 8 and len(np.unique(digits)) == 8
    assert np.all(inputs[:, 10 + t - 1] == 9)  # the delimiter, then 10 blanks to fill
    mask = np.ones(t + 20, bool)
    mask[:10] = False
    mask[10 + t - 1] = False
    assert np.all(inputs[:, mask] == 0)
    np.testing.assert_array_equal(targets[:, -10:], digits)
    assert np.all(targets[:, :-10] == 0)
    # The reference loss is the exact loss of "blank, then uniform over the 8 digits".
    probs = np.zeros((t + 20, 10))
    probs[:-10, 0] = 1.0
    probs[-10:, 1:9] = 1.0 / 8.0
    nll = -np.log(probs[np.arange(t + 20)[None, :], targets])
    np.testing.assert_allclose(nll.mean(), cm.blank_only_loss(t), rtol=1e-12)


def test_trellis_reach():
    cm = _copy_memory_module()
    assert cm.trellis_reach(20, 2) == 20
    assert cm.trellis_reach(6, 5) == 24


def test_steps_to_learn():
    cm = _copy_memory_module()
    plateau, solved = [0.3] * 50, [0.001] * 50
    # The 20-step mean drops below 0.03 once 19 of its 20 entries are solved (2 plateau entries
    # still give 0.0309): the window 49..68, step 68.
    assert cm.steps_to_learn(plateau + solved, 0.3) == 68
    assert cm.steps_to_learn(plateau, 0.3) is None
    assert cm.steps_to_learn([0.0] * 5, 0.3) is None  # shorter than the window
