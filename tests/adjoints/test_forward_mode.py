"""ImplicitAdjoint(forward_mode=True): jvp, jacfwd, linearize, hessian and mixed-order products
through the implicit layer, against dense float64 answers of the implicit function theorem
(``dz*/dx = (I − J_z)⁻¹ J_x``), finite differences and analytic derivatives."""

import functools

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import deqjax as dq
from deqjax._src import compiled
from tests.helpers.dense_ift import dense_implicit_grad
from tests.helpers.lanes import default_first

D, DX = 5, 3
# Compile time dominates these tests: fixed-point iteration (the smallest loop) and no fallback
# (its GMRES loop would be compiled into every tangent and adjoint solve) on the contractions;
# the fallback has tests of its own below.
FORWARD = dq.ImplicitAdjoint(forward_mode=True, fallback=None)
TIGHT = dq.solvers.FixedPointIteration(tol=1e-14, max_steps=400, stop_mode="abs")


# --- f(z; x, θ) = tanh(W z + U x + b), a contraction, and its dense IFT derivatives ---------------


def cell(p, x, z):
    return jnp.tanh(p["W"] @ z + p["U"] @ x + p["b"])


def problem(seed=0, radius=0.6):
    rng = np.random.default_rng(seed)
    w = rng.normal(size=(D, D))
    w *= radius / np.linalg.norm(w, 2)  # ‖W‖₂ = radius < 1 and |tanh'| ≤ 1: a contraction
    p = {
        "W": jnp.asarray(w),
        "U": jnp.asarray(rng.normal(size=(D, DX)) / np.sqrt(DX)),
        "b": jnp.asarray(0.1 * rng.normal(size=D)),
    }
    return p, jnp.asarray(rng.normal(size=DX))


def random_like(t, seed):
    rng = np.random.default_rng(seed)
    return jax.tree_util.tree_map(lambda a: jnp.asarray(rng.normal(size=a.shape)), t)


def z_of(p, x, adjoint=FORWARD, solver=TIGHT):
    return dq.fixed_point(cell, p, x, jnp.zeros(D), solver=solver, adjoint=adjoint)[0]


@jax.jit
def dense_z(p, x):
    """z* by 400 plain iterations of the contraction (float64, to machine precision)."""
    return jax.lax.fori_loop(0, 400, lambda _, z: cell(p, x, z), jnp.zeros(D, x.dtype))


def dense_jacobians(p, x):
    """``(dz*/dx, dz*/dp)`` by the implicit function theorem, every matrix formed densely."""
    z = dense_z(p, x)
    a = jnp.eye(D) - jax.jacobian(cell, argnums=2)(p, x, z)
    jx = jax.jacobian(cell, argnums=1)(p, x, z)
    jp = jax.jacobian(cell, argnums=0)(p, x, z)
    dz_dx = jnp.linalg.solve(a, jx)
    dz_dp = jax.tree_util.tree_map(
        lambda j: jnp.linalg.solve(a, j.reshape(D, -1)).reshape(j.shape), jp
    )
    return dz_dx, dz_dp


def loss_of_z(z):
    return jnp.sum(jnp.sin(z)) + 0.5 * jnp.sum(z**3)


def dense_grad_x(p, x):
    """dℓ/dx = uᵀ J_x with (I − J_z)ᵀ u = ∂ℓ/∂z*, dense (the reference for finite differences)."""
    z = dense_z(p, x)
    a = jnp.eye(D) - jax.jacobian(cell, argnums=2)(p, x, z)
    u = jnp.linalg.solve(a.T, jax.grad(loss_of_z)(z))
    return jax.jacobian(cell, argnums=1)(p, x, z).T @ u


def unrolled_loss(x, p, steps=300):
    """ℓ(z*(x)) with z* the limit of ``steps`` iterations, differentiable by plain autodiff: for a
    contraction the derivatives of the iterates converge to those of z* (a dense reference of
    second derivatives, independent of the implicit layer)."""
    z = jax.lax.fori_loop(0, steps, lambda _, z: cell(p, x, z), jnp.zeros(D, x.dtype))
    return loss_of_z(z)


def close(a, b, tol):
    for u, v in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b), strict=True):
        np.testing.assert_allclose(np.asarray(u), np.asarray(v), rtol=tol, atol=tol)


# --- first order: jvp, jacfwd, linearize against the dense IFT Jacobian -------------------------


