"""The logging section: its ``fit`` keywords (0 turns a cadence off)."""

from deqjax import harness


def test_fit_keywords():
    c = harness.LoggingConfig(eval_every=0, checkpoint_every=0, diagnostics_every=0)
    assert c.fit_kwargs() == {
        "log_every": 50,
        "eval_every": None,
        "checkpoint_every": None,
        "keep_checkpoints": 3,
        "diagnostics_every": None,
    }
    assert harness.LoggingConfig(eval_every=5).fit_kwargs()["eval_every"] == 5
    assert set(harness.LoggingConfig.SAFE_ON_RESUME) == set(harness.flat_dict(c))
