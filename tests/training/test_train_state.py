"""The training state: created at step 0 with a raw key, placed on devices and fetched back."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from deqjax import training
from deqjax._src.training.train_state import create_train_state, stack


def _params():
    return {"w": jnp.arange(3, dtype=jnp.float32), "b": jnp.zeros((), jnp.float32)}


def test_create_train_state_stores_a_raw_key_at_step_zero():
    opt = optax.adam(1e-3)
    typed = create_train_state(_params(), opt, jax.random.key(3))
    raw = create_train_state(_params(), opt, jax.random.PRNGKey(3))
    assert typed.rng.dtype == jnp.uint32 and typed.rng.shape == (2,)
    np.testing.assert_array_equal(typed.rng, raw.rng)
    assert int(typed.step) == 0 and typed.step.dtype == jnp.int32
    assert typed.reg_state == () and typed.carry == ()
    assert jax.tree_util.tree_structure(typed.opt_state) == jax.tree_util.tree_structure(
        opt.init(_params())
    )
    with pytest.raises(ValueError, match="rng must be a jax.random key"):
        create_train_state(_params(), opt, jnp.zeros((3,), jnp.float32))


def test_replicate_shard_unreplicate_round_trip():
    devices = jax.local_devices()
    n = len(devices)
    tree = {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "s": np.float32(2.5)}
    replicated = training.replicate(tree, devices)
    assert replicated["a"].shape == (n, 2, 3) and replicated["s"].shape == (n,)
    back = training.unreplicate(replicated)
    np.testing.assert_array_equal(back["a"], tree["a"])
    assert float(back["s"]) == 2.5
    batch = {"x": np.arange(4 * n * 2, dtype=np.float32).reshape(4 * n, 2)}
    sharded = training.shard(batch, devices)
    assert sharded["x"].shape == (n, 4, 2)
    np.testing.assert_array_equal(np.asarray(sharded["x"]).reshape(4 * n, 2), batch["x"])
    with pytest.raises(ValueError, match="divisible by the number of local devices"):
        training.shard({"x": np.float32(1.0)}, devices)  # no batch axis to split


@pytest.mark.parametrize("mode", ["sharded", "pmap"])
def test_state_with_a_carry_per_device_goes_to_devices_and_back(mode):
    parallel = training.data_parallel(mode)
    n = len(parallel.local_devices)
    state = create_train_state(_params(), optax.sgd(0.1), jax.random.PRNGKey(0), carry=np.ones(2))
    state = state._replace(carry=stack(state.carry, n))
    assert state.carry.shape == (n, 2)
    placed = parallel.put(state, training.STATE_KINDS)
    want = (n, 3) if mode == "pmap" else (3,)  # pmap: one copy per device; sharded: one array
    assert placed.params["w"].shape == want
    assert placed.carry.shape == (n, 2)  # split: one row per device
    host = parallel.get(placed, training.STATE_KINDS)
    assert isinstance(host, training.TrainState)
    np.testing.assert_array_equal(host.params["w"], np.arange(3, dtype=np.float32))
    np.testing.assert_array_equal(host.carry, np.ones((n, 2)))
    np.testing.assert_array_equal(host.rng, np.asarray(state.rng))