def test_jvp_in_x_and_params_matches_dense_ift():
    p, x = problem()
    dz_dx, dz_dp = dense_jacobians(p, x)
    dx, dp = random_like(x, 1), random_like(p, 2)
    _, got_x = jax.jit(lambda xx: jax.jvp(lambda y: z_of(p, y), (xx,), (dx,)))(x)
    close(got_x, dz_dx @ dx, 1e-10)
    _, got_p = jax.jit(lambda q: jax.jvp(lambda r: z_of(r, x), (q,), (dp,)))(p)
    want_p = sum(jnp.tensordot(dz_dp[k], dp[k], axes=dp[k].ndim) for k in ("W", "U", "b"))
    close(got_p, want_p, 1e-10)


@pytest.mark.parametrize("argnum", [0, 1])
def test_jacfwd_equals_dense_ift_and_jacrev(argnum):
    p, x = problem(seed=3)
    want = dense_jacobians(p, x)[1 - argnum]
    fwd = jax.jit(jax.jacfwd(z_of, argnums=argnum))(p, x)
    rev = jax.jit(jax.jacrev(z_of, argnums=argnum))(p, x)
    default = dq.ImplicitAdjoint(fallback=None)
    rev_default = jax.jit(jax.jacrev(functools.partial(z_of, adjoint=default), argnum))(p, x)
    close(fwd, want, 1e-10)
    close(rev, want, 1e-10)
    close(rev_default, want, 1e-10)


def test_linearize_matches_dense_ift():
    p, x = problem(seed=4)
    dz_dx, _ = dense_jacobians(p, x)
    z, lin = jax.linearize(lambda xx: z_of(p, xx), x)
    close(z, dense_z(p, x), 1e-12)
    for seed in (5, 6):
        dx = random_like(x, seed)
        close(lin(dx), dz_dx @ dx, 1e-10)


# --- second order: Hessian-vector products and the Hessian ---------------------------------------


def test_hessian_vector_products_match_finite_differences_of_the_gradient():
    p, x = problem(seed=7)
    v = random_like(x, 8)
    eps = 1e-5
    fd = (dense_grad_x(p, x + eps * v) - dense_grad_x(p, x - eps * v)) / (2 * eps)

    def loss(xx):
        return loss_of_z(z_of(p, xx))

    fwd_over_rev = jax.jit(lambda xx: jax.jvp(jax.grad(loss), (xx,), (v,))[1])(x)
    rev_over_fwd = jax.jit(jax.grad(lambda xx: jax.jvp(loss, (xx,), (v,))[1]))(x)
    close(fwd_over_rev, fd, 1e-7)
    close(rev_over_fwd, fd, 1e-7)


def test_hessian_vector_product_in_the_parameters_matches_finite_differences():
    """Along W, U and b at once: J_z = diag(tanh') W moves with W, so the tangent solve's
    operator is differentiated too (custom_linear_solve's JVP of its matvec)."""
    p, x = problem(seed=21)
    v = random_like(p, 22)
    eps = 1e-5

    def dense_grad(q):
        return dense_implicit_grad(cell, q, x, dense_z(q, x), loss_of_z)

    plus = jax.tree_util.tree_map(lambda a, b: a + eps * b, p, v)
    minus = jax.tree_util.tree_map(lambda a, b: a - eps * b, p, v)
    fd = jax.tree_util.tree_map(
        lambda a, b: (a - b) / (2 * eps), dense_grad(plus), dense_grad(minus)
    )

    def loss(q):
        return loss_of_z(z_of(q, x))

    got = jax.jit(lambda q: jax.jvp(jax.grad(loss), (q,), (v,))[1])(p)
    close(got, fd, 1e-7)


def test_hessian_in_x_matches_dense_second_derivative():
    p, x = problem(seed=9)
    want = jax.jit(jax.hessian(unrolled_loss))(x, p)
    got = jax.jit(jax.hessian(lambda xx: loss_of_z(z_of(p, xx))))(x)
    close(got, want, 1e-9)


# --- the fixed point of cos (ported from optimistix's implicit jvp test) -------------------------


def cos_cell(a, x, z):
    del x
    return a * jnp.cos(z)


