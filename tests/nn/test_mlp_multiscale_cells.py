"""dq.nn.MLPCell and dq.nn.MultiscaleCell (issue 6, part A).

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

B, D, DX = 2, 6, 5


def np_init(scale, seed=0):
    """A deterministic initializer (numpy draws, constant-folded: cheap to compile)."""
    rng = np.random.default_rng(seed)

    def init(shape, dtype):
        fan_in = int(np.prod(shape[:-1])) if len(shape) > 1 else 1
        return jnp.asarray(rng.normal(size=shape) * scale / np.sqrt(fan_in), dtype)

    return init


def rel_err(a, b):
    la, lb = jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)
    num = max(float(jnp.max(jnp.abs(u - v))) for u, v in zip(la, lb))
    return num / max(float(jnp.max(jnp.abs(v))) for v in lb)


def deq_grads(make_cell, x, adjoint, key, solver):
    """Gradients of a loss of z* w.r.t. (params, x) for a DEQ around make_cell()."""

    def forward(x):
        return nn.DEQ(make_cell(), solver=solver, adjoint=adjoint)(x)

    t = hk.transform(forward)
    params = jax.jit(t.init)(jax.random.PRNGKey(0), x)

    def loss(p, x):
        z, sol = t.apply(p, key, x)
        leaves = jax.tree_util.tree_leaves(z)
        return sum(jnp.sum(jnp.sin(a)) + 0.5 * jnp.sum(a**2) for a in leaves), sol

    return jax.jit(jax.grad(loss, argnums=(0, 1), has_aux=True))(params, x)


# --------------------------------------------------------------------------------------------
# MLPCell


def test_mlp_forms_shapes_and_jr_tiny_layer_has_200_parameters():
    x = jax.random.normal(jax.random.PRNGKey(0), (B, DX), jnp.float64)
    z = jnp.zeros((B, D), jnp.float64)

    def f(z, x):
        kw = dict(w_init=np_init(0.5), u_init=np_init(1.0, 1))
        return {
            "resnet": nn.MLPCell(10, **kw, name="resnet")(z, x),
            "single": nn.MLPCell(form="single", **kw, name="single")(z, x),
            "two_layer": nn.MLPCell(7, form="two_layer", **kw, name="two_layer")(z, x),
        }

    t = hk.transform(f)
    params = t.init(None, z, x)
    out = t.apply(params, None, z, x)
    assert all(v.shape == (B, D) and v.dtype == jnp.float64 for v in out.values())
    assert params["resnet"]["U"].shape == (DX, D) and params["resnet"]["W1"].shape == (D, 10)
    assert params["two_layer"]["U"].shape == (DX, 7)
    # "resnet" output is layer-normalised: zero mean, unit variance per example
    np.testing.assert_allclose(jnp.mean(out["resnet"], -1), 0.0, atol=1e-12)
    # JR paper §5.1: f(z; x) = W2ᵀ ReLU(W1 z + U x + b), W1, W2, U ∈ R^{50×1}: 200 parameters
    tiny = hk.transform(lambda z, x: nn.MLPCell(50, form="two_layer", w_init=np_init(1.0))(z, x))
    p = tiny.init(jax.random.PRNGKey(0), jnp.zeros((B, 1)), jnp.zeros((B, 1)))
    assert sum(a.size for a in jax.tree_util.tree_leaves(p)) == 200


@pytest.mark.parametrize(
    "w_init",
    [
        initializers.Gaussian(0.8),
        initializers.HaarOrthogonal(0.8),
        initializers.GOE(0.4),
        hk.initializers.TruncatedNormal(0.3),
    ],
    ids=["gaussian", "haar_orthogonal", "goe", "haiku_truncated_normal"],
)
def test_mlp_accepts_every_w_init_family(w_init):
    z, x = jnp.zeros((B, D), jnp.float64), jnp.ones((B, DX), jnp.float64)
    t = hk.transform(
        lambda z, x: nn.MLPCell(form="single", w_init=w_init, u_init=np_init(1.0))(z, x)
    )
    w = t.init(jax.random.PRNGKey(0), z, x)["mlp_cell"]["W"]
    assert w.shape == (D, D) and bool(jnp.all(jnp.isfinite(w)))
    if isinstance(w_init, initializers.GOE):
        np.testing.assert_array_equal(w, w.T)
    if isinstance(w_init, initializers.HaarOrthogonal):
        np.testing.assert_allclose(w.T @ w, 0.64 * jnp.eye(D), atol=1e-12)


def test_mlp_deq_gradients_match_unrolled_with_weight_norm_and_dropout():
    x = jax.random.normal(jax.random.PRNGKey(1), (B, DX), jnp.float64)
    solver = functools.partial(dq.solvers.fixed_point_iteration, tol=1e-12, max_steps=80)

    def make_cell():
        return nn.MLPCell(
            8,
            form="two_layer",
            activation=jnp.tanh,
            w_init=np_init(0.5),
            u_init=np_init(1.0, 1),
            weight_norm=True,
            dropout_rate=0.2,
        )

    def run(adjoint):
        # z0 = zeros [B, D]: the two-layer cell maps D -> D; give the state width via init_state.
        def forward(x):
            deq = nn.DEQ(
                make_cell(),
                solver=solver,
                adjoint=adjoint,
                init_state=lambda x: jnp.zeros((x.shape[0], D), x.dtype),
            )
            return deq(x)

        t = hk.transform(forward)
        params = jax.jit(t.init)(jax.random.PRNGKey(0), x)

        def loss(p, x):
            z, sol = t.apply(p, jax.random.PRNGKey(7), x)
            return jnp.sum(jnp.sin(z)) + 0.5 * jnp.sum(z**2), sol

        return jax.jit(jax.grad(loss, argnums=(0, 1), has_aux=True))(params, x)

    (g_imp, sol), (g_unr, _) = run(dq.ImplicitAdjoint()), run(dq.UnrolledAdjoint())
    assert np.all(np.asarray(sol.status) == dq.solvers.CONVERGED)
    assert rel_err(g_imp, g_unr) < 1e-8
    assert set(g_imp[0]["deq/lifted/mlp_cell/W1"]) == {"g", "v"}


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(form="conv"), "form"),
        (dict(form="single", hidden_size=4), "hidden_size"),
        (dict(hidden_size=0), "hidden_size"),
        (dict(hidden_size=2.5), "hidden_size"),
        (dict(activation=None), "activation"),
        (dict(w_init="orthogonal"), "w_init"),
        (dict(u_init=3), "u_init"),
        (dict(dropout_rate=1.5), "rate"),
    ],
)
def test_mlp_bad_configuration_raises(kw, match):
    with pytest.raises(ValueError, match=match):
        hk.transform(lambda: nn.MLPCell(**kw)).init(None)


# --------------------------------------------------------------------------------------------
# MultiscaleCell


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
