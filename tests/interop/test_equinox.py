"""deqjax drives an Equinox module: ``eqx.partition`` the parameters out, ``eqx.combine`` them back
inside ``f``; the implicit gradient equals the dense implicit-function-theorem gradient."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import deqjax as dq
from tests.helpers.dense_ift import dense_implicit_grad

eqx = pytest.importorskip("equinox")

D, B = 5, 3


class Cell(eqx.Module):
    """``f(z; x) = tanh(W z + U x + b)``, a contraction for the small ``W`` drawn here."""

    w: jax.Array
    u: jax.Array
    b: jax.Array
    activation: callable = eqx.field(static=True, default=jnp.tanh)

    def __call__(self, z, x):  # one example: z, x [D] (vmap it for a batch, as Equinox does)
        return self.activation(self.w @ z + self.u @ x + self.b)


def _cell(seed=0):
    kw, ku, kb = jax.random.split(jax.random.PRNGKey(seed), 3)
    return Cell(
        w=0.5 * jax.random.normal(kw, (D, D)) / np.sqrt(D),
        u=jax.random.normal(ku, (D, D)) / np.sqrt(D),
        b=0.1 * jax.random.normal(kb, (D,)),
    )


def f(params, x, z):
    return eqx.combine(params, STATIC)(z, x)


def f_batch(params, xs, zs):  # the whole batch [B, D] in one call: for batch_ndim=1
    return jax.vmap(eqx.combine(params, STATIC))(zs, xs)


PARAMS, STATIC = eqx.partition(_cell(), eqx.is_inexact_array)
X = jnp.linspace(-1.0, 1.0, D)
SOLVER = dq.solvers.Anderson(tol=1e-12, max_steps=100)


def _loss(z):
    return jnp.sum(jnp.sin(z))


def test_fixed_point_gradient_matches_the_dense_implicit_gradient():
    def loss(params):
        z, _ = dq.fixed_point(f, params, X, jnp.zeros(D), solver=SOLVER)
        return _loss(z)

    got = jax.jit(jax.grad(loss))(PARAMS)

    # Dense IFT: dL/dθ = uᵀ ∂f/∂θ with (I - J_z)ᵀ u = ∂L/∂z* at z*.
    z_star = dq.fixed_point(f, PARAMS, X, jnp.zeros(D), solver=SOLVER)[0]
    np.testing.assert_allclose(f(PARAMS, X, z_star), z_star, atol=1e-10)
    want = dense_implicit_grad(f, PARAMS, X, z_star, _loss)
    assert isinstance(got, Cell)
    for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        np.testing.assert_allclose(g, w, rtol=1e-8, atol=1e-10)


@pytest.mark.slow
def test_batch_native_solve_equals_the_vmapped_solve_and_its_gradient():
    xs = jax.random.normal(jax.random.PRNGKey(3), (B, D))

    def loss_native(params):
        z, sol = dq.fixed_point(
            f_batch, params, xs, jnp.zeros((B, D)), solver=SOLVER.replace(batch_ndim=1)
        )
        return _loss(z), (z, sol)

    def loss_vmap(params):
        solve = lambda x: dq.fixed_point(f, params, x, jnp.zeros(D), solver=SOLVER)[0]  # noqa: E731
        return _loss(jax.vmap(solve)(xs))

    (_, (z, sol)), g_native = jax.value_and_grad(loss_native, has_aux=True)(PARAMS)
    assert sol.status.shape == (B,) and np.all(np.asarray(sol.status) == dq.solvers.CONVERGED)
    z_ref = jax.vmap(lambda x: dq.fixed_point(f, PARAMS, x, jnp.zeros(D), solver=SOLVER)[0])(xs)
    np.testing.assert_allclose(z, z_ref, atol=1e-10)
    g_vmap = jax.grad(loss_vmap)(PARAMS)
    for a, b in zip(jax.tree_util.tree_leaves(g_native), jax.tree_util.tree_leaves(g_vmap)):
        np.testing.assert_allclose(a, b, rtol=1e-8, atol=1e-10)
