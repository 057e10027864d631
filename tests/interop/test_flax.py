"""deqjax drives a Flax NNX module: ``nnx.split`` it into a graph definition and a state pytree,
``nnx.merge`` them inside ``f``; the implicit gradient equals the dense implicit-function-theorem
gradient and finite differences."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import deqjax as dq
from tests.helpers.dense_ift import dense_implicit_grad

nnx = pytest.importorskip("flax.nnx")

D, B = 5, 3


class Cell(nnx.Module):
    """``f(z; x) = tanh(W z + U x + b)`` from two ``nnx.Linear`` layers."""

    def __init__(self, d: int, rngs: nnx.Rngs):
        init = nnx.initializers.normal(0.5 / np.sqrt(d))
        kw = dict(dtype=jnp.float64, param_dtype=jnp.float64, rngs=rngs)
        self.w = nnx.Linear(d, d, use_bias=False, kernel_init=init, **kw)
        self.u = nnx.Linear(d, d, **kw)

    def __call__(self, z, x):  # z, x: [..., D]
        return jnp.tanh(self.w(z) + self.u(x))


GRAPHDEF, STATE = nnx.split(Cell(D, nnx.Rngs(0)))
X = jnp.linspace(-1.0, 1.0, D)
SOLVER = dq.solvers.Anderson(tol=1e-12, max_steps=100)


def f(state, x, z):
    return nnx.merge(GRAPHDEF, state)(z, x)


def _loss(z):
    return jnp.sum(jnp.sin(z))


def loss(state):
    z, _ = dq.fixed_point(f, state, X, jnp.zeros(D), solver=SOLVER)
    return _loss(z)


def test_fixed_point_gradient_matches_the_dense_implicit_gradient():
    got = jax.jit(jax.grad(loss))(STATE)

    z_star = dq.fixed_point(f, STATE, X, jnp.zeros(D), solver=SOLVER)[0]
    np.testing.assert_allclose(f(STATE, X, z_star), z_star, atol=1e-10)
    want = dense_implicit_grad(f, STATE, X, z_star, _loss)
    assert isinstance(got, nnx.State)
    for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        np.testing.assert_allclose(g, w, rtol=1e-8, atol=1e-10)


def test_gradient_matches_finite_differences_along_a_direction():
    leaves, treedef = jax.tree_util.tree_flatten(STATE)
    keys = jax.random.split(jax.random.PRNGKey(7), len(leaves))
    direction = treedef.unflatten([jax.random.normal(k, a.shape) for k, a in zip(keys, leaves)])
    eps = 1e-5
    shift = lambda s: jax.tree_util.tree_map(lambda a, d: a + s * d, STATE, direction)  # noqa: E731
    fd = (loss(shift(eps)) - loss(shift(-eps))) / (2 * eps)
    g = jax.grad(loss)(STATE)
    ad = sum(
        jnp.vdot(a, b)
        for a, b in zip(jax.tree_util.tree_leaves(g), jax.tree_util.tree_leaves(direction))
    )
    np.testing.assert_allclose(ad, fd, rtol=1e-6)


@pytest.mark.slow  # ~10 s; the Flax gradient checks above run in the default lane
def test_batch_native_solve_of_the_module():
    xs = jax.random.normal(jax.random.PRNGKey(3), (B, D))

    def batch_loss(state):
        z, sol = dq.fixed_point(
            f, state, xs, jnp.zeros((B, D)), solver=SOLVER.replace(batch_ndim=1)
        )
        return _loss(z), (z, sol)

    (_, (z, sol)), g = jax.value_and_grad(batch_loss, has_aux=True)(STATE)
    assert sol.status.shape == (B,) and np.all(np.asarray(sol.status) == dq.solvers.CONVERGED)
    z_ref = jax.vmap(lambda x: dq.fixed_point(f, STATE, x, jnp.zeros(D), solver=SOLVER)[0])(xs)
    np.testing.assert_allclose(z, z_ref, atol=1e-10)
    g_ref = jax.grad(
        lambda s: _loss(
            jax.vmap(lambda x: dq.fixed_point(f, s, x, jnp.zeros(D), solver=SOLVER)[0])(xs)
        )
    )(STATE)
    for a, b in zip(jax.tree_util.tree_leaves(g), jax.tree_util.tree_leaves(g_ref)):
        np.testing.assert_allclose(a, b, rtol=1e-8, atol=1e-10)
