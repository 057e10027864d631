"""BackwardStats, the gradient channel: statistics of the backward pass as a probe's cotangent."""

import functools

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import deqjax as dq
from tests.helpers.dense_ift import flip_problem, loss_of_z, rel_err, tanh_cell

D = 6
FWD = functools.partial(dq.solvers.broyden, tol=1e-13, max_steps=200, stop_mode="abs")
SHORT_FPI = functools.partial(
    dq.solvers.fixed_point_iteration, tol=1e-10, max_steps=30, stop_mode="abs"
)


@pytest.mark.slow
def test_backward_stats_sum_over_vmap_and_scan_and_match_per_example():
    p, _ = flip_problem(seed=4, lam=-0.9)
    xs = (
        jnp.asarray(np.random.default_rng(5).normal(size=(5, D)))
        * jnp.array([0.01, 0.1, 1.0, 3.0, 10.0])[:, None]
    )
    adjoint = dq.ImplicitAdjoint(solver=SHORT_FPI)

    def loss(p, x, probe):
        z, _ = dq.fixed_point(
            tanh_cell, p, x, jnp.zeros(D), solver=FWD, adjoint=adjoint, backward_stats=probe
        )
        return loss_of_z(z)

    def batch_loss(p, probe):
        return jnp.sum(jax.vmap(loss, in_axes=(None, 0, None))(p, xs, probe))

    probe = dq.BackwardStats.zeros()
    g_b, stats_b = jax.jit(jax.grad(batch_loss, argnums=(0, 1)))(p, probe)
    singles = [jax.jit(jax.grad(loss, argnums=(0, 2)))(p, xs[i], probe) for i in range(5)]
    assert float(stats_b.count) == 5
    for field in dq.BackwardStats._fields:
        total = sum(float(getattr(s, field)) for _, s in singles)
        np.testing.assert_allclose(float(getattr(stats_b, field)), total, rtol=1e-5, atol=1e-9)
    g_sum = jax.tree_util.tree_map(lambda *a: sum(a), *[g for g, _ in singles])
    assert rel_err(g_b, g_sum) < 1e-10

    def scanned(p, probe):
        return jax.lax.scan(lambda c, x: (c + loss(p, x, probe), None), 0.0, xs)[0]

    _, stats_s = jax.jit(jax.grad(scanned, argnums=(0, 1)))(p, probe)
    assert float(stats_s.count) == 5
    np.testing.assert_allclose(float(stats_s.num_steps), float(stats_b.num_steps))

    # Other gradient strategies run no backward solve: zeros.
    def phantom(p, probe):
        z, _ = dq.fixed_point(
            tanh_cell,
            p,
            xs[0],
            jnp.zeros(D),
            solver=FWD,
            adjoint=dq.PhantomAdjoint(),
            backward_stats=probe,
        )
        return loss_of_z(z)

    _, stats_p = jax.grad(phantom, argnums=(0, 1))(p, probe)
    assert all(float(v) == 0.0 for v in stats_p)


def test_backward_stats_do_not_change_the_gradient_and_probe_dtype_is_kept():
    p, x = flip_problem(seed=6)

    def loss(p, probe):
        kw = {} if probe is None else {"backward_stats": probe}
        z, _ = dq.fixed_point(tanh_cell, p, x, jnp.zeros(D), solver=FWD, **kw)
        return loss_of_z(z)

    g0 = jax.grad(loss)(p, None)
    g1, stats = jax.grad(loss, argnums=(0, 1))(p, dq.BackwardStats.zeros(jnp.float64))
    assert rel_err(g1, g0) == 0.0
    assert stats.count.dtype == jnp.float64


def test_deq_module_backward_stats_probe():
    d, dx, b = 4, 3, 5

    def forward(x, probe):
        cell = lambda z, x: jnp.tanh(hk.Linear(d, name="w")(z) + hk.Linear(d, name="u")(x))  # noqa: E731
        deq = dq.nn.DEQ(
            cell,
            solver=functools.partial(dq.solvers.anderson, tol=1e-10),
            init_state=lambda x: jnp.zeros((x.shape[0], d), x.dtype),
        )
        z, _ = deq(x, backward_stats=probe)
        return jnp.sum(z**2)

    t = hk.without_apply_rng(hk.transform(forward))
    x = jax.random.normal(jax.random.PRNGKey(0), (b, dx), jnp.float64)
    probe = dq.BackwardStats.zeros()
    params = t.init(jax.random.PRNGKey(1), x, probe)
    _, stats = jax.jit(jax.grad(t.apply, argnums=(0, 2)))(params, x, probe)
    assert float(stats.count) == b and float(stats.failures) == 0
    assert float(stats.num_steps) >= b


def test_train_step_logs_backward_stats():
    from deqjax import training

    p, _ = flip_problem(seed=8)
    xs = jnp.asarray(np.random.default_rng(9).normal(size=(4, D)))
    adjoint = dq.ImplicitAdjoint(solver=SHORT_FPI)

    def loss_fn(params, batch, key, reg_state, step, probe):
        def one(x):
            z, _ = dq.fixed_point(
                tanh_cell,
                params,
                x,
                jnp.zeros(D),
                solver=FWD,
                adjoint=adjoint,
                backward_stats=probe,
            )
            return loss_of_z(z)

        return jnp.mean(jax.vmap(one)(batch)), {}

    opt = optax.sgd(1e-3)
    devices = jax.local_devices()[:1]
    pair = training.train_step(loss_fn, opt, backward_stats=True)
    step_fn = jax.pmap(pair.update, axis_name="batch", devices=devices)
    state = training.replicate(pair.init(p, jax.random.PRNGKey(0)), devices)
    _, metrics = step_fn(state, training.shard(xs, devices))
    m = training.unreplicate(metrics)
    assert {"bwd_steps", "bwd_rel_residual", "bwd_failure_rate", "bwd_fallback_rate"} <= set(m)
    assert float(m["bwd_fallback_rate"]) > 0.0 and float(m["bwd_failure_rate"]) == 0.0
    assert float(m["bwd_steps"]) > 30 and float(m["bwd_rel_residual"]) < 1e-9


def test_probe_is_zeros_of_a_float_dtype_and_metrics_are_means_per_solve():
    probe = dq.BackwardStats.zeros(jnp.float64)
    assert all(v.dtype == jnp.float64 and float(v) == 0.0 for v in probe)
    assert all(float(v) == 0.0 for v in probe.metrics().values())  # no solve: zeros, no NaN
    with pytest.raises(ValueError, match="float dtype"):
        dq.BackwardStats.zeros(jnp.int32)
    stats = dq.BackwardStats(*(jnp.asarray(v) for v in (4.0, 40.0, 2e-3, 1.0, 2.0)))
    m = stats.metrics(prefix="b_")
    assert set(m) == {"b_steps", "b_rel_residual", "b_failure_rate", "b_fallback_rate"}
    np.testing.assert_allclose(
        [m["b_steps"], m["b_failure_rate"], m["b_fallback_rate"]], [10.0, 0.25, 0.5]
    )
