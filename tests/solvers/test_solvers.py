"""Forward solvers: known answers, scipy agreement, Solution semantics, status codes, batching."""

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

SOLVERS = {
    "fixed_point_iteration": solvers.fixed_point_iteration,
    "anderson": solvers.anderson,
    "broyden": solvers.broyden,
}
ACCELERATED = ["anderson", "broyden"]
COS_FIXED_POINT = 0.7390851332151607


def tanh_map(a, x):
    return lambda z: jnp.tanh(a @ z + x)


def contractive_matrix(rng: np.random.Generator, d: int, norm: float) -> np.ndarray:
    """A Gaussian matrix rescaled to spectral norm ``norm`` (so tanh(Az + x) is a contraction)."""
    a = rng.normal(size=(d, d))
    return a * (norm / np.linalg.norm(a, 2))


def noncontractive_problem(d: int = 10, seed: int = 0):
    """Symmetric A with eigenvalues evenly in [-1.5, 0.5]; x small, so tanh is nearly linear."""
    rng = np.random.default_rng(seed)
    q, _ = np.linalg.qr(rng.normal(size=(d, d)))
    a = q @ np.diag(np.linspace(-1.5, 0.5, d)) @ q.T
    x = 0.5 * rng.normal(size=d)
    return a, x


def scipy_root(a: np.ndarray, x: np.ndarray) -> np.ndarray:
    g = lambda z: np.tanh(a @ z + x) - z  # noqa: E731
    sol = scipy.optimize.root(g, np.zeros_like(x), tol=1e-14)
    # (hybr may report "xtol too small" at this tolerance; what matters is the residual.)
    assert np.linalg.norm(g(sol.x)) < 1e-12, sol.message
    return sol.x


def residuals(f, value):
    """(abs, rel) residual of ``value`` recomputed in float64 numpy."""
    fv = jax.tree_util.tree_leaves(f(value))
    v = jax.tree_util.tree_leaves(value)
    g2 = sum(
        np.sum((np.asarray(a, np.float64) - np.asarray(b, np.float64)) ** 2) for a, b in zip(fv, v)
    )
    f2 = sum(np.sum(np.asarray(a, np.float64) ** 2) for a in fv)
    return np.sqrt(g2), np.sqrt(g2) / (np.sqrt(f2) + 1e-30)


def assert_solutions_equal(a: solvers.Solution, b: solvers.Solution, rtol: float = 1e-12):
    np.testing.assert_array_equal(a.num_steps, b.num_steps)
    np.testing.assert_array_equal(a.status, b.status)
    for u, v in zip(jax.tree_util.tree_leaves(a.value), jax.tree_util.tree_leaves(b.value)):
        np.testing.assert_allclose(u, v, rtol=rtol, atol=rtol)
    np.testing.assert_allclose(a.abs_residual, b.abs_residual, rtol=1e-8, atol=1e-14)
    np.testing.assert_allclose(a.rel_residual, b.rel_residual, rtol=1e-8, atol=1e-14)
    # Equal +inf positions; finite entries close.
    np.testing.assert_array_equal(np.isinf(a.trace), np.isinf(b.trace))
    np.testing.assert_allclose(a.trace, b.trace, rtol=1e-8, atol=1e-14)


# --- known answers -----------------------------------------------------------------------------


@pytest.mark.parametrize("name", SOLVERS)
def test_cos_fixed_point(name):
    sol = SOLVERS[name](jnp.cos, jnp.array(1.0), tol=1e-12, stop_mode="abs", max_steps=200)
    assert sol.status == solvers.CONVERGED
    assert abs(float(sol.value) - COS_FIXED_POINT) < 1e-11
    assert sol.abs_residual <= 1e-12
    assert sol.value.dtype == jnp.float64


@functools.cache
def jitted_tanh_solve(name: str, tol: float, max_steps: int, stop_mode: str = "abs", **kwargs):
    """One compiled solve of tanh(Az + x) per configuration, reused across seeds."""

    def run(a, x):
        return SOLVERS[name](
            tanh_map(a, x),
            jnp.zeros_like(x),
            tol=tol,
            max_steps=max_steps,
            stop_mode=stop_mode,
            **kwargs,
        )

    return jax.jit(run)