def test_jvp_through_the_fixed_point_of_cos_is_analytic():
    """z* = a cos z*: dz*/da = cos z* / (1 + a sin z*), and its derivative in a."""
    a = jnp.asarray(0.7)

    def z_of_a(a):
        return dq.fixed_point(cos_cell, a, None, jnp.zeros(()), solver=TIGHT, adjoint=FORWARD)[0]

    z, dz = jax.jvp(z_of_a, (a,), (jnp.ones(()),))
    s, c = jnp.sin(z), jnp.cos(z)
    np.testing.assert_allclose(z, a * c, atol=1e-13)
    first = c / (1 + a * s)
    np.testing.assert_allclose(dz, first, rtol=1e-11)
    second = (-s * first * (1 + a * s) - c * (s + a * c * first)) / (1 + a * s) ** 2
    np.testing.assert_allclose(jax.jit(jax.hessian(z_of_a))(a), second, rtol=1e-9)


# --- under jit and vmap, and batch-native solves --------------------------------------------------


def test_jvp_under_jit_and_vmap():
    p, _ = problem(seed=10)
    xs = jnp.asarray(np.random.default_rng(11).normal(size=(4, DX)))
    dxs = jnp.asarray(np.random.default_rng(12).normal(size=(4, DX)))
    jvp = jax.jit(jax.vmap(lambda x, dx: jax.jvp(lambda xx: z_of(p, xx), (x,), (dx,))))
    zs, dzs = jvp(xs, dxs)
    for i in range(4):
        dz_dx, _ = dense_jacobians(p, xs[i])
        close(zs[i], dense_z(p, xs[i]), 1e-12)
        close(dzs[i], dz_dx @ dxs[i], 1e-10)


def batch_cell(p, x, z):
    """The cell for a batch: z [B, D], x [B, DX]."""
    return jnp.tanh(z @ p["W"].T + x @ p["U"].T + jnp.broadcast_to(p["b"], z.shape))


@pytest.mark.parametrize("solver", default_first(["anderson", "fpi", "broyden"]))
def test_batch_native_jvp_and_jacfwd(solver):
    kinds = {
        "anderson": dq.solvers.Anderson,
        "fpi": dq.solvers.FixedPointIteration,
        "broyden": dq.solvers.Broyden,
    }
    native = kinds[solver](tol=1e-13, max_steps=400, stop_mode="abs", batch_ndim=1)
    p, _ = problem(seed=13)
    xs = jnp.asarray(np.random.default_rng(14).normal(size=(3, DX)))
    dxs = jnp.asarray(np.random.default_rng(15).normal(size=(3, DX)))

    def zs_of(q, x):
        z0 = jnp.zeros((x.shape[0], D))
        return dq.fixed_point(batch_cell, q, x, z0, solver=native, adjoint=FORWARD)[0]

    _, dzs = jax.jit(lambda x, dx: jax.jvp(lambda xx: zs_of(p, xx), (x,), (dx,)))(xs, dxs)
    jac_b = jax.jit(jax.jacfwd(lambda b: zs_of({**p, "b": b}, xs)))(p["b"])
    for i in range(3):
        dz_dx, dz_dp = dense_jacobians(p, xs[i])
        close(dzs[i], dz_dx @ dxs[i], 1e-10)
        close(jac_b[i], dz_dp["b"], 1e-10)


# --- the backward's guarantees on this path: fallback, failure policy, statistics ---------------


def flip_problem(seed=0, lam=-0.97):
    """J = diag(tanh') W with an eigenvalue near −1: fixed-point iteration cannot solve the
    tangent or the adjoint system, GMRES can."""
    rng = np.random.default_rng(seed)
    q, _ = np.linalg.qr(rng.normal(size=(D, D)))
    w = (q * np.concatenate([[lam], rng.uniform(-0.3, 0.3, size=D - 1)])) @ q.T
    p = {
        "W": jnp.asarray(w),
        "U": jnp.asarray(0.05 * rng.normal(size=(D, DX))),
        "b": jnp.asarray(0.05 * rng.normal(size=D)),
    }
    return p, jnp.asarray(0.05 * rng.normal(size=DX))


FORWARD_FPI = dq.solvers.Broyden(tol=1e-13, max_steps=300, stop_mode="abs")
BACKWARD_FPI = dq.solvers.FixedPointIteration(tol=1e-12, max_steps=60, stop_mode="abs")


