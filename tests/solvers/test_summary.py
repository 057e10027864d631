"""``dq.solvers.summarize``: the metrics dict of a (batched) solve."""

import functools

import jax
import jax.numpy as jnp

import deqjax as dq


def test_summarize_is_jit_safe_and_counts_statuses():
    sol = dq.solvers.Solution(
        value=jnp.zeros((4, 2)),
        num_steps=jnp.array([3, 5, 7, 9], jnp.int32),
        abs_residual=jnp.array([1e-6, 2e-6, 1.0, jnp.inf]),
        rel_residual=jnp.array([1e-7, 1e-7, 0.5, jnp.nan]),
        trace=jnp.zeros((4, 9)),
        status=jnp.array([0, 0, 2, 3], jnp.int32),
    )
    m = jax.jit(functools.partial(dq.solvers.summarize, prefix="fwd/"))(sol)
    assert float(m["fwd/nfe"]) == 6.0 and float(m["fwd/nfe_max"]) == 9.0
    assert float(m["fwd/converged"]) == 0.5 and float(m["fwd/diverged"]) == 0.25
    assert float(m["fwd/nonfinite"]) == 0.25 and float(m["fwd/max_steps"]) == 0.0
    assert all(v.dtype == jnp.float32 and v.shape == () for v in m.values())
    single = dq.solvers.summarize(dq.solvers.anderson(jnp.cos, jnp.array(1.0), tol=1e-8))
    assert float(single["converged"]) == 1.0 and float(single["nfe"]) >= 2
