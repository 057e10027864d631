"""The reversible solver (McCallum, Arora, Foster 2025): its iterates, statistics and reversal."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import deqjax as dq
from deqjax._src.solvers import reversible as reversible_lib
from tests.helpers.reversible import D, affine_problem, tanh_cell, tanh_params


@pytest.mark.parametrize(
    "stop_mode, beta", [("abs", 0.8), ("rel", 0.8), ("mixed", 0.8), ("rel", 0.5), ("abs", 1.2)]
)
def test_affine_contraction_converges_to_closed_form(stop_mode, beta):
    a, b = affine_problem()
    sol = dq.solvers.reversible(
        lambda z: a @ z + b, jnp.zeros(D), beta=beta, tol=1e-11, stop_mode=stop_mode, max_steps=400
    )
    exact = jnp.linalg.solve(jnp.eye(D) - a, b)
    assert int(sol.status) == dq.solvers.CONVERGED
    np.testing.assert_allclose(sol.value, exact, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(sol.f_value, a @ sol.value + b, rtol=1e-12, atol=1e-12)
    # The solver and this line each round A z + b: an entry (a dot product of length D, plus b) is
    # off by up to gamma_{D+1} (|A||z| + |b|), gamma_n ~ n eps / 2 (Higham 2002, section 3.1), so
    # the two residuals may differ by (D + 1) eps || |A||z| + |b| || (~9e-15 here, 1e-3 of the
    # ~7e-12 residual). rtol alone held only while both rounded alike (JAX 0.12: 1e-17 apart).
    z = sol.value
    rounding = (D + 1) * np.finfo(np.float64).eps * float(jnp.linalg.norm(abs(a) @ abs(z) + abs(b)))
    np.testing.assert_allclose(
        float(sol.abs_residual), float(jnp.linalg.norm(a @ z + b - z)), rtol=1e-6, atol=rounding
    )
    steps = int(sol.num_steps)
    assert np.all(np.isfinite(sol.trace[:steps])) and np.all(np.isinf(sol.trace[steps:]))


def test_cos_fixed_point_and_jit():
    sol = jax.jit(lambda z0: dq.solvers.reversible(jnp.cos, z0, tol=1e-10, max_steps=200))(
        jnp.array(1.0)
    )
    assert int(sol.status) == dq.solvers.CONVERGED
    np.testing.assert_allclose(float(sol.value), 0.7390851332151607, rtol=1e-9)


def test_iterates_are_the_papers_coupled_sequences():
    """trace[2n] is the residual of z_n and trace[2n-1] that of y_n for the paper's scheme
    y_{n+1} = (1-β) y_n + β f(z_n), z_{n+1} = (1-β) z_n + β f(y_{n+1}), y_0 = z_0."""
    a, b = affine_problem(scale=0.9)
    f = lambda z: jnp.tanh(a @ z + b)  # noqa: E731
    beta, n = 0.7, 6
    sol = dq.solvers.reversible(
        f, jnp.zeros(D), beta=beta, tol=0.0, stop_mode="abs", max_steps=2 * n + 1
    )
    y = z = jnp.zeros(D)
    expected = [jnp.linalg.norm(f(z) - z)]
    for _ in range(n):
        y = (1 - beta) * y + beta * f(z)
        expected.append(jnp.linalg.norm(f(y) - y))
        z = (1 - beta) * z + beta * f(y)
        expected.append(jnp.linalg.norm(f(z) - z))
    np.testing.assert_allclose(sol.trace, jnp.stack(expected), rtol=1e-12)


def test_value_is_lowest_residual_and_state_pair():
    a, b = affine_problem(scale=0.9)
    f = lambda z: jnp.tanh(a @ z + b)  # noqa: E731
    sol = dq.solvers.reversible(
        f, jnp.zeros(D), tol=0.0, stop_mode="abs", max_steps=15, return_state=True
    )
    state = sol.reversible_state
    k = int(jnp.argmin(sol.trace))
    assert int(state.steps) == k and state.beta == 0.8
    np.testing.assert_allclose(float(sol.abs_residual), float(sol.trace[k]))
    np.testing.assert_array_equal(state.value, sol.value)
    # The pair steps forward to the next iterate: w_{k+1} = (1-β) w_{k-1} + β f(w_k).
    assert float(jnp.linalg.norm(f(sol.value) - sol.value)) == pytest.approx(float(sol.trace[k]))


def test_diverged_and_nonfinite_status():
    sol = dq.solvers.reversible(
        lambda z: 3.0 * z + 1.0, jnp.zeros(2), stop_mode="abs", max_steps=200
    )
    assert int(sol.status) == dq.solvers.DIVERGED
    assert float(sol.abs_residual) <= 2.0  # the best iterate is not a blown-up one
    sol = dq.solvers.reversible(lambda z: jnp.log(z - 1.0), jnp.zeros(2), max_steps=5)
    assert int(sol.status) == dq.solvers.NONFINITE
    assert np.all(np.isfinite(sol.value))


def test_batch_native_equals_vmap_with_per_problem_stopping():
    p = tanh_params(scale=0.9)
    x = jnp.asarray(np.random.default_rng(1).normal(size=(5, D))) * jnp.array(
        [[0.01], [0.1], [1.0], [3.0], [0.5]]
    )
    kw = dict(tol=1e-8, max_steps=80)
    native = dq.solvers.reversible(
        lambda z: tanh_cell(p, x, z), jnp.zeros((5, D)), batch_ndim=1, **kw
    )
    vmapped = jax.vmap(
        lambda xi: dq.solvers.reversible(lambda z: tanh_cell(p, xi, z), jnp.zeros(D), **kw)
    )(x)
    assert len(set(np.asarray(native.num_steps).tolist())) > 1  # problems stop at different steps
    np.testing.assert_array_equal(native.num_steps, vmapped.num_steps)
    np.testing.assert_array_equal(native.status, vmapped.status)
    np.testing.assert_allclose(native.value, vmapped.value, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(native.trace, vmapped.trace, rtol=1e-10)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"beta": 1.0}, "beta"),
        ({"beta": 0.0}, "beta"),
        ({"beta": 2.0}, "beta"),
        ({"beta": -0.3}, "beta"),
        ({"beta": "0.5"}, "beta"),
        ({"beta": True}, "beta"),
        ({"max_steps": 0}, "max_steps"),
        ({"tol": -1.0}, "tol"),
        ({"stop_mode": "max"}, "stop_mode"),
        ({"divergence_factor": 1.0}, "divergence_factor"),
        ({"return_state": 1}, "return_state"),
        ({"batch_ndim": 2}, "batch_ndim"),
    ],
)
def test_bad_arguments_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        dq.solvers.reversible(jnp.cos, jnp.zeros(3), **kwargs)


def test_reversal_error_float32_small_and_float64_tiny():
    p64 = tanh_params(d=64, scale=0.6, seed=3)
    x64 = jnp.asarray(np.random.default_rng(6).normal(size=64))
    kw = dict(tol=1e-2, max_steps=50)
    with jax.enable_x64(False):
        p32 = jax.tree_util.tree_map(lambda a: jnp.asarray(a, jnp.float32), p64)
        x32 = jnp.asarray(x64, jnp.float32)
        err32 = float(
            dq.solvers.reversal_error(
                lambda z: tanh_cell(p32, x32, z), jnp.zeros(64, jnp.float32), **kw
            )
        )
    err64 = float(dq.solvers.reversal_error(lambda z: tanh_cell(p64, x64, z), jnp.zeros(64), **kw))
    assert err32 < 1e-4 and err64 < 1e-12, (err32, err64)


def test_reconstruct_batched_per_problem():
    p = tanh_params()
    x = jnp.asarray(np.random.default_rng(8).normal(size=(3, D))) * jnp.array(
        [[0.01], [1.0], [3.0]]
    )
    z0 = jnp.asarray(np.random.default_rng(9).normal(size=(3, D)))
    f = lambda z: tanh_cell(p, x, z)  # noqa: E731
    state = dq.solvers.reversible(f, z0, tol=1e-3, batch_ndim=1, return_state=True).reversible_state
    assert len(set(np.asarray(state.steps).tolist())) > 1
    y0, z0_hat = reversible_lib.reconstruct(f, state, batch_ndim=1)
    np.testing.assert_allclose(y0, z0, atol=1e-10)
    np.testing.assert_allclose(z0_hat, z0, atol=1e-10)
    err = dq.solvers.reversal_error(f, z0, tol=1e-3, batch_ndim=1)
    assert err.shape == (3,) and float(jnp.max(err)) < 1e-9
    # Rounding grows like (forward contraction)^-k: a tighter tolerance rebuilds z0 less well.
    tight = dq.solvers.reversal_error(f, z0, tol=1e-8, batch_ndim=1)
    assert float(jnp.min(tight)) > float(jnp.max(err))


def test_sample_steps_record_the_iterates():
    a, b = affine_problem(scale=0.8)
    f = lambda z: jnp.tanh(z @ a.T + jnp.broadcast_to(b, z.shape))  # noqa: E731
    z0 = jnp.zeros((2, D))
    sol = dq.solvers.reversible(
        f, z0, batch_ndim=1, tol=1e-6, sample_steps=(0, 3, 200), max_steps=200
    )
    prev = cur = z0
    for _ in range(3):
        prev, cur = cur, 0.2 * prev + 0.8 * f(cur)
    np.testing.assert_allclose(sol.samples[:, 1], cur, rtol=1e-12)
    np.testing.assert_array_equal(sol.samples[:, 0], z0)
    np.testing.assert_array_equal(sol.samples[:, 2], sol.value)  # never reached: the value
    assert dq.solvers.reversible(f, z0[0]).samples is None
    with pytest.raises(ValueError, match="sample_steps"):
        dq.solvers.reversible(f, z0[0], sample_steps=(51,))