def test_gmres_fallback_makes_the_tangent_exact_where_iteration_cannot():
    p, x = flip_problem()
    dz_dx, _ = dense_jacobians(p, x)
    dx = random_like(x, 16)
    with_fallback = dq.ImplicitAdjoint(solver=BACKWARD_FPI, forward_mode=True)
    _, got = jax.jvp(lambda xx: z_of(p, xx, with_fallback, FORWARD_FPI), (x,), (dx,))
    close(got, dz_dx @ dx, 1e-8)
    # without the fallback the same tangent solve fails, and on_failure="nan" says so
    nan_policy = dq.ImplicitAdjoint(
        solver=BACKWARD_FPI, fallback=None, on_failure="nan", forward_mode=True
    )
    _, bad = jax.jvp(lambda xx: z_of(p, xx, nan_policy, FORWARD_FPI), (x,), (dx,))
    assert np.all(np.isnan(np.asarray(bad)))


def test_backward_stats_and_gradient_equal_the_reverse_mode_path():
    p, x = flip_problem(seed=1)
    probe = dq.BackwardStats.zeros()

    def loss(q, probe, forward_mode):
        adjoint = dq.ImplicitAdjoint(solver=BACKWARD_FPI, forward_mode=forward_mode)
        z, _ = dq.fixed_point(
            cell, q, x, jnp.zeros(D), solver=FORWARD_FPI, adjoint=adjoint, backward_stats=probe
        )
        return loss_of_z(z)

    g_fwd, s_fwd = jax.jit(jax.grad(functools.partial(loss, forward_mode=True), (0, 1)))(p, probe)
    g_rev, s_rev = jax.jit(jax.grad(functools.partial(loss, forward_mode=False), (0, 1)))(p, probe)
    close(g_fwd, g_rev, 1e-9)
    assert float(s_fwd.count) == 1.0 and float(s_fwd.fallbacks) == 1.0
    assert float(s_fwd.failures) == 0.0
    close(s_fwd, s_rev, 1e-6)
    # summed over the examples of a vmap with an unbatched probe
    xs = jnp.stack([x, -x, 2 * x])

    def batch_loss(q, probe):
        def one(xi):
            z, _ = dq.fixed_point(
                cell, q, xi, jnp.zeros(D), solver=TIGHT, adjoint=FORWARD, backward_stats=probe
            )
            return loss_of_z(z)

        return jnp.sum(jax.vmap(one)(xs))

    _, stats = jax.grad(batch_loss, (0, 1))(p, probe)
    assert float(stats.count) == 3.0


# --- every combination the default adjoint differentiates (custom_linear_solve's transpose) -----

DEFAULT = dq.ImplicitAdjoint(fallback=None)


def pair_cell(p, x, z):
    """A pytree state ``(a, b)`` whose leaf ``b = sin(a) / 2`` reads neither ``p`` nor ``x``."""
    a, b = z
    return jnp.tanh(p["W"] @ a + p["U"] @ x + p["b"] + 0.3 * jnp.tanh(b)), 0.5 * jnp.sin(a)


def pair_loss(z):
    return loss_of_z(z[0]) + jnp.sum(z[1] ** 2)


def pair_z(p, x, adjoint, probe=None):
    z0 = (jnp.zeros(D), jnp.zeros(D))
    z, _ = dq.fixed_point(pair_cell, p, x, z0, solver=TIGHT, adjoint=adjoint, backward_stats=probe)
    return z


def dense_pair_grads(p, x):
    """``(dℓ/dp, dℓ/dx)`` of :func:`pair_loss` by the dense implicit function theorem on the
    state flattened to one vector (float64)."""

    def flat_cell(q, xx, v):
        return jnp.concatenate(pair_cell(q, xx, (v[:D], v[D:])))

    v = jax.lax.fori_loop(0, 400, lambda _, v: flat_cell(p, x, v), jnp.zeros(2 * D))
    loss = lambda v: pair_loss((v[:D], v[D:]))  # noqa: E731
    g_p = dense_implicit_grad(flat_cell, p, x, v, loss)
    g_x = dense_implicit_grad(lambda xx, q, v: flat_cell(q, xx, v), x, p, v, loss)
    return g_p, g_x


