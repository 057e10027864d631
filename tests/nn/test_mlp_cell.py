"""dq.nn.MLPCell.

Compiling Haiku random initialisers is slow on CPU (about a second per draw), so most tests use a
numpy-seeded initializer; the w_init tests exercise the real families.
"""

import functools

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import deqjax as dq
from deqjax import initializers, nn
from tests.helpers.deq_cells import np_init, rel_err

B, D, DX = 2, 6, 5


def test_mlp_forms_shapes_and_jr_tiny_layer_has_200_parameters():
    x = jax.random.normal(jax.random.PRNGKey(0), (B, DX), jnp.float64)
    z = jnp.zeros((B, D), jnp.float64)

    def f(z, x):
        kw = dict(w_init=np_init(0.5), u_init=np_init(1.0, 1))
        return {
            "resnet": nn.MLPCell(10, **kw, name="resnet")(z, x),
            "single": nn.MLPCell(form="single", **kw, name="single")(z, x),
            "two_layer": nn.MLPCell(7, form="two_layer", **kw, name="two_layer")(z, x),
        }

    t = hk.transform(f)
    params = t.init(None, z, x)
    out = t.apply(params, None, z, x)
    assert all(v.shape == (B, D) and v.dtype == jnp.float64 for v in out.values())
    assert params["resnet"]["U"].shape == (DX, D) and params["resnet"]["W1"].shape == (D, 10)
    assert params["two_layer"]["U"].shape == (DX, 7)
    # "resnet" output is layer-normalised: zero mean, unit variance per example
    np.testing.assert_allclose(jnp.mean(out["resnet"], -1), 0.0, atol=1e-12)
    # JR paper §5.1: f(z; x) = W2ᵀ ReLU(W1 z + U x + b), W1, W2, U ∈ R^{50×1}: 200 parameters
    tiny = hk.transform(lambda z, x: nn.MLPCell(50, form="two_layer", w_init=np_init(1.0))(z, x))
    p = tiny.init(jax.random.PRNGKey(0), jnp.zeros((B, 1)), jnp.zeros((B, 1)))
    assert sum(a.size for a in jax.tree_util.tree_leaves(p)) == 200


@pytest.mark.parametrize(
    "w_init",
    [
        initializers.Gaussian(0.8),
        initializers.HaarOrthogonal(0.8),
        initializers.GOE(0.4),
        hk.initializers.TruncatedNormal(0.3),
    ],
    ids=["gaussian", "haar_orthogonal", "goe", "haiku_truncated_normal"],
)
def test_mlp_accepts_every_w_init_family(w_init):
    z, x = jnp.zeros((B, D), jnp.float64), jnp.ones((B, DX), jnp.float64)
    t = hk.transform(
        lambda z, x: nn.MLPCell(form="single", w_init=w_init, u_init=np_init(1.0))(z, x)
    )
    w = t.init(jax.random.PRNGKey(0), z, x)["mlp_cell"]["W"]
    assert w.shape == (D, D) and bool(jnp.all(jnp.isfinite(w)))
    if isinstance(w_init, initializers.GOE):
        np.testing.assert_array_equal(w, w.T)
    if isinstance(w_init, initializers.HaarOrthogonal):
        np.testing.assert_allclose(w.T @ w, 0.64 * jnp.eye(D), atol=1e-12)


def test_mlp_deq_gradients_match_unrolled_with_weight_norm_and_dropout():
    x = jax.random.normal(jax.random.PRNGKey(1), (B, DX), jnp.float64)
    solver = functools.partial(dq.solvers.fixed_point_iteration, tol=1e-12, max_steps=80)

    def make_cell():
        return nn.MLPCell(
            8,
            form="two_layer",
            activation=jnp.tanh,
            w_init=np_init(0.5),
            u_init=np_init(1.0, 1),
            weight_norm=True,
            dropout_rate=0.2,
        )

    def run(adjoint):
        # z0 = zeros [B, D]: the two-layer cell maps D -> D; give the state width via init_state.
        def forward(x):
            deq = nn.DEQ(
                make_cell(),
                solver=solver,
                adjoint=adjoint,
                init_state=lambda x: jnp.zeros((x.shape[0], D), x.dtype),
            )
            return deq(x)

        t = hk.transform(forward)
        params = jax.jit(t.init)(jax.random.PRNGKey(0), x)

        def loss(p, x):
            z, sol = t.apply(p, jax.random.PRNGKey(7), x)
            return jnp.sum(jnp.sin(z)) + 0.5 * jnp.sum(z**2), sol

        return jax.jit(jax.grad(loss, argnums=(0, 1), has_aux=True))(params, x)

    (g_imp, sol), (g_unr, _) = run(dq.ImplicitAdjoint()), run(dq.UnrolledAdjoint())
    assert np.all(np.asarray(sol.status) == dq.solvers.CONVERGED)
    assert rel_err(g_imp, g_unr) < 1e-8
    assert set(g_imp[0]["deq/lifted/mlp_cell/W1"]) == {"g", "v"}


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(form="conv"), "form"),
        (dict(form="single", hidden_size=4), "hidden_size"),
        (dict(hidden_size=0), "hidden_size"),
        (dict(hidden_size=2.5), "hidden_size"),
        (dict(activation=None), "activation"),
        (dict(w_init="orthogonal"), "w_init"),
        (dict(u_init=3), "u_init"),
        (dict(dropout_rate=1.5), "rate"),
    ],
)
def test_mlp_bad_configuration_raises(kw, match):
    with pytest.raises(ValueError, match=match):
        hk.transform(lambda: nn.MLPCell(**kw)).init(None)
