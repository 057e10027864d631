"""dq.nn.VariationalDropout: one mask per forward pass, inverted scaling, broadcast axes."""

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from deqjax import nn


def dropout_transform(rate, broadcast_axes=(), is_training=True):
    return hk.transform(
        lambda x: nn.VariationalDropout(rate, broadcast_axes=broadcast_axes)(
            x, is_training=is_training
        )
    )


def test_dropout_values_scale_and_fresh_masks():
    x = jnp.ones((64, 50), jnp.float64)
    t = dropout_transform(0.25)
    y1 = t.apply({}, jax.random.PRNGKey(1), x)
    y2 = t.apply({}, jax.random.PRNGKey(2), x)
    assert set(np.unique(np.asarray(y1)).tolist()) == {0.0, 1.0 / 0.75}
    assert abs(float(jnp.mean(y1)) - 1.0) < 0.05  # inverted dropout keeps the mean
    assert abs(float(jnp.mean(y1 == 0)) - 0.25) < 0.03
    assert not np.array_equal(y1, y2)
    np.testing.assert_array_equal(t.apply({}, jax.random.PRNGKey(1), x), y1)  # pure


def test_dropout_broadcast_axes_share_the_mask():
    x = jnp.ones((4, 7, 6, 5), jnp.float64)  # [B, H, W, C]
    y = dropout_transform(0.5, broadcast_axes=(1, 2)).apply({}, jax.random.PRNGKey(0), x)
    np.testing.assert_array_equal(y, jnp.broadcast_to(y[:, :1, :1, :], x.shape))
    assert len(np.unique(np.asarray(y[:, 0, 0, :]))) == 2


def test_dropout_is_identity_in_eval_and_at_rate_zero():
    x = jax.random.normal(jax.random.PRNGKey(0), (3, 4), jnp.float64)
    np.testing.assert_array_equal(dropout_transform(0.5, is_training=False).apply({}, None, x), x)
    np.testing.assert_array_equal(dropout_transform(0.0).apply({}, None, x), x)


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(rate=1.0), "rate"),
        (dict(rate=-0.1), "rate"),
        (dict(rate="0.1"), "rate"),
        (dict(rate=0.1, broadcast_axes=("a",)), "broadcast_axes"),
        (dict(rate=0.1, broadcast_axes=(5,)), "broadcast_axes"),
    ],
)
def test_dropout_bad_arguments(kw, match):
    def f(x):
        return nn.VariationalDropout(**kw)(x, is_training=True)

    with pytest.raises(ValueError, match=match):
        hk.transform(f).init(jax.random.PRNGKey(0), jnp.ones((2, 3)))
