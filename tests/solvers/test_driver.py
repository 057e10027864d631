"""The driver: every fixed-point solver on known answers, pytrees and dtypes, under jit, vmap and
every loop kind, differentiated through the scan loop, and with has_aux."""

from __future__ import annotations

import functools

import hypothesis
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.optimize

from deqjax import solvers
from tests.helpers.lanes import default_first
from tests.helpers.solver_problems import (
    COS_FIXED_POINT,
    SOLVERS,
    assert_solutions_equal,
    contractive_matrix,
    jitted_tanh_solve,
    noncontractive_problem,
    residuals,
    scipy_root,
    tanh_map,
)

# --- known answers -----------------------------------------------------------------------------


@pytest.mark.parametrize("name", SOLVERS)
def test_cos_fixed_point(name):
    sol = SOLVERS[name](jnp.cos, jnp.array(1.0), tol=1e-12, stop_mode="abs", max_steps=200)
    assert sol.status == solvers.CONVERGED
    assert abs(float(sol.value) - COS_FIXED_POINT) < 1e-11
    assert sol.abs_residual <= 1e-12
    assert sol.value.dtype == jnp.float64


@pytest.mark.parametrize("name", SOLVERS)
def test_contractive_tanh_matches_scipy(name):
    solve = jitted_tanh_solve(name, 1e-12, 200)
    for seed in range(3):
        rng = np.random.default_rng(seed)
        a, x = contractive_matrix(rng, 8, 0.8), rng.normal(size=8)
        sol = solve(jnp.asarray(a), jnp.asarray(x))
        assert sol.status == solvers.CONVERGED
        np.testing.assert_allclose(sol.value, scipy_root(a, x), atol=1e-10)


# --- pytrees and dtypes ----------------------------------------------------------------------


def mixed_tree_problem():
    """State {"a": f32[3], "b": (f64[2, 4],)} with a coupled contractive map."""
    rng = np.random.default_rng(1)
    wa = jnp.asarray(contractive_matrix(rng, 3, 0.5), jnp.float32)
    wb = jnp.asarray(contractive_matrix(rng, 4, 0.5), jnp.float64)
    ca = jnp.asarray(rng.normal(size=3), jnp.float32)

    def f(z):
        a, (b,) = z["a"], z["b"]
        new_a = jnp.tanh(wa @ a + 0.2 * jnp.mean(b).astype(jnp.float32) + ca)
        new_b = 0.5 * jnp.cos(b @ wb) + 0.1 * jnp.sum(a).astype(jnp.float64)
        return {"a": new_a, "b": (new_b,)}

    z0 = {"a": jnp.zeros(3, jnp.float32), "b": (jnp.zeros((2, 4), jnp.float64),)}
    return f, z0


def flat_reference(f, z0):
    """The same fixed point via scipy in float64 on the flattened state."""
    leaves, treedef = jax.tree_util.tree_flatten(z0)
    shapes = [leaf.shape for leaf in leaves]
    sizes = [int(np.prod(s)) for s in shapes]

    def unflatten(v):
        parts = np.split(v, np.cumsum(sizes)[:-1])
        return treedef.unflatten(
            [jnp.asarray(p.reshape(s), leaf.dtype) for p, s, leaf in zip(parts, shapes, leaves)]
        )

    def g(v):
        out = jax.tree_util.tree_leaves(f(unflatten(v)))
        return np.concatenate([np.asarray(o, np.float64).ravel() for o in out]) - v

    return scipy.optimize.root(g, np.zeros(sum(sizes)), tol=1e-12).x


@pytest.mark.parametrize("name", SOLVERS)
def test_mixed_shape_mixed_dtype_pytree(name):
    f, z0 = mixed_tree_problem()
    sol = SOLVERS[name](f, z0, tol=1e-5, max_steps=100)
    assert sol.status == solvers.CONVERGED
    assert jax.tree_util.tree_structure(sol.value) == jax.tree_util.tree_structure(z0)
    for v, leaf in zip(jax.tree_util.tree_leaves(sol.value), jax.tree_util.tree_leaves(z0)):
        assert v.shape == leaf.shape and v.dtype == leaf.dtype
    # Reductions accumulate in float64 because one leaf is float64.
    assert sol.abs_residual.dtype == jnp.float64 and sol.trace.dtype == jnp.float64
    flat = np.concatenate(
        [np.asarray(v, np.float64).ravel() for v in jax.tree_util.tree_leaves(sol.value)]
    )
    np.testing.assert_allclose(flat, flat_reference(f, z0), atol=1e-4)
    abs_res, rel_res = residuals(f, sol.value)
    np.testing.assert_allclose(abs_res, sol.abs_residual, rtol=1e-4, atol=1e-7)
    assert rel_res <= 1.01e-5


