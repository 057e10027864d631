"""Evaluation over a whole data set (masked means, ``_max`` maxima) and the diagnostics step."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from deqjax import training
from deqjax._src.data.batching import eval_batches
from deqjax._src.training.evaluation import evaluate, make_diagnostics_step, make_eval_step
from deqjax._src.training.train_state import create_train_state


def _eval_fn(params, batch):
    err = (batch["x"] * params["w"] - batch["y"]) ** 2
    return {"err": err, "err_max": err, "hit": batch["y"] > 0}


def test_evaluate_gives_means_over_real_examples_only():
    rng = np.random.default_rng(0)
    arrays = {"x": rng.normal(size=23).astype(np.float32), "y": rng.normal(size=23)}
    arrays["y"] = arrays["y"].astype(np.float32)
    params = {"w": np.float32(0.5)}
    step = make_eval_step(_eval_fn)
    batches = eval_batches(arrays, batch_size=8, process_index=0, process_count=1)
    means = evaluate(step, training.replicate(params), batches)
    err = (arrays["x"] * 0.5 - arrays["y"]) ** 2
    assert means["count"] == 23.0  # the 1 padded example of the last batch is masked out
    assert means["err"] == pytest.approx(float(np.mean(err)), rel=1e-6)
    assert means["err_max"] == pytest.approx(float(np.max(err)), rel=1e-6)
    assert means["hit"] == pytest.approx(float(np.mean(arrays["y"] > 0)), rel=1e-6)
    with pytest.raises(ValueError, match="empty"):
        evaluate(step, training.replicate(params), [])
    with pytest.raises(ValueError, match="callable"):
        make_eval_step("not a function")


def test_eval_fn_must_return_per_example_values():
    step = make_eval_step(lambda params, batch: {"mean": jnp.mean(batch["x"])})
    batches = eval_batches({"x": np.zeros(4, np.float32)}, batch_size=4)
    with pytest.raises(ValueError, match="per-example values"):
        evaluate(step, training.replicate({}), batches)


def test_diagnostics_step_reads_the_key_without_advancing_it():
    state = create_train_state({"w": jnp.ones(3)}, optax.sgd(0.1), jax.random.PRNGKey(4))

    def diagnostics(params, batch, key, reg_state):
        return {"noise": jax.random.normal(key, ()), "w_max": jnp.max(params["w"])}

    step = make_diagnostics_step(diagnostics)
    state_r = training.replicate(state)
    batch = training.shard({"x": np.zeros((len(jax.local_devices()), 2))})
    first = training.unreplicate(step(state_r, batch))
    second = training.unreplicate(step(state_r, batch))
    assert float(first["noise"]) == float(second["noise"])  # a function of the state's key
    assert float(first["w_max"]) == 1.0
    np.testing.assert_array_equal(training.unreplicate(state_r.rng), state.rng)
    with pytest.raises(ValueError, match="callable"):
        make_diagnostics_step(None)
