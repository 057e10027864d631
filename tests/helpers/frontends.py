"""The Haiku reference of the front-end tests: ``dq.nn.DEQ`` around ``dq.nn.MLPCell`` or
``dq.nn.TransformerCell``, its parameters as the front-end cells' nested dict, and its outputs,
gradients and backward statistics (float64)."""

import functools

import haiku as hk
import jax
import jax.numpy as jnp

import deqjax as dq

B, DX, D, T, M, HEADS = 3, 5, 4, 3, 2, 2
TOL = 1e-12
SOLVER = dq.solvers.Anderson(tol=TOL, max_steps=60)
BACKWARD = dq.ImplicitAdjoint(solver=dq.solvers.Anderson(tol=TOL, max_steps=60))


def not_batch_native(f, z0):
    """A user's solver without ``batch_ndim``: the per-example mode vmaps it."""
    return dq.solvers.anderson(f, z0, tol=TOL, max_steps=60)


MODES = {"batch_native": SOLVER, "vmap": not_batch_native}
CELLS = ("mlp", "transformer")


def haiku_cell(kind):
    if kind == "mlp":
        return dq.nn.MLPCell(w_init=dq.initializers.HaarOrthogonal(0.7), weight_norm=True)
    # Stronger attention and injection than the paper's N(0, 0.01): a cell the solver converges on.
    normal = hk.initializers.RandomNormal
    return dq.nn.TransformerCell(
        D, num_heads=HEADS, d_ff=6, attn_w_init=normal(0.3), inject_w_init=normal(1.0)
    )


def inputs(kind, seed=0):
    """``x`` of the cell: ``[B, DX]`` (MLP), ``TransformerInput([B, T, DX], mems [B, M, D])``."""
    k1, k2 = jax.random.split(jax.random.PRNGKey(seed))
    if kind == "mlp":
        return jax.random.normal(k1, (B, DX), jnp.float64)
    x = jax.random.normal(k1, (B, T, DX), jnp.float64)
    mems = jax.random.normal(k2, (B, M, D), jnp.float64)
    return dq.nn.TransformerInput(x, mems)


def loss_of(z):
    """A loss whose gradient weights every coordinate of ``z*`` differently."""
    w = jnp.arange(1, z.size + 1, dtype=z.dtype).reshape(z.shape) / z.size
    return jnp.sum(jnp.sin(z) * w)


def _haiku_model(kind, solver):
    def forward(x, probe):
        init_state = (lambda x_: jnp.zeros((x_.shape[0], D), x_.dtype)) if kind == "mlp" else None
        deq = dq.nn.DEQ(haiku_cell(kind), solver=solver, adjoint=BACKWARD, init_state=init_state)
        out = deq.solve(x, backward_stats=probe)
        return out.z_star, out.solution

    return hk.without_apply_rng(hk.transform(forward))


@functools.cache
def haiku_reference(kind, mode):
    """``(params, nested, z_star, sol, grads, stats)`` of the Haiku DEQ, grads as nested dicts."""
    model = _haiku_model(kind, MODES[mode])
    x = inputs(kind)
    params = model.init(jax.random.PRNGKey(1), x, None)
    z_star, sol = model.apply(params, x, None)

    def loss(params, probe):
        return loss_of(model.apply(params, x, probe)[0])

    grads, stats = jax.grad(loss, argnums=(0, 1))(params, dq.BackwardStats.zeros())
    return params, nested(params), z_star, sol, nested(grads), stats


def nested(params):
    """Haiku's ``{"deq/lifted/cell": {...}, "deq/lifted/cell/sub": {...}}`` as the front-end
    cells' ``{..., "sub": {...}}``."""
    prefix = min(params, key=len)
    out = dict(params[prefix])
    for name, values in params.items():
        if name != prefix:
            out[name[len(prefix) + 1 :]] = dict(values)
    return out
