"""The optimisation section: step count, schedule and clipping, ``fit`` keywords."""

import jax.numpy as jnp
import numpy as np

from deqjax import harness


def test_steps_schedule_and_fit_keywords():
    c = harness.OptimizationConfig(epochs=3, lr=0.1, warmup_steps=10, clip_norm=0.0)
    assert c.num_steps(steps_per_epoch=7) == 21
    assert harness.OptimizationConfig(steps=5).num_steps(steps_per_epoch=7) == 5
    schedule, opt = c.optimizer(num_steps=21)
    np.testing.assert_allclose(float(schedule(10)), 0.1, rtol=1e-6)  # peak after the warmup
    assert float(schedule(0)) == 0.0 and float(schedule(21)) < 1e-3  # cosine to 0
    assert opt.init({"w": jnp.zeros(2)}) is not None
    warm = harness.OptimizationConfig(warmup_steps=100).optimizer(num_steps=5)[0]
    assert float(warm(4)) > 0  # the warmup never outlasts the run
    assert c.fit_kwargs() == {"eval_batch_size": 1000, "max_nonfinite_steps": 10}
    assert "epochs" in harness.OptimizationConfig.SAFE_ON_RESUME
