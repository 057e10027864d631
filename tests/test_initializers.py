"""Initializer objects (Haiku's ``(shape, dtype) -> array`` protocol): Haiku modules, keys,
reprs and eager validation. The samplers they call are tested in test_random_matrices.py."""

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from deqjax import initializers as dqi
from tests.helpers.matrices import disk, mean_square


def test_haiku_wrappers_linear_conv_and_attention_shapes():
    inits = {
        "gaussian": dqi.Gaussian(0.8),
        "orthogonal": dqi.HaarOrthogonal(0.8),
        "goe": dqi.GOE(0.8),
        "antisymmetric": dqi.Antisymmetric(0.8),
        "haar_normal": dqi.HaarNormal(disk, 0.8),
    }

    def forward(x):
        out = {}
        for name, init in inits.items():
            out[name] = hk.Linear(128, w_init=init, name=name)(x)
        conv = hk.Conv2D(24, kernel_shape=3, w_init=dqi.HaarOrthogonal(0.8), name="conv")
        out["conv"] = conv(x.reshape(-1, 8, 16, 1))
        mha = hk.MultiHeadAttention(
            num_heads=2, key_size=16, w_init=dqi.Gaussian(0.8), name="attention"
        )
        out["mha"] = mha(x[:, None, :], x[:, None, :], x[:, None, :])
        return out

    with jax.numpy_dtype_promotion("standard"):  # Haiku's own layers under strict promotion
        init = jax.jit(hk.transform(forward).init)
        params = init(jax.random.key(12), jnp.ones((2, 128), jnp.float32))
    for name in inits:
        w = params[name]["w"]
        assert w.shape == (128, 128) and w.dtype == jnp.float32
        assert mean_square(w) == pytest.approx(0.64, rel=0.1)
    goe_w = np.asarray(params["goe"]["w"])
    np.testing.assert_array_equal(goe_w, goe_w.T)
    kernel = np.asarray(params["conv"]["w"], np.float64).reshape(9, 24)  # [3*3*1, 24]
    # fan_in 9 < fan_out 24: orthonormal rows, times scale * sqrt(24 / 9) (the convention).
    np.testing.assert_allclose(kernel @ kernel.T, 0.64 * 24 / 9 * np.eye(9), atol=1e-5)
    assert mean_square(params["attention/query"]["w"]) == pytest.approx(0.64, rel=0.1)


def test_wrappers_are_deterministic_given_the_haiku_key():
    f = hk.transform(lambda: dqi.HaarOrthogonal(0.5)((16, 16), jnp.float32))
    a = f.apply({}, jax.random.key(0))
    b = f.apply({}, jax.random.key(0))
    c = f.apply({}, jax.random.key(1))
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(a, c)


@pytest.mark.parametrize("cls", [dqi.Gaussian, dqi.HaarOrthogonal, dqi.GOE, dqi.Antisymmetric])
@pytest.mark.parametrize("bad", [-0.1, float("nan"), float("inf"), "1.0", True, [1.0]])
def test_invalid_scale_raises_eagerly(cls, bad):
    with pytest.raises(ValueError, match="scale"):
        cls(bad)


def test_invalid_arguments():
    with pytest.raises(ValueError, match="scale"):
        dqi.HaarNormal(disk, -1.0)
    with pytest.raises(ValueError, match="eigenvalue_sampler"):
        dqi.HaarNormal(None, 1.0)
    f = hk.transform(lambda: dqi.GOE(1.0)((4, 5), jnp.float32))
    with pytest.raises(ValueError, match="square"):
        f.apply({}, jax.random.key(0))


SAMPLER_OF = {
    "Gaussian": dqi.gaussian,
    "HaarOrthogonal": dqi.haar_orthogonal,
    "GOE": dqi.goe,
    "Antisymmetric": dqi.antisymmetric,
}


@pytest.mark.parametrize("name", SAMPLER_OF)
def test_objects_draw_the_samplers_array_with_haikus_key(name):
    init, sampler = getattr(dqi, name)(0.8), SAMPLER_OF[name]
    w = hk.transform(lambda: init((6, 6), jnp.float64)).apply({}, jax.random.key(3))

    def draw():
        return sampler(hk.next_rng_key(), (6, 6), scale=0.8, dtype=jnp.float64)

    np.testing.assert_array_equal(w, hk.transform(draw).apply({}, jax.random.key(3)))


def test_reprs_and_plain_objects():
    assert repr(dqi.Gaussian(0.8)) == "Gaussian(scale=0.8)"
    assert repr(dqi.GOE(2)) == "GOE(scale=2.0)"
    assert repr(dqi.HaarNormal(disk, 0.5)) == f"HaarNormal({disk!r}, scale=0.5)"
    # Plain objects (no Haiku base class): only object above the shared constructor.
    assert [c.__name__ for c in type(dqi.HaarOrthogonal(1.0)).__mro__] == [
        "HaarOrthogonal",
        "_EnsembleInitializer",
        "object",
    ]
    assert dqi.HaarNormal(disk, 0.5, normalize=False).normalize is False


@pytest.mark.parametrize("name", SAMPLER_OF)
def test_objects_take_jaxs_protocol_with_the_key_first(name):
    """``init(key, shape, dtype)`` (jax.nn.initializers, flax.nnx.initializers): the sampler's
    array for that key, the dtype positional or keyword or defaulted, no Haiku transform."""
    init, sampler, key = getattr(dqi, name)(0.8), SAMPLER_OF[name], jax.random.key(5)
    want = sampler(key, (6, 6), scale=0.8, dtype=jnp.float64)
    np.testing.assert_array_equal(init(key, (6, 6), jnp.float64), want)
    np.testing.assert_array_equal(init(key, (6, 6), dtype=jnp.float64), want)
    np.testing.assert_array_equal(init(key, (6, 6)), sampler(key, (6, 6), scale=0.8))
    raw = jax.random.PRNGKey(5)  # a raw uint32 key is a key too
    np.testing.assert_array_equal(
        init(raw, [6, 6], jnp.float64), sampler(raw, (6, 6), scale=0.8, dtype=jnp.float64)
    )


def test_haar_normal_takes_jaxs_protocol():
    init, key = dqi.HaarNormal(disk, 0.5), jax.random.key(2)
    want = dqi.haar_normal(key, (4, 4), disk, scale=0.5, dtype=jnp.float64)
    np.testing.assert_array_equal(init(key, (4, 4), jnp.float64), want)
