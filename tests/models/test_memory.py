"""The memory a sequence model carries between segments: zeros, the next segment's memory, and
the reset of a stream whose pass begins."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import deqjax as dq

B, M, D, DEPTH = 2, 3, 8, 3


def _normal(key: int, shape) -> jax.Array:
    return jax.random.normal(jax.random.PRNGKey(key), shape, jnp.float64)


@pytest.mark.parametrize("kind", ["deq", "tied", "untied"])
def test_initial_memory_is_one_state_for_the_deq_and_one_per_layer_otherwise(kind):
    mems = dq.models.initial_memory(kind, batch_size=B, memory_length=M, d_model=D, depth=DEPTH)
    assert mems.shape == ((B, M, D) if kind == "deq" else (DEPTH, B, M, D))
    assert mems.dtype == jnp.float32 and not np.any(np.asarray(mems))
    with pytest.raises(ValueError, match="kind"):
        dq.models.initial_memory("deep", batch_size=B, memory_length=M, d_model=D, depth=1)


def test_next_memory_keeps_the_last_positions():
    new = _normal(0, (DEPTH, B, 5, D))
    np.testing.assert_array_equal(dq.models.next_memory(new, M), new[:, :, -M:])
    np.testing.assert_array_equal(dq.models.next_memory(new[0], M), new[0, :, -M:])


def test_reset_memory_zeroes_only_flagged_streams():
    mems = _normal(0, (DEPTH, B, M, D))
    out = dq.models.reset_memory(mems, jnp.array([True, False]))
    np.testing.assert_array_equal(out[:, 0], 0.0)
    np.testing.assert_array_equal(out[:, 1], mems[:, 1])
    out = dq.models.reset_memory(mems[0], jnp.array([False, True]))
    np.testing.assert_array_equal(out[1], 0.0)
    np.testing.assert_array_equal(out[0], mems[0, 0])
    with pytest.raises(ValueError, match="reset"):
        dq.models.reset_memory(jnp.zeros((B, M, D)), jnp.zeros((B + 1,), bool))
