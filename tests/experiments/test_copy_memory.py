"""The copy-memory task (``dq.data.copy_memory_*``, ``CopyMemoryBatches``) and a smoke run of
``experiments/copy_memory.py`` (a subprocess, ``tests.helpers.run_experiment.run_smoke``).

The task generator and its reference loss are checked exactly.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import deqjax as dq
from tests.helpers.run_experiment import run_smoke


@pytest.mark.slow  # five fits with checkpoints: minutes on a loaded 2-core machine
def test_copy_memory_smoke(tmp_path):
    summary = run_smoke(
        "copy_memory", tmp_path, "--models", "deq:transformer,tied:trellis", timeout=900
    )
    assert summary["data_source"].startswith("synthetic copy-memory")
    models = [r["model"] for r in summary["results"]]
    assert models == ["deq:transformer", "tied:trellis"]
    for r in summary["results"]:
        assert math.isfinite(r["test_loss"]) and r["test_loss"] > 0
        assert 0.0 <= r["test_copy_accuracy"] <= 1.0
        assert len(r["history"]["loss"]) == 3  # --smoke: 3 steps, each logged
    deq, tied = summary["results"]
    assert 1 <= deq["forward_nfe_eval"] <= 4  # --smoke: Anderson max_steps=4
    assert tied["forward_nfe_eval"] == 2  # --smoke: depth 2
    assert (tmp_path / "loss.png").exists() and (tmp_path / "residual.png").exists()


def test_make_batch_layout_and_blank_only_loss():
    t = 7
    inputs, targets = dq.data.copy_memory_batch(np.random.default_rng(0), batch_size=64, seq_len=t)
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
    np.testing.assert_allclose(nll.mean(), dq.data.copy_memory_blank_loss(t), rtol=1e-12)


def test_batches_follow_one_generator_and_restore_by_replay():
    it = dq.data.CopyMemoryBatches(seed=3, batch_size=4, seq_len=5)
    assert isinstance(it, dq.data.Batches)
    rng = np.random.default_rng(3)  # the experiment's stream: one generator, batch after batch
    for _ in range(3):
        inputs, targets = dq.data.copy_memory_batch(rng, batch_size=4, seq_len=5)
        batch = next(it)
        np.testing.assert_array_equal(batch["inputs"], inputs)
        np.testing.assert_array_equal(batch["targets"], targets)
    assert it.state._asdict() == {"drawn": 3}
    resumed = dq.data.CopyMemoryBatches(seed=3, batch_size=4, seq_len=5)
    resumed.restore(it.state._asdict())
    np.testing.assert_array_equal(next(resumed)["inputs"], next(it)["inputs"])
    with pytest.raises(ValueError, match="batch_size"):
        dq.data.CopyMemoryBatches(seed=0, batch_size=0, seq_len=5)


def test_trellis_reach():
    assert dq.models.trellis_reach(20, 2) == 20
    assert dq.models.trellis_reach(6, 5) == 24


def test_steps_to_learn():
    learn = dq.data.copy_memory_steps_to_learn
    plateau, solved = [0.3] * 50, [0.001] * 50
    # The 20-step mean drops below 0.03 once 19 of its 20 entries are solved (2 plateau entries
    # still give 0.0309): the window 49..68, step 68.
    assert learn(plateau + solved, 0.3) == 68
    assert learn(plateau, 0.3) is None
    assert learn([0.0] * 5, 0.3) is None  # shorter than the window
