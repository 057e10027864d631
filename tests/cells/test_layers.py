"""The pure layers of the cells: weight norm, the dropout mask, the default initializer, the
rate and initializer checks."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from deqjax._src.cells import layers


def test_weight_norm_param_equals_v_at_init_and_is_invariant_to_the_scale_of_v():
    key = jax.random.PRNGKey(0)
    p = layers.weight_param(
        key, (5, 3), jnp.float64, layers.lecun_truncated_normal, weight_norm=True
    )
    assert p["g"].shape == (1, 3)
    np.testing.assert_allclose(layers.weight(p), p["v"], atol=1e-15)
    np.testing.assert_allclose(layers.weight_normalised(7.0 * p["v"], p["g"]), p["v"], atol=1e-14)
    plain = layers.weight_param(
        key, (5, 3), jnp.float64, layers.lecun_truncated_normal, weight_norm=False
    )
    np.testing.assert_array_equal(layers.weight(plain), p["v"])


def test_dropout_mask_values_and_rate():
    mask = layers.dropout_mask(jax.random.PRNGKey(1), (200, 50), 0.3, jnp.float64)
    values = set(np.unique(np.asarray(mask)).tolist())
    assert values == {0.0, 1.0 / 0.7}
    assert abs(float(jnp.mean(mask == 0.0)) - 0.3) < 0.02


def test_default_initializer_has_variance_one_over_fan_in():
    w = layers.lecun_truncated_normal(jax.random.PRNGKey(2), (400, 300), jnp.float64)
    assert w.dtype == jnp.float64
    np.testing.assert_allclose(float(jnp.var(w)), 1.0 / 400, rtol=0.03)


def test_checks_name_the_argument():
    with pytest.raises(ValueError, match="dropout"):
        layers.check_rate(1.0, "dropout")
    with pytest.raises(ValueError, match="w_init"):
        layers.check_initializer(3, "w_init")
    assert layers.check_rate(0, "rate") == 0.0
