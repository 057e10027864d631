"""Tiny DEQ cells and inputs shared by the tests of ``dq.nn.DEQ`` and its batching modes."""

import functools

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np

import deqjax as dq
from deqjax import nn

B, D, DX = 3, 4, 5
MAX_STEPS = 80
SOLVER = functools.partial(dq.solvers.fixed_point_iteration, tol=1e-12, max_steps=MAX_STEPS)
RATE = 0.3


class TinyCell(hk.Module):
    """f(z; x) = m ⊙ tanh(z W + U x): W weight-normalised; U x and the mask m once per forward."""

    def __init__(self, record=None, name=None):
        super().__init__(name=name)
        self.record = record

    def __call__(self, z, x, *, is_training=False):
        w = nn.WeightNorm([D, D], w_init=hk.initializers.RandomNormal(0.4 / D**0.5))(z.dtype)
        u = nn.per_forward(
            "inj", lambda: x @ hk.get_parameter("U", [DX, D], z.dtype, init=jnp.ones)
        )
        drop = nn.VariationalDropout(RATE, name="drop")
        if self.record is not None:  # the mask this evaluation uses, seen through a ones probe
            jax.debug.callback(self.record, drop(jnp.ones_like(z), is_training=is_training))
        return drop(jnp.tanh(z @ w + u), is_training=is_training)  # [B, D]


def inputs(seed=0, b=B):
    return jax.random.normal(jax.random.PRNGKey(seed), (b, DX), jnp.float64)


def spread_inputs(b=5):
    """Inputs whose examples need different numbers of steps (different saturation)."""
    scale = jnp.array([0.05, 0.5, 1.0, 3.0, 10.0][:b], jnp.float64)[:, None]
    return inputs(seed=7, b=b) * scale


def rel_err(a, b):
    la, lb = jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)
    num = max(float(jnp.max(jnp.abs(u - v))) for u, v in zip(la, lb))
    return num / max(float(jnp.max(jnp.abs(v))) for v in lb)


def zeros_state(x):
    return jnp.zeros((x.shape[0], D), x.dtype)


def np_init(scale, seed=0):
    """A deterministic initializer (numpy draws, constant-folded: cheap to compile)."""
    rng = np.random.default_rng(seed)

    def init(shape, dtype):
        fan_in = int(np.prod(shape[:-1])) if len(shape) > 1 else 1
        return jnp.asarray(rng.normal(size=shape) * scale / np.sqrt(fan_in), dtype)

    return init


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