@pytest.mark.parametrize("name", SOLVERS)
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
def test_float32_and_float64(name, dtype):
    rng = np.random.default_rng(3)
    a = jnp.asarray(contractive_matrix(rng, 6, 0.7), dtype)
    x = jnp.asarray(rng.normal(size=6), dtype)
    tol = 1e-5 if dtype == jnp.float32 else 1e-10
    sol = jax.jit(lambda a, x: SOLVERS[name](tanh_map(a, x), jnp.zeros_like(x), tol=tol))(a, x)
    assert sol.status == solvers.CONVERGED
    assert sol.value.dtype == dtype
    for field in (sol.abs_residual, sol.rel_residual, sol.trace):
        assert field.dtype == dtype
    assert sol.num_steps.dtype == jnp.int32 and sol.status.dtype == jnp.int32
    ref = scipy_root(np.asarray(a, np.float64), np.asarray(x, np.float64))
    np.testing.assert_allclose(sol.value, ref, atol=1e-4 if dtype == jnp.float32 else 1e-9)


# --- eager, jit, vmap, loop kinds ------------------------------------------------------------


@pytest.mark.parametrize("name", SOLVERS)
def test_eager_equals_jit(name):
    a, x = noncontractive_problem(d=5, seed=2)
    a, x = 0.6 * jnp.asarray(a), jnp.asarray(x)  # contractive enough for all three
    eager = SOLVERS[name](tanh_map(a, x), jnp.zeros(5), tol=1e-9, max_steps=60)
    jitted = jitted_tanh_solve(name, 1e-9, 60, "rel")(a, x)
    assert eager.status == solvers.CONVERGED
    assert_solutions_equal(eager, jitted, rtol=1e-10)


@pytest.mark.parametrize("name", SOLVERS)
def test_vmap_equals_loop_of_single_solves(name):
    """Per-example convergence: num_steps, status, trace and value match single solves."""
    rng = np.random.default_rng(4)
    d = 6
    a = jnp.asarray(contractive_matrix(rng, d, 1.0))
    # Contraction factors from easy to hard: the examples need different numbers of steps.
    scales = jnp.asarray([0.1, 0.5, 0.9, 0.97])
    xs = jnp.asarray(rng.normal(size=(4, d)))

    def solve(scale, x):
        return SOLVERS[name](
            lambda z: jnp.tanh(scale * (a @ z) + x), jnp.zeros(d), tol=1e-10, max_steps=30
        )

    solve_jit = jax.jit(solve)
    batched = jax.jit(jax.vmap(solve))(scales, xs)
    singles = [solve_jit(s, x) for s, x in zip(scales, xs)]
    stacked = jax.tree_util.tree_map(lambda *leaves: jnp.stack(leaves), *singles)
    assert_solutions_equal(batched, stacked, rtol=1e-10)
    assert len(set(np.asarray(batched.num_steps).tolist())) >= 3, batched.num_steps


@pytest.mark.parametrize("name", default_first(SOLVERS))
def test_loop_kinds_agree(name):
    f = lambda z: jnp.cos(z) * jnp.asarray([0.5, 0.3])  # noqa: E731
    sols = {
        loop: SOLVERS[name](f, jnp.zeros(2), tol=1e-8, max_steps=20, loop=loop)
        for loop in ("while", "scan", "python")
    }
    assert sols["while"].status == solvers.CONVERGED
    assert_solutions_equal(sols["while"], sols["scan"])
    assert_solutions_equal(sols["while"], sols["python"], rtol=1e-10)


