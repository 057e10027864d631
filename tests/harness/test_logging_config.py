"""The logging section: the evaluation, diagnostics and checkpoints it builds (0 turns a cadence
off)."""

import numpy as np

from deqjax import harness, training
from deqjax._src.harness import logging_config


def _eval_fn(params, batch):
    return {"loss": batch["x"]}


def test_it_builds_the_evaluation_diagnostics_and_checkpoints(tmp_path, monkeypatch):
    c = harness.LoggingConfig(eval_every=0, checkpoint_every=0, diagnostics_every=0)
    data = {"x": np.zeros((4,), np.float32)}
    evaluate = c.evaluate(_eval_fn, data, batch_size=4)
    assert isinstance(evaluate, training.Evaluate) and not evaluate.schedule.periodic  # epochs
    assert evaluate.schedule.at_end
    assert c.diagnostics(lambda *a: {}) == []
    every = harness.LoggingConfig(eval_every=5, diagnostics_every=7)
    assert every.evaluate(_eval_fn, data).schedule == training.Schedule(every_steps=5, at_end=True)
    (diag,) = every.diagnostics(lambda *a: {})
    assert isinstance(diag, training.RunDiagnostics) and diag.schedule.every_steps == 7
    ckpt = c.checkpoints(tmp_path / "ckpt", config={"seed": 0})
    assert isinstance(ckpt, training.Checkpoints)
    assert [ckpt.should_save(s) for s in (1, 500, 1000)] == [False] * 3  # only at the end
    ckpt.close()
    ckpt = harness.LoggingConfig(checkpoint_every=3).checkpoints(tmp_path / "c3")
    assert [ckpt.should_save(s) for s in (1, 3, 6)] == [False, True, True]
    ckpt.close()
    made = []
    monkeypatch.setattr(logging_config, "Checkpoints", lambda *a, **kw: made.append((a, kw)))
    harness.LoggingConfig(keep_checkpoints=5).checkpoints("d", config={"seed": 1})
    c.checkpoints("e")
    harness.LoggingConfig(checkpoint_minutes=30.0).checkpoints("f")
    none = {"every_minutes": None}
    assert made == [
        (("d",), {"every_steps": 500, **none, "keep": 5, "config": {"seed": 1}}),
        (("e",), {"every_steps": None, **none, "keep": 3, "config": None}),
        (("f",), {"every_steps": 500, "every_minutes": 30.0, "keep": 3, "config": None}),
    ]
    assert set(harness.LoggingConfig.SAFE_ON_RESUME) == set(harness.flat_dict(c))
