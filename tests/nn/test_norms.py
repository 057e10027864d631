"""dq.nn.LayerNorm and dq.nn.GroupNorm: the maths of hk.LayerNorm / hk.GroupNorm under the suite's
strict rank promotion."""

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from deqjax import nn


def _apply(make, x):
    t = hk.without_apply_rng(hk.transform(lambda x: make()(x)))
    return t.apply(t.init(None, x), x)


def test_layer_norm_matches_haiku():
    x = jax.random.normal(jax.random.PRNGKey(0), (2, 3, 6), jnp.float64) * 3.0 + 1.0
    with jax.numpy_rank_promotion("allow"):
        want = _apply(lambda: hk.LayerNorm(-1, True, True, eps=1e-5), x)
    np.testing.assert_allclose(_apply(nn.LayerNorm, x), want, rtol=1e-12, atol=1e-12)


def test_group_norm_matches_haiku_and_checks_groups():
    x = jax.random.normal(jax.random.PRNGKey(1), (2, 4, 4, 6), jnp.float64) * 2.0 - 1.0
    with jax.numpy_rank_promotion("allow"):
        want = _apply(lambda: hk.GroupNorm(3, eps=1e-5), x)
    np.testing.assert_allclose(_apply(lambda: nn.GroupNorm(3), x), want, rtol=1e-10, atol=1e-10)
    with pytest.raises(ValueError, match="divide"):
        _apply(lambda: nn.GroupNorm(4), x)
    with pytest.raises(ValueError, match="groups"):
        _apply(lambda: nn.GroupNorm(0), x)
