"""dq.nn.WeightNorm and dq.nn.VariationalDropout (issue 6, part A)."""

import functools
from collections import Counter

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import deqjax as dq
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


def _primitives(jaxpr, inside=False, found=None):
    """Counts of primitive names inside any while-loop body and outside every loop."""
    found = found if found is not None else {"inside": Counter(), "outside": Counter()}
    for eqn in jaxpr.eqns:
        found["inside" if inside else "outside"][eqn.primitive.name] += 1
        for name, param in eqn.params.items():
            for sub in param if isinstance(param, (tuple, list)) else [param]:
                sub = getattr(sub, "jaxpr", sub)
                if isinstance(sub, jax.extend.core.Jaxpr):
                    in_loop = inside or (eqn.primitive.name == "while" and name == "body_jaxpr")
                    _primitives(sub, in_loop, found)
    return found


def _solver_loop_primitives(weight_norm):
    def cell(z, x, *, is_training):
        w = get_weight("W", [4, 4], z.dtype, w_init=None, weight_norm=weight_norm)
        h = jnp.tanh(z @ w * 0.5 + x)
        return nn.VariationalDropout(0.2)(h, is_training=is_training)

    def forward(x):
        solver = functools.partial(dq.solvers.fixed_point_iteration, max_steps=5)
        return nn.DEQ(cell, solver=solver, per_example=False)(x)[0]

    t = hk.transform(forward)
    x = jnp.ones((2, 4), jnp.float64)
    params = t.init(jax.random.PRNGKey(0), x)
    return _primitives(jax.make_jaxpr(t.apply)(params, jax.random.PRNGKey(1), x).jaxpr)


def test_weight_norm_and_mask_are_computed_outside_the_solver_loop():
    """Structural check on the traced program: the solver loop body with a weight-normalised
    weight is exactly the one with a plain weight (the normalisation runs outside the loop), and
    no random bits are drawn inside the loop (the mask is drawn once, outside)."""
    normed, plain = _solver_loop_primitives(True), _solver_loop_primitives(False)
    assert normed["inside"]["tanh"] == 1
    assert normed["inside"] == plain["inside"]
    assert normed["outside"]["sqrt"] > plain["outside"]["sqrt"]  # the norm ‖v‖, outside
    rng = {"random_bits", "threefry2x32", "random_split", "random_wrap"}
    assert any(normed["outside"][p] for p in rng)
    assert not any(normed["inside"][p] for p in rng)


def test_get_weight_plain_or_normalised_names():
    def f(wn):
        return get_weight("W", [3, 2], jnp.float64, w_init=None, weight_norm=wn)

    plain = hk.transform(lambda: f(False)).init(jax.random.PRNGKey(0))
    normed = hk.transform(lambda: f(True)).init(jax.random.PRNGKey(0))
    assert jax.tree_util.tree_map(jnp.shape, plain) == {"~": {"W": (3, 2)}}
    assert jax.tree_util.tree_map(jnp.shape, normed) == {"W": {"g": (1, 2), "v": (3, 2)}}