@pytest.mark.parametrize("name", SOLVERS)
def test_contractive_tanh_matches_scipy(name):
    solve = jitted_tanh_solve(name, 1e-12, 200)
    for seed in range(3):
        rng = np.random.default_rng(seed)
        a, x = contractive_matrix(rng, 8, 0.8), rng.normal(size=8)
        sol = solve(jnp.asarray(a), jnp.asarray(x))
        assert sol.status == solvers.CONVERGED
        np.testing.assert_allclose(sol.value, scipy_root(a, x), atol=1e-10)


def test_noncontractive_map_iteration_fails_acceleration_converges():
    a, x = noncontractive_problem()
    z_star = scipy_root(a, x)
    # The fixed point is repelling for plain iteration: the Jacobian diag(1 - z*^2) A there has an
    # eigenvalue below -1, so iterates oscillate around it.
    jac = (1 - z_star**2)[:, None] * a
    assert np.min(np.linalg.eigvals(jac).real) < -1.05

    fpi = jitted_tanh_solve("fixed_point_iteration", 1e-8, 100)(jnp.asarray(a), jnp.asarray(x))
    assert fpi.status == solvers.MAX_STEPS
    tail = np.asarray(fpi.trace[50:])
    assert tail.min() > 0.1  # never gets anywhere near the fixed point
    # Oscillation: successive differences of the iterates do not shrink (period-2 cycle).
    z1 = np.asarray(fpi.value)
    z2 = np.tanh(a @ z1 + x)
    z3 = np.tanh(a @ z2 + x)
    assert np.linalg.norm(z3 - z1) < 0.5 * np.linalg.norm(z2 - z1)

    for name in ACCELERATED:
        sol = jitted_tanh_solve(name, 1e-8, 100)(jnp.asarray(a), jnp.asarray(x))
        assert sol.status == solvers.CONVERGED, name
        np.testing.assert_allclose(sol.value, z_star, atol=1e-7)


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


@pytest.mark.parametrize("name", SOLVERS)
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


# --- semantics of value, residuals and trace -------------------------------------------------


def fpi_iterates(f, z0, n):
    zs = [np.asarray(z0)]
    for _ in range(n - 1):
        zs.append(np.asarray(f(jnp.asarray(zs[-1]))))
    return zs


@pytest.mark.parametrize("stop_mode", ["abs", "rel"])
def test_value_is_lowest_residual_iterate(stop_mode):
    a, x = noncontractive_problem()
    f = tanh_map(jnp.asarray(a), jnp.asarray(x))
    sol = solvers.fixed_point_iteration(
        f, jnp.zeros(10), tol=1e-8, max_steps=40, stop_mode=stop_mode
    )
    trace = np.asarray(sol.trace)
    best = int(np.argmin(trace))
    assert best != int(sol.num_steps) - 1  # the last iterate is not the best: the test bites
    np.testing.assert_allclose(
        sol.value, fpi_iterates(f, jnp.zeros(10), best + 1)[best], atol=1e-12
    )
    abs_res, rel_res = residuals(f, sol.value)
    np.testing.assert_allclose([sol.abs_residual, sol.rel_residual], [abs_res, rel_res], rtol=1e-10)
    np.testing.assert_allclose(trace.min(), abs_res if stop_mode == "abs" else rel_res, rtol=1e-10)


@pytest.mark.parametrize("name", SOLVERS)
def test_value_residual_is_trace_minimum(name):
    """Holds whatever the solver: on a hard problem cut short and on an easy converged one."""
    a, x = noncontractive_problem()
    for scale, max_steps in [(1.0, 7), (0.5, 60)]:
        f = tanh_map(scale * jnp.asarray(a), jnp.asarray(x))
        sol = SOLVERS[name](f, jnp.zeros(10), tol=1e-9, max_steps=max_steps)
        n = int(sol.num_steps)
        trace = np.asarray(sol.trace)
        assert np.all(np.isfinite(trace[:n])) and np.all(np.isinf(trace[n:]))
        abs_res, rel_res = residuals(f, sol.value)
        np.testing.assert_allclose(
            [sol.abs_residual, sol.rel_residual], [abs_res, rel_res], rtol=1e-9
        )
        np.testing.assert_allclose(trace.min(), sol.rel_residual, rtol=1e-12)
        if sol.status == solvers.CONVERGED:
            assert trace[n - 1] == sol.rel_residual <= 1e-9
        else:
            assert sol.status == solvers.MAX_STEPS and n == max_steps


