"""The framework-free DEQ-Transformer cell: its parameters are the Haiku cell's (names and
shapes), its pass's dropout masks, and its shape errors."""

import haiku as hk
import jax
import jax.numpy as jnp
import pytest

import deqjax as dq
from deqjax._src.cells import transformer
from tests.helpers import frontends as ref

B, T, DX, D, M = 2, 3, 5, 4, 2
X = jax.random.normal(jax.random.PRNGKey(0), (B, T, DX), jnp.float64)
MEMS = jax.random.normal(jax.random.PRNGKey(1), (B, M, D), jnp.float64)


def params(**kw):
    return transformer.init(
        jax.random.PRNGKey(2), DX, D, num_heads=2, d_ff=6, dtype=jnp.float64, **kw
    )


def shapes(tree):
    return jax.tree_util.tree_map(jnp.shape, tree)


@pytest.mark.parametrize("weight_norm", [True, False])
def test_parameters_are_the_haiku_cells(weight_norm):
    def forward(z, x):
        cell = dq.nn.TransformerCell(D, num_heads=2, d_ff=6, weight_norm=weight_norm)
        return cell(z, x)

    x = dq.nn.TransformerInput(X, MEMS)
    haiku = hk.transform(forward).init(jax.random.PRNGKey(0), jnp.zeros((B, T, D)), x)
    assert shapes(params(weight_norm=weight_norm)) == shapes(ref.nested(haiku))


def test_dropout_masks_one_per_example_and_feature_shared_over_time():
    ctx = transformer.prepare(params(), X, num_heads=2, dropout=0.3, key=jax.random.PRNGKey(3))
    assert set(ctx["masks"]) == set(transformer.DROPOUTS)
    assert ctx["masks"]["drop_ff1"].shape == (B, 1, 6)
    assert ctx["masks"]["drop_q"].shape == (B, 1, D)
    assert transformer.prepare(params(), X, num_heads=2)["masks"] == {}
    with pytest.raises(ValueError, match="needs a key"):
        transformer.prepare(params(), X, num_heads=2, dropout=0.3)


def test_shape_errors_name_the_array():
    p = params()
    with pytest.raises(ValueError, match="x must be"):
        transformer.prepare(p, X[0], num_heads=2)
    with pytest.raises(ValueError, match="mems must be"):
        transformer.prepare(p, transformer.TransformerInput(X, MEMS[:1]), num_heads=2)
    ctx = transformer.prepare(p, X, num_heads=2)
    with pytest.raises(ValueError, match="z must be"):
        transformer.step(p, ctx, jnp.zeros((B, T + 1, D)), num_heads=2)
