"""Sizes, inputs and checks shared by the tests of the sequence cells (``dq.nn.TransformerCell``,
``dq.nn.TrellisCell``)."""

import functools

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np

import deqjax as dq
from deqjax.nn import DEQ, TransformerCell, TransformerInput, TrellisCell, TrellisInput

B, T, DX = 2, 5, 3
D, HEADS = 8, 2  # transformer width / heads
HS, K, DIL = 3, 2, 2  # trellis hidden size, kernel, dilation -> history P = 2, state 2H = 6
M = 3  # transformer memory length


def normal(seed, shape):
    return jax.random.normal(jax.random.PRNGKey(seed), shape, jnp.float64)


@functools.cache
def _cached(kind, items):
    kw = dict(items)
    if kind == "transformer":
        kw = {"num_heads": HEADS, "d_ff": 12, **kw}
        fn = lambda z, x: TransformerCell(D, **kw)(z, x, is_training=False)  # noqa: E731
    else:
        kw = {"kernel_size": K, "dilation": DIL, **kw}
        fn = lambda z, x: TrellisCell(HS, **kw)(z, x, is_training=False)  # noqa: E731
    # Eager on purpose: JAX caches each op per shape, so repeated small cells run in milliseconds
    # while every new jit costs seconds of compilation on our 2 cores.
    return hk.without_apply_rng(hk.transform(fn))


def transformer(**kw):
    """The transformer cell ``(z, x) -> z`` (width D, HEADS heads, d_ff 12), transformed."""
    return _cached("transformer", tuple(sorted(kw.items())))


def trellis(**kw):
    """The trellis cell (hidden HS, kernel K, dilation DIL), transformed."""
    return _cached("trellis", tuple(sorted(kw.items())))


# Larger-than-paper weights so that every part of the cell visibly matters in the tests.
BIG = {
    "w_init": hk.initializers.RandomNormal(0.5),
    "inject_w_init": hk.initializers.RandomNormal(1.0),
}


def transformer_inputs(with_mems):
    x = normal(1, (B, T, DX))
    return TransformerInput(x, normal(2, (B, M, D)) if with_mems else None), normal(3, (B, T, D))


def trellis_inputs(with_history):
    x = normal(4, (B, T, DX))
    if with_history:
        x = TrellisInput(x, normal(5, (B, K * DIL - DIL, 2 * HS)), normal(6, (B, DIL, DX)))
    return x, normal(7, (B, T, 2 * HS))


def check_weight_norm_invariance(f, x, z, num_normed):
    """Rescaling every weight-normalised ``v`` leaves the output unchanged."""
    params = f.init(jax.random.PRNGKey(0), z, x)
    scaled = {
        mod: ({"v": 3.0 * p["v"], "g": p["g"]} if set(p) == {"v", "g"} else p)
        for mod, p in params.items()
    }
    assert sum(set(p) == {"v", "g"} for p in params.values()) == num_normed
    np.testing.assert_allclose(f.apply(scaled, z, x), f.apply(params, z, x), rtol=1e-12)


def check_causal(apply, z, x_array, rebuild, t0):
    """Changing z and x at positions > t0 leaves outputs <= t0 unchanged; changing them at t0
    changes output t0."""
    base = apply(z, rebuild(x_array))
    z2 = z.at[:, t0 + 1 :].add(1.0)
    x2 = x_array.at[:, t0 + 1 :].add(1.0)
    after = apply(z2, rebuild(x2))
    np.testing.assert_allclose(after[:, : t0 + 1], base[:, : t0 + 1], rtol=1e-12, atol=1e-12)
    assert np.max(np.abs(after[:, t0 + 1 :] - base[:, t0 + 1 :])) > 1e-3
    now = apply(z.at[:, t0].add(1.0), rebuild(x_array.at[:, t0].add(1.0)))
    assert np.max(np.abs(now[:, t0] - base[:, t0])) > 1e-3