# --- status codes ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", SOLVERS)
def test_status_converged_and_max_steps(name):
    sol = SOLVERS[name](jnp.cos, jnp.array(1.0), tol=1e-8, max_steps=50)
    assert sol.status == solvers.CONVERGED and solvers.status_name(sol.status) == "converged"
    sol = SOLVERS[name](jnp.cos, jnp.array(1.0), tol=1e-14, max_steps=3)
    assert sol.status == solvers.MAX_STEPS and int(sol.num_steps) == 3
    assert solvers.status_name(sol.status) == "max_steps"


def test_status_diverged_linear_map():
    """z -> 2z + 1 from 0: the residual |z + 1| doubles each step; stop when > 10 x the best."""
    sol = solvers.fixed_point_iteration(
        lambda z: 2 * z + 1, jnp.array(0.0), stop_mode="abs", divergence_factor=10.0
    )
    assert sol.status == solvers.DIVERGED and solvers.status_name(sol.status) == "diverged"
    # residuals 1, 2, 4, 8, 16: the fifth evaluation exceeds 10 x 1.
    assert int(sol.num_steps) == 5
    np.testing.assert_allclose(sol.trace[:5], [1, 2, 4, 8, 16])
    assert float(sol.value) == 0.0 and float(sol.abs_residual) == 1.0


@pytest.mark.parametrize("name", SOLVERS)
def test_status_diverged_every_solver(name):
    """Every solver's first step is x0 + g(x0) = 1, where g = exp(10 z) is e^10 > 1e4 x g(x0)."""
    sol = SOLVERS[name](lambda z: z + jnp.exp(10 * z), jnp.zeros(2), stop_mode="abs")
    assert sol.status == solvers.DIVERGED
    assert int(sol.num_steps) == 2
    np.testing.assert_array_equal(sol.value, np.zeros(2))


@pytest.mark.parametrize("name", SOLVERS)
def test_status_nonfinite_returns_finite_value(name):
    """f(z) = z/2 + 0.6 (fixed point 1.2) but NaN beyond z > 1: every solver steps past 1."""

    def f(z):
        return jnp.where(z > 1.0, jnp.nan, 0.5 * z + 0.6)

    sol = SOLVERS[name](f, jnp.zeros(1), tol=1e-10, max_steps=50)
    assert sol.status == solvers.NONFINITE and solvers.status_name(sol.status) == "nonfinite"
    n = int(sol.num_steps)
    assert 2 <= n < 50
    assert np.isinf(sol.trace[n - 1]) and np.all(np.isfinite(sol.trace[: n - 1]))
    assert np.all(np.isfinite(sol.value)) and float(sol.value[0]) <= 1.0
    assert np.isfinite(sol.abs_residual)
    np.testing.assert_allclose(sol.abs_residual, residuals(f, sol.value)[0], rtol=1e-12)


def test_status_nonfinite_at_first_evaluation_returns_z0():
    sol = solvers.anderson(lambda z: z * jnp.nan, jnp.ones(3))
    assert sol.status == solvers.NONFINITE and int(sol.num_steps) == 1
    np.testing.assert_array_equal(sol.value, np.ones(3))
    assert np.isinf(sol.abs_residual)


# --- argument validation -----------------------------------------------------------------------


def _f(z):
    return 0.5 * z


Z0 = jnp.zeros(3)


@pytest.mark.parametrize(
    "call, arg",
    [
        (lambda: solvers.fixed_point_iteration(_f, Z0, stop_mode="max"), "stop_mode"),
        (lambda: solvers.anderson(_f, Z0, stop_mode="l2"), "stop_mode"),
        (lambda: solvers.anderson(_f, Z0, m=0), "m "),
        (lambda: solvers.anderson(_f, Z0, m=2.0), "m "),
        (lambda: solvers.anderson(_f, Z0, beta=0.0), "beta"),
        (lambda: solvers.anderson(_f, Z0, lam=-1.0), "lam"),
        (lambda: solvers.broyden(_f, Z0, max_steps=0), "max_steps"),
        (lambda: solvers.fixed_point_iteration(_f, Z0, max_steps=2.5), "max_steps"),
        (lambda: solvers.anderson(_f, Z0, tol=-1e-3), "tol"),
        (lambda: solvers.broyden(_f, Z0, tol=float("nan")), "tol"),
        (lambda: solvers.fixed_point_iteration(_f, jnp.zeros(3, jnp.int32)), "z0"),
        (lambda: solvers.broyden(_f, {"a": jnp.zeros(2), "b": jnp.arange(2)}), "z0"),
        (lambda: solvers.anderson(_f, {}), "z0"),
        (lambda: solvers.broyden(_f, Z0, memory=0), "memory"),
        (lambda: solvers.broyden(_f, Z0, line_search=1), "line_search"),
        (lambda: solvers.fixed_point_iteration(_f, Z0, damping=0.0), "damping"),
        (lambda: solvers.fixed_point_iteration(_f, Z0, damping=1.5), "damping"),
        (lambda: solvers.anderson(_f, Z0, divergence_factor=1.0), "divergence_factor"),
        (lambda: solvers.broyden(_f, Z0, loop="for"), "loop"),
        (lambda: solvers.anderson(lambda z: z[:2], Z0), "f must"),
        (lambda: solvers.broyden(lambda z: z.astype(jnp.float32), Z0), "f must"),
        (lambda: solvers.fixed_point_iteration(lambda z: (z,), Z0), "f must"),
        (lambda: solvers.fixed_point_iteration(None, Z0), "f must"),
    ],
)
def test_invalid_arguments_raise_value_error(call, arg):
    with pytest.raises(ValueError, match=arg):
        call()


