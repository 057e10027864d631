"""dq.nn.WeightNorm and get_weight (a cell's plain or weight-normalised weight)."""

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from deqjax import initializers, nn
from deqjax._src.nn.weight_norm import get_weight


def weight_norm_transform(shape, axes=None):
    return hk.without_apply_rng(
        hk.transform(lambda: nn.WeightNorm(shape, axes=axes, name="wn")(jnp.float64))
    )


@pytest.mark.parametrize("shape", [(5, 3), (3, 3, 4, 2)])
def test_weight_norm_init_equals_v_and_is_invariant_to_rescaling_v(shape):
    t = weight_norm_transform(shape)
    params = t.init(jax.random.PRNGKey(0))
    v, g = params["wn"]["v"], params["wn"]["g"]
    assert v.shape == shape and g.shape == (1,) * (len(shape) - 1) + (shape[-1],)
    w = t.apply(params)
    np.testing.assert_allclose(w, v, rtol=1e-12)  # g is initialised to ||v||
    scaled = {"wn": {"v": 3.7 * v, "g": g}}
    np.testing.assert_allclose(t.apply(scaled), w, rtol=1e-12)  # w(c v) = w(v)
    flipped = {"wn": {"v": v, "g": 2.0 * g}}
    np.testing.assert_allclose(t.apply(flipped), 2.0 * w, rtol=1e-12)
    # every output unit's weight has norm |g|
    norms = jnp.sqrt(jnp.sum(w**2, axis=tuple(range(len(shape) - 1))))
    np.testing.assert_allclose(norms, jnp.abs(g).reshape(-1), rtol=1e-12)


def test_weight_norm_custom_axes_and_w_init():
    t = weight_norm_transform((4, 6), axes=(1,))
    params = t.init(jax.random.PRNGKey(0))
    assert params["wn"]["g"].shape == (4, 1)
    w = t.apply(params)
    np.testing.assert_allclose(jnp.sqrt(jnp.sum(w**2, axis=1)), jnp.abs(params["wn"]["g"][:, 0]))
    ortho = hk.without_apply_rng(
        hk.transform(
            lambda: nn.WeightNorm([8, 8], w_init=initializers.HaarOrthogonal(0.5))(jnp.float64)
        )
    )
    p = ortho.init(jax.random.PRNGKey(1))
    v = p["weight_norm"]["v"]
    np.testing.assert_allclose(v.T @ v, 0.25 * jnp.eye(8), atol=1e-12)


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(shape=()), "shape"),
        (dict(shape=(3, 0)), "shape"),
        (dict(shape=(3, 3), axes=()), "axes"),
        (dict(shape=(3, 3), axes="a"), "axes"),
        (dict(shape=(3, 3), w_init=0.1), "w_init"),
    ],
)
def test_weight_norm_bad_arguments(kw, match):
    with pytest.raises(ValueError, match=match):
        hk.transform(lambda: nn.WeightNorm(**kw)()).init(None)


def test_get_weight_plain_or_normalised_names():
    def f(wn):
        return get_weight("W", [3, 2], jnp.float64, w_init=None, weight_norm=wn)

    plain = hk.transform(lambda: f(False)).init(jax.random.PRNGKey(0))
    normed = hk.transform(lambda: f(True)).init(jax.random.PRNGKey(0))
    assert jax.tree_util.tree_map(jnp.shape, plain) == {"~": {"W": (3, 2)}}
    assert jax.tree_util.tree_map(jnp.shape, normed) == {"W": {"g": (1, 2), "v": (3, 2)}}
