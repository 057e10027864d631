"""Stacked runs: per-run trees on a leading axis, a summed loss with per-run metrics."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments.parts.stacked_runs import StackedRuns

RUNS = StackedRuns(("a", "b"))


def test_stack_and_unstack():
    stacked = RUNS.stack({"w": jnp.ones(3)})
    assert stacked["w"].shape == (2, 3)
    each = RUNS.stack_each([{"w": jnp.zeros(3)}, {"w": jnp.ones(3)}])
    back = RUNS.unstack(each)
    np.testing.assert_array_equal(back["b"]["w"], jnp.ones(3))
    with pytest.raises(ValueError, match="2 runs"):
        RUNS.stack_each([{"w": jnp.zeros(3)}])


def test_summed_loss_gives_each_run_its_own_gradient():
    def run_loss(params, x, gamma):
        loss = gamma * jnp.sum((params["w"] - x) ** 2)
        return loss, {"loss": loss}

    loss = RUNS.summed_loss(run_loss, (0, None, 0))
    params = RUNS.stack_each([{"w": jnp.zeros(2)}, {"w": jnp.ones(2)}])
    gammas = jnp.asarray([1.0, 3.0])
    (total, metrics), grads = jax.value_and_grad(loss, has_aux=True)(params, jnp.ones(2), gammas)
    assert float(total) == 2.0 and set(metrics) == {"loss/a", "loss/b"}
    np.testing.assert_array_equal(grads["w"], [[-2.0, -2.0], [0.0, 0.0]])
    records = [{"loss/a": 1.0, "loss/b": 2.0}, {"loss/a": 0.5, "loss/b": 1.5}]
    history = RUNS.history(records, "loss")
    np.testing.assert_array_equal(history, [[1.0, 2.0], [0.5, 1.5]])
    curves = RUNS.curves(history)
    np.testing.assert_array_equal(curves["b"][0], [1, 2])
    np.testing.assert_array_equal(curves["b"][1], [2.0, 1.5])