# --- Broyden options ---------------------------------------------------------------------------


def test_broyden_full_and_limited_memory_converge():
    a, x = noncontractive_problem()
    z_star = scipy_root(a, x)
    full = jitted_tanh_solve("broyden", 1e-9, 100)(jnp.asarray(a), jnp.asarray(x))
    limited = jitted_tanh_solve("broyden", 1e-9, 100, memory=3)(jnp.asarray(a), jnp.asarray(x))
    for sol in (full, limited):
        assert sol.status == solvers.CONVERGED
        np.testing.assert_allclose(sol.value, z_star, atol=1e-8)
    # Only 3 of the updates are kept, so the ring buffer wraps and the run differs from full memory.
    assert int(limited.num_steps) > 4 and int(limited.num_steps) != int(full.num_steps)


def test_broyden_line_search_backtracks_and_converges():
    """On z - arctan(z) from far out the full Broyden step overshoots; backtracking changes it."""
    f = lambda z: z - jnp.arctan(z)  # noqa: E731
    z0 = jnp.asarray([5.0, -2.5])
    plain = solvers.broyden(f, z0, tol=1e-10, stop_mode="abs", max_steps=60)
    searched = solvers.broyden(f, z0, tol=1e-10, stop_mode="abs", max_steps=60, line_search=True)
    assert plain.status == searched.status == solvers.CONVERGED
    assert int(searched.num_steps) != int(plain.num_steps)
    np.testing.assert_allclose(searched.value, np.zeros(2), atol=1e-6)
    # A rejected trial is an evaluation like any other: the trace is not monotone there.
    n = int(searched.num_steps)
    assert np.any(np.diff(np.asarray(searched.trace[:n])) > 0)


# --- differentiation ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", SOLVERS)
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


# --- divergence, the combined stopping rule, Solution display (issues 13, 14) --------------------


@pytest.mark.parametrize("name", SOLVERS)
@pytest.mark.parametrize("stop_mode", ["abs", "rel", "mixed"])
def test_blowing_up_map_reports_diverged_in_every_stop_mode(name, stop_mode):
    """z -> 2z + 1 from 0 (issue 14 item 3): DIVERGED from the absolute residual's growth, and the
    returned iterate is not blown up (its absolute residual is within 2x the lowest seen)."""
    f = lambda z: 2 * z + 1  # noqa: E731
    if name in ACCELERATED:
        # Anderson and Broyden solve this linear problem (z* = -1); Anderson with m = 1 is plain
        # iteration and blows up like it.
        sol = SOLVERS[name](f, jnp.zeros(3), stop_mode=stop_mode, max_steps=200, tol=1e-6)
        assert sol.status == solvers.CONVERGED
        np.testing.assert_allclose(sol.value, -np.ones(3), atol=1e-4)
        if name == "broyden":
            return
        sol = SOLVERS[name](f, jnp.zeros(3), stop_mode=stop_mode, max_steps=200, m=1)
    else:
        sol = SOLVERS[name](f, jnp.zeros(3), stop_mode=stop_mode, max_steps=200)
    assert sol.status == solvers.DIVERGED, solvers.status_name(sol.status)
    assert int(sol.num_steps) < 200
    assert float(sol.abs_residual) <= 2 * np.sqrt(3) + 1e-9
    np.testing.assert_allclose(sol.abs_residual, residuals(f, sol.value)[0], rtol=1e-9)