@pytest.mark.parametrize("transform", ["grad", "jacrev"])
def test_a_state_leaf_that_reads_no_input_differentiates_like_the_default(transform):
    """Under jax.grad/jacrev the tangent solve's right-hand side has a leaf computed from no
    differentiated input (b's): forward_mode=True crashed in JAX's transpose of
    custom_linear_solve (a bare AssertionError)."""
    p, x = problem(seed=23)
    if transform == "grad":
        want = dense_pair_grads(p, x)
        for adjoint in (FORWARD, DEFAULT):
            loss = lambda q, xx: pair_loss(pair_z(q, xx, adjoint))  # noqa: B023, E731
            close(jax.jit(jax.grad(loss, argnums=(0, 1)))(p, x), want, 1e-9)
    else:
        jacobians = [functools.partial(pair_z, x=x, adjoint=a) for a in (FORWARD, DEFAULT)]
        got, ref = (jax.jit(jax.jacrev(z_of_p))(p) for z_of_p in jacobians)
        close(got, ref, 1e-9)


def test_a_state_leaf_that_reads_no_input_has_its_hessian():
    p, x = problem(seed=24)

    def unrolled(xx):
        z = (jnp.zeros(D), jnp.zeros(D))
        return pair_loss(jax.lax.fori_loop(0, 300, lambda _, z: pair_cell(p, xx, z), z))

    want = jax.jit(jax.hessian(unrolled))(x)
    got = jax.jit(jax.hessian(lambda xx: pair_loss(pair_z(p, xx, FORWARD))))(x)
    close(got, want, 1e-8)


@pytest.mark.parametrize("state", ["vector", "pytree"])
@pytest.mark.parametrize("argnums", [(0,), (1,), (0, 1)], ids=["params", "probe", "both"])
def test_with_a_probe_forward_mode_differentiates_what_the_default_does(argnums, state):
    """A BackwardStats probe passed, and the parameters alone, the probe alone or both
    differentiated (forward_mode=True crashed in the first two): the gradients and statistics
    of the default adjoint."""
    p, x = problem(seed=25)

    def loss(q, probe, adjoint):
        if state == "pytree":
            return pair_loss(pair_z(q, x, adjoint, probe))
        z, _ = dq.fixed_point(
            cell, q, x, jnp.zeros(D), solver=TIGHT, adjoint=adjoint, backward_stats=probe
        )
        return loss_of_z(z)

    probe = dq.BackwardStats.zeros()
    got, want = (
        jax.jit(jax.grad(functools.partial(loss, adjoint=a), argnums))(p, probe)
        for a in (FORWARD, DEFAULT)
    )
    close(got, want, 1e-9)
    if 1 in argnums:
        stats = got[-1]
        assert float(stats.count) == 1.0 and float(stats.failures) == 0.0


def test_deq_with_a_probe_differentiates_the_parameters_or_the_probe_alone():
    def forward(adjoint):
        def apply(x, probe):
            w_init = hk.initializers.RandomNormal(0.4 / np.sqrt(D))
            cell = lambda z, xx: jnp.tanh(hk.Linear(D, w_init=w_init)(z) + xx)  # noqa: E731
            solver = dq.solvers.Anderson(tol=1e-13, max_steps=300)
            deq = dq.nn.DEQ(cell, solver=solver, adjoint=adjoint)
            return jnp.sum(jnp.sin(deq(x, backward_stats=probe)[0]))

        return hk.without_apply_rng(hk.transform(apply))

    xs = jnp.asarray(np.random.default_rng(26).normal(size=(3, D)))
    probe = dq.BackwardStats.zeros()
    params = forward(DEFAULT).init(jax.random.PRNGKey(0), xs, probe)
    for argnums in (0, 2):
        got, want = (
            jax.jit(jax.grad(forward(a).apply, argnums))(params, xs, probe)
            for a in (FORWARD, DEFAULT)
        )
        close(got, want, 1e-9)


# --- the default path refuses forward mode, naming forward_mode=True ---------------------------


@pytest.mark.parametrize(
    "transform",
    [
        lambda g, x: jax.jvp(g, (x,), (x,)),
        lambda g, x: jax.jit(lambda y: jax.jvp(g, (y,), (y,)))(x),
        lambda g, x: jax.jacfwd(g)(x),
        lambda g, x: jax.hessian(lambda y: jnp.sum(g(y)))(x),
    ],
    ids=["jvp", "jit_of_jvp", "jacfwd", "hessian"],
)
def test_default_adjoint_refuses_forward_mode_with_a_clear_error(transform):
    p, x = problem()
    with pytest.raises(ValueError, match=r"forward_mode=True"):
        transform(lambda xx: z_of(p, xx, adjoint=dq.ImplicitAdjoint()), x)