@pytest.mark.slow
def test_python_loop_counts_evaluations():
    """num_steps is exactly the number of evaluations of f (line-search trials included)."""
    for name, kwargs in [
        ("fixed_point_iteration", {}),
        ("anderson", {}),
        ("broyden", {}),
        ("broyden", {"line_search": True}),
    ]:
        calls = []

        def f(z, calls=calls):
            if not isinstance(z, jax.core.Tracer):
                calls.append(1)
            return z - jnp.arctan(z)

        sol = SOLVERS[name](
            f,
            jnp.asarray([5.0, -2.5]),
            tol=1e-10,
            stop_mode="abs",
            max_steps=60,
            loop="python",
            **kwargs,
        )
        assert sol.status == solvers.CONVERGED, name
        assert int(sol.num_steps) == len(calls), (name, kwargs)


# --- differentiation ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", default_first(SOLVERS))
def test_reverse_mode_through_scan_loop(name):
    rng = np.random.default_rng(5)
    a = jnp.asarray(contractive_matrix(rng, 4, 0.4))
    w = jnp.asarray(rng.normal(size=4))

    @functools.partial(jax.jit, static_argnums=1)
    def loss(x, loop):
        sol = SOLVERS[name](tanh_map(a, x), jnp.zeros(4), tol=1e-12, max_steps=25, loop=loop)
        return jnp.vdot(w, sol.value), sol.value

    x = jnp.asarray(rng.normal(size=4))
    grad, z = jax.grad(loss, has_aux=True)(x, "scan")
    assert np.all(np.isfinite(grad))
    # Implicit-function-theorem gradient at the fixed point: w^T (I - J_z)^{-1} diag(1 - z*^2).
    s = 1 - np.asarray(z) ** 2
    expected = np.linalg.solve((np.eye(4) - s[:, None] * np.asarray(a)).T, np.asarray(w)) * s
    np.testing.assert_allclose(grad, expected, atol=1e-6)
    # Central finite differences (one batched, compiled evaluation).
    eps = 1e-6
    steps = eps * jnp.eye(4)
    values = jax.vmap(lambda dx: loss(x + dx, "while")[0])(jnp.concatenate([steps, -steps]))
    np.testing.assert_allclose(grad, (values[:4] - values[4:]) / (2 * eps), atol=1e-5)


def test_reverse_mode_through_while_loop_is_a_jax_error():
    """Documented limitation: lax.while_loop has no reverse mode; use loop="scan" or an adjoint."""
    with pytest.raises(ValueError, match="Reverse-mode differentiation does not work"):
        jax.grad(lambda x: solvers.anderson(lambda z: jnp.cos(z) + x, jnp.array(0.0)).value)(
            jnp.array(0.5)
        )


# --- property tests ----------------------------------------------------------------------------


PAD = 20


@functools.cache
def jitted_property_solve(name: str, dtype_name: str):
    tol = 1e-4 if dtype_name == "float32" else 1e-9

    def run(a, x):
        return SOLVERS[name](tanh_map(a, x), jnp.zeros_like(x), tol=tol, max_steps=100)

    return jax.jit(run), tol


@hypothesis.settings(max_examples=20, deadline=None, derandomize=True)
@hypothesis.given(
    d=st.integers(1, PAD),
    seed=st.integers(0, 2**31 - 1),
    dtype_name=st.sampled_from(["float32", "float64"]),
    name=st.sampled_from(list(SOLVERS)),
    norm=st.floats(0.1, 0.9),
)
def test_property_random_contractive_maps(d, seed, dtype_name, name, norm):
    """Random contractive tanh maps of size d, embedded in R^PAD with zero padding.

    The padding keeps one compiled solve per (solver, dtype): the extra coordinates have zero
    rows/columns in A and zero input, so they stay exactly 0 in every iterate of every solver and
    the solve is the d-dimensional one.
    """
    rng = np.random.default_rng(seed)
    dtype = jnp.dtype(dtype_name)
    a = np.zeros((PAD, PAD))
    a[:d, :d] = contractive_matrix(rng, d, norm)
    x = np.zeros(PAD)
    x[:d] = rng.normal(size=d)
    a, x = jnp.asarray(a, dtype), jnp.asarray(x, dtype)
    solve, tol = jitted_property_solve(name, dtype_name)
    sol = solve(a, x)
    np.testing.assert_array_equal(sol.value[d:], 0.0)
    # A contraction of modulus <= 0.9 converges well within 100 steps.
    assert sol.status == solvers.CONVERGED
    assert sol.rel_residual <= tol
    assert sol.value.dtype == dtype
    # The reported residual is the residual of the returned value (recomputed outside the solve).
    abs_res, rel_res = residuals(tanh_map(a, x), sol.value)
    eps = float(jnp.finfo(dtype).eps)
    fv_norm = abs_res / max(rel_res, 1e-300) if abs_res > 0 else 1.0
    np.testing.assert_allclose(sol.abs_residual, abs_res, rtol=1e-3, atol=50 * eps * (1 + fv_norm))
    n = int(sol.num_steps)
    assert sol.trace[n - 1] == sol.rel_residual


