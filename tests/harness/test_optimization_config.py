"""The optimisation section: step count, schedule and clipping, the batches the devices split."""

import jax.numpy as jnp
import numpy as np

from deqjax import harness


def test_steps_schedule_and_the_batches_split_over_devices():
    c = harness.OptimizationConfig(epochs=3, lr=0.1, warmup_steps=10, clip_norm=0.0)
    assert c.num_steps(steps_per_epoch=7) == 21
    assert harness.OptimizationConfig(steps=5).num_steps(steps_per_epoch=7) == 5
    schedule, opt = c.optimizer(num_steps=21)
    np.testing.assert_allclose(float(schedule(10)), 0.1, rtol=1e-6)  # peak after the warmup
    assert float(schedule(0)) == 0.0 and float(schedule(21)) < 1e-3  # cosine to 0
    assert opt.init({"w": jnp.zeros(2)}) is not None
    warm = harness.OptimizationConfig(warmup_steps=100).optimizer(num_steps=5)[0]
    assert float(warm(4)) > 0  # the warmup never outlasts the run
    assert harness.OptimizationConfig.SPLIT_OVER_DEVICES == ("batch_size", "eval_batch_size")
    assert "epochs" in harness.OptimizationConfig.SAFE_ON_RESUME