def test_default_adjoint_still_differentiates_in_reverse_mode_inside_an_unrelated_jvp():
    """A jvp elsewhere in the program is not refused: only tangents reaching the layer are."""
    p, x = problem()

    def h(t):
        z = z_of(p, x, adjoint=dq.ImplicitAdjoint())
        return t * jnp.sum(z)

    _, dt = jax.jvp(h, (jnp.ones(()),), (jnp.ones(()),))
    np.testing.assert_allclose(dt, jnp.sum(dense_z(p, x)), rtol=1e-12)


def test_forward_mode_must_be_a_bool():
    with pytest.raises(ValueError, match="forward_mode"):
        dq.ImplicitAdjoint(forward_mode="yes")
    assert dq.ImplicitAdjoint(forward_mode=True, fallback=None) == FORWARD
    assert hash(dq.ImplicitAdjoint(forward_mode=True, fallback=None)) == hash(FORWARD)
    assert dq.ImplicitAdjoint(forward_mode=True) != dq.ImplicitAdjoint()


# --- eager calls compile once ---------------------------------------------------------------------

_compiles = [0]


def _on_duration(event: str, *args, **kwargs) -> None:
    if event == "/jax/core/compile/backend_compile_duration":
        _compiles[0] += 1


jax.monitoring.register_event_duration_secs_listener(_on_duration)


def test_a_repeated_eager_jvp_and_grad_compile_nothing():
    p, x = problem(seed=17)
    dx = random_like(x, 18)
    jvp = lambda: jax.jvp(lambda xx: z_of(p, xx), (x,), (dx,))  # noqa: E731
    grad = lambda: jax.grad(lambda q: loss_of_z(z_of(q, x)))(p)  # noqa: E731
    for call in (jvp, grad):
        jax.block_until_ready(call())
        jax.block_until_ready(call())
        before, size = _compiles[0], compiled.size()
        for _ in range(3):
            jax.block_until_ready(call())
        assert _compiles[0] == before, "a repeated eager call compiled"
        assert compiled.size() == size


# --- dq.nn.DEQ -----------------------------------------------------------------------------------


def deq_forward(adjoint):
    def forward(x):
        cell = lambda z, xx: jnp.tanh(  # noqa: E731
            hk.Linear(D, w_init=hk.initializers.RandomNormal(0.4 / np.sqrt(D)))(z) + xx
        )
        deq = dq.nn.DEQ(cell, solver=dq.solvers.Anderson(tol=1e-13, max_steps=300), adjoint=adjoint)
        return deq(x)[0]

    return hk.without_apply_rng(hk.transform(forward))


def test_deq_jvp_in_its_input_matches_dense_ift():
    model = deq_forward(FORWARD)
    xs = jnp.asarray(np.random.default_rng(19).normal(size=(3, D)))
    dxs = jnp.asarray(np.random.default_rng(20).normal(size=(3, D)))
    params = model.init(jax.random.PRNGKey(0), xs)
    apply = functools.partial(model.apply, params)
    zs, dzs = jax.jit(lambda x, dx: jax.jvp(apply, (x,), (dx,)))(xs, dxs)
    (linear,) = [v for v in params.values()]
    w, b = linear["w"], linear["b"]
    for i in range(3):
        np.testing.assert_allclose(zs[i], jnp.tanh(zs[i] @ w + b + xs[i]), atol=1e-12)
        s = 1 - zs[i] ** 2  # z = tanh(z W + b + x): J_z = diag(s) Wᵀ, J_x = diag(s)
        want = jnp.linalg.solve(jnp.eye(D) - s[:, None] * w.T, s * dxs[i])
        close(dzs[i], want, 1e-10)
    # ⟨vjp(c), c⟩ = ⟨c, jvp(c)⟩: reverse mode on the same path is the transpose of forward mode
    rev, fwd_t = jax.jit(lambda x, c: (jax.vjp(apply, x)[1](c)[0], jax.jvp(apply, (x,), (c,))[1]))(
        xs, dzs
    )
    np.testing.assert_allclose(jnp.vdot(rev, dzs), jnp.vdot(dzs, fwd_t), rtol=1e-10)
    with pytest.raises(ValueError, match=r"forward_mode=True"):
        jax.jvp(lambda x: deq_forward(None).apply(params, x), (xs,), (dxs,))
