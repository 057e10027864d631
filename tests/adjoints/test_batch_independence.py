"""An example's implicit gradient does not depend on its batch-mates: in a batch-native solve
every Krylov backward (the GMRES fallback; GMRES, BiCGStab and CG on the normal equations as
backward solvers) takes its inner products, step sizes and stopping per problem, so each
example's gradient is the one it gets alone, to rounding."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import deqjax as dq
from tests.helpers.lanes import default_first

D, B = 6, 5


def _problem():
    rng = np.random.default_rng(7)
    w = rng.normal(size=(D, D))
    w *= 0.8 / np.max(np.abs(np.linalg.eigvals(w)))
    x = rng.normal(size=(B, D)) * np.array([0.01, 0.3, 1.0, 3.0, 10.0])[:, None]
    g = rng.normal(size=(B, D))
    return jnp.asarray(w), jnp.asarray(x), jnp.asarray(g)


def cell(w, x, z):
    return jnp.tanh(z @ w.T + x)


ADJOINTS = {
    # A first backward solve of 2 steps fails at this tolerance: the GMRES fallback runs.
    "GMRES fallback": dq.ImplicitAdjoint(
        solver=dq.solvers.FixedPointIteration(max_steps=2, tol=1e-11), fallback_factor=1.0
    ),
    "GMRES": dq.ImplicitAdjoint(solver=dq.solvers.GMRES(tol=1e-11, restart=4), fallback=None),
    "BiCGStab": dq.ImplicitAdjoint(solver=dq.solvers.BiCGStab(tol=1e-11, chunk=3), fallback=None),
    "NormalCG": dq.ImplicitAdjoint(solver=dq.solvers.NormalCG(tol=1e-11, chunk=3), fallback=None),
}


@pytest.mark.parametrize("name", default_first(ADJOINTS))
def test_an_examples_gradient_is_its_gradient_alone(name):
    w, x, g = _problem()
    solver = dq.solvers.Anderson(max_steps=100, tol=1e-13, batch_ndim=1)

    def loss(w, x, g, probe):
        z, _ = dq.fixed_point(
            cell,
            w,
            x,
            jnp.zeros_like(x),
            solver=solver,
            adjoint=ADJOINTS[name],
            backward_stats=probe,
        )
        return jnp.sum(z * g)

    grad = jax.jit(jax.grad(loss, argnums=(0, 1, 3)))
    g_w, g_x, stats = grad(w, x, g, dq.BackwardStats.zeros())
    assert float(stats.count) == B
    if name == "GMRES fallback":
        assert float(stats.fallbacks) == B
    alone = [grad(w, x[i : i + 1], g[i : i + 1], dq.BackwardStats.zeros()) for i in range(B)]
    for i, (_, g_x_i, _) in enumerate(alone):
        np.testing.assert_allclose(g_x[i], g_x_i[0], rtol=1e-9, atol=1e-12, err_msg=f"example {i}")
    # The parameters' gradient is the sum of the examples' (one VJP for the batch).
    np.testing.assert_allclose(g_w, sum(a[0] for a in alone), rtol=1e-9, atol=1e-12)
