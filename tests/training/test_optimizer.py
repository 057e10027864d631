"""Optimizers and learning-rate schedules from a few keyword arguments."""

import jax.numpy as jnp
import numpy as np
import optax
import pytest

from deqjax import training


def test_schedules():
    cosine = training.make_schedule(
        learning_rate=1.0, schedule="cosine", warmup_steps=10, total_steps=110, end_factor=0.1
    )
    np.testing.assert_allclose(
        [cosine(0), cosine(5), cosine(10), cosine(60), cosine(110)],
        [0.0, 0.5, 1.0, 0.55, 0.1],
        rtol=1e-6,
        atol=1e-7,
    )
    linear = training.make_schedule(learning_rate=2.0, schedule="linear", total_steps=100)
    np.testing.assert_allclose([linear(0), linear(50), linear(100)], [2.0, 1.0, 0.0], atol=1e-6)
    constant = training.make_schedule(learning_rate=0.3, warmup_steps=3)
    np.testing.assert_allclose([constant(0), constant(3), constant(1000)], [0.0, 0.3, 0.3])
    for kwargs, name in [
        ({"learning_rate": 0.0}, "learning_rate"),
        ({"learning_rate": 1.0, "schedule": "step"}, "schedule"),
        ({"learning_rate": 1.0, "schedule": "cosine"}, "total_steps"),
        ({"learning_rate": 1.0, "warmup_steps": -1}, "warmup_steps"),
        ({"learning_rate": 1.0, "end_factor": 2.0}, "end_factor"),
    ]:
        with pytest.raises(ValueError, match=name):
            training.make_schedule(**kwargs)


def test_optimizer_clipping_and_errors():
    opt = training.make_optimizer(learning_rate=1.0, optimizer="sgd", momentum=0.0, clip_norm=2.0)
    params = {"a": jnp.zeros(3, jnp.float32), "b": jnp.zeros(4, jnp.float32)}
    grads = {"a": jnp.full(3, 100.0, jnp.float32), "b": jnp.full(4, -50.0, jnp.float32)}
    updates, _ = opt.update(grads, opt.init(params), params)
    np.testing.assert_allclose(optax.tree.norm(updates), 2.0, rtol=1e-6)
    for kwargs, name in [
        ({"optimizer": "lamb"}, "optimizer"),
        ({"clip_norm": 0.0}, "clip_norm"),
        ({"weight_decay": 0.1}, "weight_decay"),
        ({"optimizer": "sgd", "momentum": 1.0}, "momentum"),
    ]:
        with pytest.raises(ValueError, match=name):
            training.make_optimizer(learning_rate=0.1, **kwargs)
