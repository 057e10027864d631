"""dq.nn.MultiscaleCell.

Compiling Haiku random initialisers is slow on CPU (about a second per draw), so most tests use a
numpy-seeded initializer; the w_init tests exercise the real families.
"""

import functools

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import deqjax as dq
from deqjax import initializers, nn
from tests.helpers.deq_cells import deq_grads, np_init, rel_err

B = 2


@pytest.mark.slow  # ~10 s of XLA compile on 2 CPU cores
def test_multiscale_state_shapes_per_resolution_in_a_deq():
    x = jax.random.normal(jax.random.PRNGKey(0), (B, 8, 8, 4), jnp.float64)

    def forward(x):
        cell = nn.MultiscaleCell(
            (4, 6, 8), num_groups=2, expansion=2, w_init=np_init(1.0), dropout_rate=0.1
        )
        solver = functools.partial(dq.solvers.fixed_point_iteration, max_steps=4)
        return nn.DEQ(cell, solver=solver)(x)

    t = hk.transform(forward)
    params = jax.jit(t.init)(jax.random.PRNGKey(0), x)
    names = set(params)
    for i in range(3):
        assert f"deq/lifted/multiscale_cell/block{i}/conv1" in names
    assert "deq/lifted/multiscale_cell/fuse2/down0_conv1" in names  # two strided convs 0 -> 2
    assert "deq/lifted/multiscale_cell/fuse0/up2_conv" in names
    assert params["deq/lifted/multiscale_cell/block1/conv1"]["v"].shape == (3, 3, 6, 12)
    z, sol = jax.jit(t.apply)(params, jax.random.PRNGKey(1), x)
    assert isinstance(z, tuple)
    assert [a.shape for a in z] == [(B, 8, 8, 4), (B, 4, 4, 6), (B, 2, 2, 8)]
    assert all(a.dtype == jnp.float64 for a in z)
    assert sol.num_steps.shape == (B,) and int(jnp.min(sol.num_steps)) >= 1
    assert all(bool(jnp.all(jnp.isfinite(a))) for a in z)


@pytest.mark.slow  # ~20-30 s of XLA compile on 2 CPU cores
def test_multiscale_deq_gradients_match_unrolled_when_converged():
    """MDEQ with weight norm and dropout on; a large GroupNorm epsilon makes the map a strong
    contraction, so both gradients are those of a converged fixed point."""
    x = jax.random.normal(jax.random.PRNGKey(1), (B, 4, 4, 4), jnp.float64)
    solver = functools.partial(dq.solvers.fixed_point_iteration, tol=1e-12, max_steps=60)

    def make_cell():
        return nn.MultiscaleCell(
            (4, 4), num_groups=2, expansion=1, w_init=np_init(1.0), dropout_rate=0.2, norm_eps=3.0
        )

    key = jax.random.PRNGKey(2)
    g_imp, sol = deq_grads(make_cell, x, dq.ImplicitAdjoint(), key, solver)
    g_unr, _ = deq_grads(make_cell, x, dq.UnrolledAdjoint(), key, solver)
    assert np.all(np.asarray(sol.status) == dq.solvers.CONVERGED)
    assert rel_err(g_imp, g_unr) < 1e-7
    conv = g_imp[0]["deq/lifted/multiscale_cell/fuse1/down0_conv0"]
    assert float(jnp.max(jnp.abs(conv["v"]))) > 0 and float(jnp.max(jnp.abs(conv["g"]))) > 0


@pytest.mark.parametrize(
    "w_init",
    [initializers.Gaussian(1.0), initializers.HaarOrthogonal(1.0), None],
    ids=["gaussian", "haar_orthogonal", "default"],
)
def test_multiscale_accepts_w_init_families(w_init):
    x = jnp.ones((1, 2, 2, 2), jnp.float64)

    def f(x):
        cell = nn.MultiscaleCell((2,), num_groups=1, expansion=1, w_init=w_init, weight_norm=False)
        return cell(cell.initial_state(x), x)

    t = hk.transform(f)
    params = jax.jit(t.init)(jax.random.PRNGKey(0), x)
    k = params["multiscale_cell/block0"]["conv1"]
    assert k.shape == (3, 3, 2, 2) and bool(jnp.all(jnp.isfinite(k)))
    if w_init is None:  # JR App. A.4: N(0, 0.01²)
        assert float(jnp.max(jnp.abs(k))) < 0.1


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(channels=(6, 12), num_groups=4), "num_groups"),
        (dict(channels=()), "channels"),
        (dict(channels=(4, 0)), "channels"),
        (dict(num_groups=0), "num_groups"),
        (dict(expansion=0), "expansion"),
        (dict(w_init="normal"), "w_init"),
        (dict(activation=1), "activation"),
        (dict(dropout_rate=-0.1), "rate"),
        (dict(norm_eps=0.0), "norm_eps"),
    ],
)
def test_multiscale_bad_configuration_raises(kw, match):
    with pytest.raises(ValueError, match=match):
        hk.transform(lambda: nn.MultiscaleCell(**kw)).init(None)


def test_multiscale_bad_input_shapes_raise():
    def f(x):
        cell = nn.MultiscaleCell((4, 8), num_groups=2, w_init=np_init(1.0))
        return cell.initial_state(x)

    with pytest.raises(ValueError, match="divisible"):
        hk.transform(f).init(None, jnp.zeros((1, 5, 4, 4)))
    with pytest.raises(ValueError, match="channels"):
        hk.transform(f).init(None, jnp.zeros((1, 4, 4, 3)))
