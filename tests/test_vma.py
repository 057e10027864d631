"""Control flow typed for a checked ``shard_map`` (deqjax/_src/vma.py): loops from constants over a
sharded input, branches that differ in how they vary, on a one-device mesh (``check_vma`` types
values whatever the number of devices); and nothing changed, nothing traced twice, outside one."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from deqjax._src import vma

AXIS = "batch"
# JAX >= 0.10 says "manual axis types do not match"; 0.8 "the varying manual axes do not match".
MISMATCH = "manual axis types do not match|varying manual axes do not match"


def checked(fn, in_specs, out_specs):
    """``fn`` under ``jax.jit(jax.shard_map(..., check_vma=True))`` over one device."""
    mesh = jax.make_mesh((1,), (AXIS,), axis_types=(jax.sharding.AxisType.Auto,))
    return jax.jit(
        jax.shard_map(fn, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_vma=True)
    )


W = jnp.asarray([[0.5, -0.2], [0.1, 0.3]])
X = jnp.asarray([[1.0, 2.0], [-1.0, 0.5], [0.2, 0.0]])


def contraction(w, x, z):
    return jnp.tanh(z @ w.T + x)


def by_while(loop, w, x):
    # The carry starts from constants (invariant); the body reads this device's x (varying).
    def body(c):
        k, z = c
        return k + 1, contraction(w, x, z)

    return loop(lambda c: c[0] < 20, body, (jnp.zeros((), jnp.int32), jnp.zeros(x.shape)))[1]


def by_fori(loop, w, x):
    return loop(0, 20, lambda i, z: contraction(w, x, z), jnp.zeros(x.shape))


def by_scan(loop, w, x):
    return loop(lambda z, _: (contraction(w, x, z), None), jnp.zeros(x.shape), None, length=20)[0]


LOOPS = {
    "while_loop": (by_while, jax.lax.while_loop, vma.while_loop),
    "fori_loop": (by_fori, jax.lax.fori_loop, vma.fori_loop),
    "scan": (by_scan, jax.lax.scan, vma.scan),
}


@pytest.mark.parametrize("name", sorted(LOOPS))
def test_a_loop_from_constants_over_a_sharded_input_runs_checked(name):
    run, lax_loop, ours = LOOPS[name]
    expected = run(lax_loop, W, X)  # no shard_map: nothing varies
    with pytest.raises(TypeError, match=MISMATCH):
        checked(functools.partial(run, lax_loop), (P(), P(AXIS)), P(AXIS))(W, X)
    got = checked(functools.partial(run, ours), (P(), P(AXIS)), P(AXIS))(W, X)
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("name", ["fori_loop", "scan"])  # a while_loop has no reverse mode
def test_a_checked_loop_has_the_gradient_of_the_plain_one(name):
    run, lax_loop, ours = LOOPS[name]

    def loss(loop, w, x):
        return jnp.sum(run(loop, w, x) ** 2)

    expected = jax.grad(loss, argnums=(1, 2))(lax_loop, W, X)

    def per_device(w, x):  # w varies by device: its gradient is this device's (see vary_over)
        return jax.grad(loss, argnums=(1, 2))(ours, vma.vary_over(w, AXIS), x)

    got = checked(per_device, (P(), P(AXIS)), (P(AXIS), P(AXIS)))(W, X)
    for g, e in zip(got, expected):
        np.testing.assert_allclose(g, e, rtol=1e-12)


def test_the_carry_is_matched_over_as_many_rounds_as_it_takes():
    # b varies only once a does: a second trace of the body finds it.
    def run(loop, x):
        def body(i, c):
            a, b, k = c
            return a + x, a * 2.0, k + 1

        return loop(0, 3, body, (jnp.zeros(x.shape), jnp.zeros(x.shape), jnp.zeros((), jnp.int32)))

    expected = run(jax.lax.fori_loop, X)
    got = checked(functools.partial(run, vma.fori_loop), (P(AXIS),), (P(AXIS), P(AXIS), P()))(X)
    for g, e in zip(got, expected):
        np.testing.assert_array_equal(g, e)

    def types(x):
        init = (jnp.zeros(x.shape), jnp.zeros(x.shape), jnp.zeros((), jnp.int32))
        matched = vma.match_carry(lambda c: (c[0] + x, c[0] * 2.0, c[2] + 1), init)
        assert [vma.of(leaf) for leaf in matched] == [{AXIS}, {AXIS}, set()]  # k stays invariant
        return x

    checked(types, (P(AXIS),), P(AXIS))(X)


def test_cond_branches_that_vary_differently_agree():
    def run(cond, x, flag):
        return cond(flag, lambda: jnp.sum(x, axis=0), lambda: jnp.zeros(x.shape[1:]))

    with pytest.raises(TypeError, match=MISMATCH):
        checked(functools.partial(run, jax.lax.cond), (P(AXIS), P()), P(AXIS))(X, True)
    for flag in (True, False):
        got = checked(functools.partial(run, vma.cond), (P(AXIS), P()), P(AXIS))(X, flag)
        np.testing.assert_array_equal(got, run(jax.lax.cond, X, flag))


def by_cond_per_example(cond, w, x):
    # Each example's own branch: a predicate that varies over devices (it reads x), batched by
    # vmap; the taken branch mixes the replicated w (invariant) into it.
    def one(xi):
        return cond(jnp.sum(xi) > 0, lambda a: jnp.tanh(a * w[0] + w[1]), lambda a: a - w[0], xi)

    return jax.vmap(one)(x)


def test_a_cond_on_a_batched_predicate_that_varies_runs_checked_with_its_gradient():
    """JAX turns a vmapped cond into a select of its inputs, making the replicated w vary after
    the branches were typed (the slow lane's synthetic 1D run, the fallback backward solve)."""
    expected = by_cond_per_example(jax.lax.cond, W[0], X)
    with pytest.raises((TypeError, ValueError), match="pvary"):
        checked(functools.partial(by_cond_per_example, jax.lax.cond), (P(), P(AXIS)), P(AXIS))(
            W[0], X
        )
    got = checked(functools.partial(by_cond_per_example, vma.cond), (P(), P(AXIS)), P(AXIS))(
        W[0], X
    )
    np.testing.assert_array_equal(got, expected)
    assert np.any(X.sum(axis=1) > 0) and np.any(X.sum(axis=1) <= 0)  # both branches are taken

    def loss(cond, w, x):
        return jnp.sum(by_cond_per_example(cond, w, x) ** 2)

    expected = jax.grad(loss, argnums=(1, 2))(jax.lax.cond, W[0], X)

    def per_device(w, x):
        return jax.grad(loss, argnums=(1, 2))(vma.cond, vma.vary_over(w, AXIS), x)

    got = checked(per_device, (P(), P(AXIS)), (P(AXIS), P(AXIS)))(W[0], X)
    for g, e in zip(got, expected):
        np.testing.assert_allclose(g, e, rtol=1e-12)


def test_a_cond_skips_its_branch_unless_vmap_batches_its_predicate():
    def per_device(x):  # a varying predicate, not batched: one branch runs
        return vma.cond(jnp.sum(x) > 0, lambda a: a * W[0, 0], lambda a: a, x)

    def program(fn):
        mesh = jax.make_mesh((1,), (AXIS,), axis_types=(jax.sharding.AxisType.Auto,))
        sm = jax.shard_map(fn, mesh=mesh, in_specs=(P(AXIS),), out_specs=P(AXIS), check_vma=True)
        return str(jax.make_jaxpr(sm)(X))

    assert "cond[" in program(per_device)
    assert "cond[" not in program(functools.partial(by_cond_per_example, vma.cond, W[0]))


def test_batched_sees_a_vmap_at_any_level_and_under_jvp():
    seen = []

    def record(x):
        seen.append(vma.batched(x))
        return x

    record(jnp.ones(2))
    jax.vmap(record)(jnp.ones((3, 2)))
    jax.vmap(record, in_axes=None, axis_size=3)(jnp.ones(2))  # not mapped
    jax.vmap(lambda a: jax.vmap(lambda _: record(a), axis_size=2)(None))(jnp.ones((3, 2)))
    jax.vmap(lambda a: jax.jvp(record, (a,), (a,))[0])(jnp.ones((3, 2)))
    assert seen == [False, True, False, True, True]


def test_an_optimization_barrier_keeps_each_leafs_type():
    def run(w, x):
        w2, x2 = vma.optimization_barrier((w, x))
        assert vma.of(w2) == set() and vma.of(x2) == {AXIS}
        return w2, x2

    got = checked(run, (P(), P(AXIS)), (P(), P(AXIS)))(W, X)
    np.testing.assert_array_equal(got[0], W)
    np.testing.assert_array_equal(got[1], X)


def test_inputs_made_alike_vary_over_every_axis_one_of_them_varies_over():
    def run(w, x):
        w2, x2, z = vma.vary_alike((w, x, jnp.zeros(3)))
        assert vma.of(w2) == vma.of(x2) == vma.of(z) == {AXIS}
        invariant = vma.vary_alike((w, jnp.zeros(3)))
        assert all(vma.of(a) == set() for a in invariant)  # nothing varies: nothing cast
        return w2 @ x2.T

    np.testing.assert_array_equal(checked(run, (P(), P(AXIS)), P(None, AXIS))(W, X), W @ X.T)


def test_outside_a_shard_map_nothing_is_traced_twice_under_jit_vmap_and_grad():
    traces = []

    def body(z):
        traces.append(1)
        return contraction(W, z, z)

    init = jnp.zeros(2)
    assert vma.match_carry(body, init) is init and not traces
    tree = {"a": jnp.ones(2)}
    assert vma.vary_alike(tree) is tree and vma.vary_over(tree, AXIS) is tree

    def solve(x):
        return vma.fori_loop(0, 5, lambda i, z: contraction(W, x, z), jnp.zeros(x.shape))

    def plain(x):
        return jax.lax.fori_loop(0, 5, lambda i, z: contraction(W, x, z), jnp.zeros(x.shape))

    np.testing.assert_array_equal(jax.jit(solve)(X), jax.jit(plain)(X))
    np.testing.assert_array_equal(jax.vmap(solve)(X), jax.vmap(plain)(X))
    np.testing.assert_array_equal(
        jax.grad(lambda x: jnp.sum(solve(x)))(X), jax.grad(lambda x: jnp.sum(plain(x)))(X)
    )
    jaxpr = str(jax.make_jaxpr(solve)(X))
    assert jaxpr == str(jax.make_jaxpr(plain)(X))  # the same program: no cast, no extra op


def test_the_jacobian_monitors_probe_a_map_that_varies_over_devices():
    """Probes drawn from a replicated key, fed to the VJP / JVP of a map of this device's
    examples (JR's Hutchinson term in the main job's step, the power method in its diagnostics):
    typed varying like the map, the same numbers and gradient as with no shard_map."""
    from deqjax import jacobian

    key = jax.random.key(0)

    def monitors(w, x):
        def frobenius(w):
            return jacobian.frobenius_sq(lambda z: contraction(w, x, z), x, key, num_samples=2)

        rho = jacobian.spectral_radius(lambda z: contraction(w, x, z), x, key, num_steps=5)
        return frobenius(w), rho, jax.grad(frobenius)(w)

    expected = monitors(W, X)

    def per_device(w, x):
        frob, rho, grad = monitors(vma.vary_over(w, AXIS), x)
        return jax.lax.psum((frob, rho, grad), AXIS)  # one device: the values themselves

    got = checked(per_device, (P(), P(AXIS)), (P(), P(), P()))(W, X)
    for g, e in zip(got, expected):  # float64; JAX 0.8 compiles it with one rounding more
        np.testing.assert_allclose(g, e, rtol=1e-13)