def test_blowing_up_map_rel_mode_fixed_point_iteration_details():
    """The exact numbers: residuals |z + 1| = 1, 2, 4, ...; DIVERGED at 2^14 > 1e4 x 1."""
    sol = solvers.fixed_point_iteration(lambda z: 2 * z + 1, jnp.array(0.0), max_steps=100)
    assert sol.status == solvers.DIVERGED
    assert int(sol.num_steps) == 15
    assert float(sol.abs_residual) <= 2.0 and float(sol.value) in (0.0, 1.0)


def geometric_decay(z):
    """jaxopt's geometric-decay problem: the fixed point is exactly 0."""
    return jnp.asarray([0.9, 0.99, 0.999], z.dtype) * z


GEOMETRIC_Z0 = np.asarray([1.0, 0.4, -0.2])


@pytest.mark.parametrize("name", SOLVERS)
def test_mixed_stop_mode_reaches_zero_fixed_point(name):
    """rel mode cannot converge to a fixed point at 0 (its residual stays near 1e-3 for plain
    iteration, >= 1 for Broyden); the combined rule ||g|| <= atol + tol ||z|| does."""
    z0 = jnp.asarray(GEOMETRIC_Z0)
    max_steps = 8000 if name == "fixed_point_iteration" else 100
    rel = SOLVERS[name](geometric_decay, z0, tol=1e-5, stop_mode="rel", max_steps=max_steps)
    # rel mode can only "converge" once the iterate underflows below its 1e-30 denominator guard
    # (the relative residual of r * z is >= 1e-3 for every z != 0).
    assert rel.status != solvers.CONVERGED or float(rel.abs_residual) < 1e-30
    mixed = SOLVERS[name](geometric_decay, z0, tol=1e-5, stop_mode="mixed", max_steps=max_steps)
    assert mixed.status == solvers.CONVERGED
    assert float(mixed.abs_residual) <= 1e-5 * (1 + np.linalg.norm(mixed.value))
    assert np.linalg.norm(mixed.value) < 2e-2  # jaxopt: "forced to take high tol" (0.999)
    n = int(mixed.num_steps)
    assert mixed.trace[n - 1] <= 1e-5
    # An explicit atol: ||g|| <= atol + tol ||z||.
    tight = SOLVERS[name](
        geometric_decay, z0, tol=1e-5, atol=1e-7, stop_mode="mixed", max_steps=max_steps
    )
    assert tight.status == solvers.CONVERGED
    assert float(tight.abs_residual) <= 1e-7 + 1e-5 * np.linalg.norm(tight.value)
    assert int(tight.num_steps) >= n


def test_mixed_stop_mode_arguments():
    with pytest.raises(ValueError, match="atol"):
        solvers.anderson(_f, Z0, atol=1e-3)  # atol without stop_mode="mixed"
    with pytest.raises(ValueError, match="atol"):
        solvers.broyden(_f, Z0, stop_mode="mixed", atol=-1.0)
    with pytest.raises(ValueError, match="tol > 0"):
        solvers.fixed_point_iteration(_f, Z0, stop_mode="mixed", tol=0.0)


def test_status_name_and_repr_of_batched_solution():
    """Issue 13 item 7: status_name on a batched status; a concise repr."""
    scales = jnp.asarray([0.5, 2.0, 0.5])
    sol = jax.vmap(
        lambda s: solvers.fixed_point_iteration(lambda z: s * z + 1, jnp.zeros(2), max_steps=200)
    )(scales)
    assert solvers.status_name(sol.status) == ["converged", "diverged", "converged"]
    assert solvers.status_name(sol.status[0]) == "converged"
    assert solvers.status_name(jnp.asarray([[0, 3]])) == [["converged", "nonfinite"]]
    text = repr(sol)
    assert "converged: 2" in text and "diverged: 1" in text and "inf" not in text
    assert len(text) < 300
    single = repr(solvers.anderson(jnp.cos, jnp.array(1.0), tol=1e-8, max_steps=200))
    assert "status=converged" in single and "num_steps=" in single and "inf" not in single
    # Under jit the fields are abstract: the repr still works.
    jax.jit(lambda: (repr(solvers.anderson(jnp.cos, jnp.array(1.0))), 0)[1])()


@pytest.mark.parametrize("name", SOLVERS)
def test_f_value_is_f_at_value(name):
    a, x = noncontractive_problem()
    f = tanh_map(0.5 * jnp.asarray(a), jnp.asarray(x))
    sol = SOLVERS[name](f, jnp.zeros(10), tol=1e-9, max_steps=60)
    np.testing.assert_allclose(sol.f_value, f(sol.value), rtol=1e-12, atol=1e-14)