FAMILIES = {
    "gaussian": dq.initializers.Gaussian(0.8),
    "orthogonal": dq.initializers.HaarOrthogonal(0.8),
    "goe": dq.initializers.GOE(0.8),
    "haiku": hk.initializers.VarianceScaling(1.0),
}


def check_family(w, family):
    """``w`` (square) drawn from ``FAMILIES[family]`` at scale 0.8."""
    n = w.shape[0]
    if family == "goe":
        np.testing.assert_allclose(w, w.T, atol=1e-14)
    if family == "orthogonal":
        np.testing.assert_allclose(w @ w.T, 0.64 * np.eye(n), atol=1e-12)
    if family != "haiku":  # the (1/n) tr(W Wᵀ) = scale² convention, loosely at n = 3..8
        assert 0.05 < np.trace(w @ w.T) / n < 4.0


SOLVER = functools.partial(dq.solvers.broyden, max_steps=60, tol=1e-12, stop_mode="abs")


def check_deq_gradient_and_fixed_masks(make_cell, x, compare_unrolled):
    """In a DEQ with dropout: the solve converges to a fixed point of this pass's cell (masks not
    redrawn between iterations), a fresh key gives another equilibrium, and the implicit
    gradient matches backprop through every solver step."""

    def forward(x, adjoint):
        out = DEQ(make_cell(), solver=SOLVER, adjoint=adjoint, per_example=False).solve(
            x, is_training=True
        )
        residual = jnp.max(jnp.abs(out.cell_fn(out.z_star) - out.z_star))
        return out.z_star, out.solution, residual

    grads = {}
    params = None
    adjoints = {"implicit": dq.ImplicitAdjoint(), "unrolled": dq.UnrolledAdjoint(accelerated=True)}
    if not compare_unrolled:
        del adjoints["unrolled"]
    for name, adjoint in adjoints.items():
        f = hk.transform(functools.partial(forward, adjoint=adjoint))
        if params is None:  # the same parameters for both adjoints
            params = jax.jit(f.init)(jax.random.PRNGKey(0), x)

        def loss(params, x, key, f=f):
            z, sol, res = f.apply(params, key, x)
            return jnp.sum(jnp.sin(z)), (z, sol, res)

        grad_fn = jax.jit(jax.value_and_grad(loss, has_aux=True))
        (_, (z, sol, res)), g = grad_fn(params, x, jax.random.PRNGKey(1))
        assert int(sol.status) == dq.solvers.CONVERGED and float(sol.abs_residual) < 1e-10
        # The solver converged to 1e-12 and z* is a fixed point of this forward pass's cell (its
        # dropout masks): masks were not redrawn between iterations.
        assert float(res) < 1e-10
        grads[name] = g
        if name == "implicit":  # a fresh key draws fresh masks: another equilibrium
            (_, (z_other, sol_other, res_other)), _ = grad_fn(params, x, jax.random.PRNGKey(2))
            assert float(res_other) < 1e-10 and np.max(np.abs(z_other - z)) > 1e-3
    if not compare_unrolled:
        return
    flat_i = jax.tree_util.tree_leaves(grads["implicit"])
    flat_u = jax.tree_util.tree_leaves(grads["unrolled"])
    scale = max(float(jnp.max(jnp.abs(u))) for u in flat_u)
    assert scale > 1e-3
    for a, b in zip(flat_i, flat_u):
        np.testing.assert_allclose(a, b, atol=1e-7 * scale)


def check_dropout_only_when_training(make_cell, x, z):
    f = hk.transform(lambda z, x, is_training: make_cell()(z, x, is_training=is_training))
    apply = f.apply
    params = f.init(jax.random.PRNGKey(0), z, x, True)
    keys = jax.random.PRNGKey(1), jax.random.PRNGKey(2)
    train = [apply(params, k, z, x, True) for k in keys]
    evals = [apply(params, k, z, x, False) for k in keys]
    assert np.max(np.abs(train[0] - train[1])) > 1e-3  # a fresh mask per forward
    np.testing.assert_array_equal(evals[0], evals[1])
    assert np.max(np.abs(train[0] - evals[0])) > 1e-3
