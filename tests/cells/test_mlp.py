"""The framework-free MLP cell: its parameters per form, the equations of the ``single`` and
``two_layer`` forms written out, the dropout mask of a pass, and its errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from deqjax._src.cells import mlp

B, DX, D, H = 3, 5, 4, 6
X = jax.random.normal(jax.random.PRNGKey(0), (B, DX), jnp.float64)
Z = jax.random.normal(jax.random.PRNGKey(1), (B, D), jnp.float64)


def params(form, **kw):
    hidden = None if form == "single" else H
    return mlp.init(
        jax.random.PRNGKey(2), DX, D, hidden_size=hidden, form=form, dtype=jnp.float64, **kw
    )


def shapes(tree):
    return jax.tree_util.tree_map(jnp.shape, tree)


def test_parameters_of_each_form():
    assert shapes(params("single")) == {"U": (DX, D), "b": (D,), "W": (D, D)}
    assert shapes(params("two_layer", with_bias=False)) == {
        "U": (DX, H),
        "W1": (D, H),
        "W2": (H, D),
    }
    resnet = shapes(params("resnet", weight_norm=True))
    assert resnet["W1"] == {"v": (D, H), "g": (1, H)} and resnet["ln1"]["scale"] == (H,)
    assert set(resnet) == {"U", "b", "W1", "W2", "ln1", "ln2", "ln3"}


@pytest.mark.parametrize("form", ["single", "two_layer"])
def test_equations_written_out(form):
    p = params(form)
    z = mlp.step(p, mlp.prepare(p, X, form=form), Z, form=form, activation=jnp.tanh)
    u = X @ p["U"] + p["b"][None]
    want = jnp.tanh(Z @ p["W"] + u) if form == "single" else jnp.tanh(Z @ p["W1"] + u) @ p["W2"]
    np.testing.assert_allclose(z, want, atol=1e-14)


def test_dropout_mask_drawn_once_per_pass_from_its_key():
    p = params("resnet")
    ctx = mlp.prepare(p, X, form="resnet", dropout_rate=0.5, key=jax.random.PRNGKey(3))
    assert ctx["mask"].shape == (B, H)
    again = mlp.prepare(p, X, form="resnet", dropout_rate=0.5, key=jax.random.PRNGKey(3))
    np.testing.assert_array_equal(ctx["mask"], again["mask"])
    assert mlp.prepare(p, X, form="resnet")["mask"] is None
    with pytest.raises(ValueError, match="needs a key"):
        mlp.prepare(p, X, form="resnet", dropout_rate=0.5)


def test_errors_name_the_mistake():
    with pytest.raises(ValueError, match="form"):
        mlp.check_settings(None, "deep", jnp.tanh, 0.0, {})
    with pytest.raises(ValueError, match="hidden_size"):
        mlp.check_settings(4, "single", jnp.tanh, 0.0, {})
    with pytest.raises(ValueError, match="u_init"):
        mlp.check_settings(None, "resnet", jnp.tanh, 0.0, {"u_init": 3})
    with pytest.raises(ValueError, match="activation"):
        mlp.check_settings(None, "resnet", None, 0.0, {})
    with pytest.raises(ValueError, match=r"x \[B, Dx\]"):
        mlp.prepare(params("single"), X[0], form="single")
    with pytest.raises(ValueError, match=r"z \[B, D\]"):
        p = params("single")
        mlp.step(p, mlp.prepare(p, X, form="single"), Z[0], form="single")