@pytest.mark.parametrize("name", SOLVERS)
def test_f_value_is_f_at_value(name):
    a, x = noncontractive_problem()
    f = tanh_map(0.5 * jnp.asarray(a), jnp.asarray(x))
    sol = SOLVERS[name](f, jnp.zeros(10), tol=1e-9, max_steps=60)
    np.testing.assert_allclose(sol.f_value, f(sol.value), rtol=1e-12, atol=1e-14)


# --- has_aux: f returns (z, aux); Solution.aux is the aux at the returned value -----------------

DRIVER_SOLVERS = {**SOLVERS, "reversible": solvers.reversible}


def _aux_map(a, x):
    """f(z) = tanh(Az + x) with aux = {"pre": Az + x, "norm": ||tanh(Az + x)||} (per row of z)."""

    def f(z):
        pre = z @ a.T + x
        out = jnp.tanh(pre)
        return out, {"pre": pre, "norm": jnp.linalg.norm(out, axis=-1)}

    return f


@pytest.mark.parametrize("name", default_first(DRIVER_SOLVERS))
def test_has_aux_is_the_aux_at_the_value(name):
    rng = np.random.default_rng(11)
    a = jnp.asarray(contractive_matrix(rng, 5, 0.9))
    xs = jnp.asarray(rng.normal(size=(3, 5)))
    solve = DRIVER_SOLVERS[name]
    kw = dict(tol=1e-9, max_steps=40, has_aux=True)

    def one(x):
        return solve(_aux_map(a, x), jnp.zeros(5), **kw)

    single = one(xs[0])
    want = _aux_map(a, xs[0])(single.value)[1]
    np.testing.assert_allclose(single.aux["pre"], want["pre"], rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(single.aux["norm"], want["norm"], rtol=1e-12)
    np.testing.assert_allclose(single.f_value, jnp.tanh(single.aux["pre"]), rtol=1e-12)
    # The solve itself is that of f without aux.
    plain = solve(lambda z: _aux_map(a, xs[0])(z)[0], jnp.zeros(5), tol=1e-9, max_steps=40)
    assert plain.aux is None
    assert_solutions_equal(single, plain)
    # Under jit and vmap, and batch-native: per problem, the aux of each problem's value.
    vmapped = jax.jit(jax.vmap(one))(xs)
    native = jax.jit(lambda: solve(_aux_map(a, xs), jnp.zeros((3, 5)), batch_ndim=1, **kw))()
    for sol in (vmapped, native):
        want = _aux_map(a, xs)(sol.value)[1]
        np.testing.assert_allclose(sol.aux["pre"], want["pre"], rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(sol.aux["norm"], want["norm"], rtol=1e-12)
    np.testing.assert_allclose(native.aux["pre"], vmapped.aux["pre"], rtol=1e-9, atol=1e-12)


def test_has_aux_of_a_problem_stopped_at_its_first_evaluation():
    """A NaN at the first evaluation: the value is z0 and the aux is f's aux at z0."""

    def f(z):
        return z * jnp.nan, {"z": z + 1.0}

    sol = solvers.anderson(f, jnp.ones(3), has_aux=True)
    assert int(sol.status) == solvers.NONFINITE
    np.testing.assert_array_equal(sol.aux["z"], np.full(3, 2.0))
