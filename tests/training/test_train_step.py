"""The optax-style train step: the pair under jit, under pmap, and data-parallel over devices."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from deqjax import training
from tests.helpers.train_worker import run_worker


def test_train_step_pair_under_jit_matches_the_pmapped_step():
    def loss_fn(params, batch, key, reg_state, step):
        return jnp.mean((batch["x"] @ params["w"] - 1.0) ** 2), {"w_max": jnp.max(params["w"])}

    opt = optax.sgd(0.1, momentum=0.9)
    pair = training.train_step(loss_fn, opt, axis_name=None)
    state = pair.init({"w": jnp.ones((3,), jnp.float32)}, jax.random.PRNGKey(1))
    batch = {"x": np.arange(12, dtype=np.float32).reshape(4, 3)}
    new, metrics = jax.jit(pair.update)(state, batch)
    step = jax.pmap(training.train_step(loss_fn, opt).update, axis_name="batch")
    state_r = training.replicate(state)
    new_r, metrics_r = step(state_r, training.shard(batch))
    np.testing.assert_allclose(new.params["w"], training.unreplicate(new_r).params["w"], rtol=1e-6)
    assert int(new.step) == 1 and set(metrics) == {"loss", "w_max", "grad_norm"}
    assert float(metrics["loss"]) == pytest.approx(float(training.unreplicate(metrics_r)["loss"]))


def test_four_devices_match_one_device(tmp_path):
    out = tmp_path / "dp.json"
    run_worker(["dp", out, "--num_steps", 8, "--batch_size", 64], num_devices=4)
    res = json.loads(out.read_text())
    one, four = res["one"], res["all"]
    assert one["num_devices"] == 1 and four["num_devices"] == 4
    np.testing.assert_allclose(four["losses"], one["losses"], rtol=1e-5)
    # loss_max is reduced with pmax: the max over the global batch, whatever the sharding.
    np.testing.assert_allclose(four["loss_max"], one["loss_max"], rtol=1e-5)
    np.testing.assert_allclose(four["params"], one["params"], rtol=1e-4, atol=1e-5)
    assert one["losses"][-1] < one["losses"][0]
    assert four["reg_state"]["count"] == 8
    np.testing.assert_allclose(four["reg_state"]["loss_sum"], sum(one["losses"]), rtol=1e-5)


def test_a_loss_scale_scales_the_gradient_it_takes_and_nothing_it_reports():
    """float16 models train on a scaled loss (``loss_scale``, jmp): the gradient is unscaled
    before it is averaged, logged or applied; a gradient that overflows is skipped."""
    import jmp

    def loss_fn(params, batch, key, reg_state, step):
        return jnp.mean((batch["x"] @ params["w"] - 1.0) ** 2), {}

    batch = {"x": np.arange(12, dtype=np.float32).reshape(4, 3)}
    params = {"w": jnp.full((3,), 0.1, jnp.float32)}
    opt = optax.sgd(0.01)
    runs = {}
    for name, scale in {"none": None, "scaled": jmp.StaticLossScale(jnp.float32(2.0**10))}.items():
        pair = training.train_step(loss_fn, opt, axis_name=None, loss_scale=scale)
        runs[name] = jax.jit(pair.update)(pair.init(params, jax.random.PRNGKey(0)), batch)
    (plain, m_plain), (scaled, m_scaled) = runs["none"], runs["scaled"]
    np.testing.assert_allclose(scaled.params["w"], plain.params["w"], rtol=1e-6)
    assert float(m_scaled["loss"]) == pytest.approx(float(m_plain["loss"]))
    assert float(m_scaled["grad_norm"]) == pytest.approx(float(m_plain["grad_norm"]), rel=1e-6)
    # A scale that overflows float16's range makes the gradient non-finite: the step is skipped.
    huge = jmp.StaticLossScale(jnp.float32(3.0e38))
    pair = training.train_step(
        loss_fn, training.skip_nonfinite(opt), axis_name=None, loss_scale=huge
    )
    new, metrics = jax.jit(pair.update)(pair.init(params, jax.random.PRNGKey(0)), batch)
    np.testing.assert_array_equal(new.params["w"], params["w"])
    assert float(metrics["skipped_updates"]) == 1.0
