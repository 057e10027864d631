"""XLA temporary memory of jit(grad) for the implicit adjoint: batch-native vs whole-batch vs vmap.

    python -m benchmarks.backward_memory

f(z) = tanh(W z + U x + b), d=512, batch 128, float32, Anderson tol 1e-4 rel, max 50 steps.
"""

import functools

import jax
import jax.numpy as jnp

import deqjax as dq
from benchmarks.common import tanh_layer

d, b = 512, 128
p, x = tanh_layer(d, b, radius=1.0)


def batch_cell(p, x, z):
    return jnp.tanh(z @ p["W"].T + x @ p["U"].T + p["b"])


def one_cell(p, x, z):
    return jnp.tanh(p["W"] @ z + p["U"] @ x + p["b"])


def make(bn):
    s = functools.partial(dq.solvers.anderson, tol=1e-4, max_steps=50, batch_ndim=bn)
    return lambda p: jnp.sum(dq.fixed_point(batch_cell, p, x, jnp.zeros_like(x), solver=s)[0] ** 2)


def vm(p):
    s = functools.partial(dq.solvers.anderson, tol=1e-4, max_steps=50)
    return jnp.sum(
        jax.vmap(
            lambda xi: jnp.sum(
                dq.fixed_point(one_cell, p, xi, jnp.zeros_like(xi), solver=s)[0] ** 2
            )
        )(x)
    )


print("| forward + implicit backward | XLA temp memory (MiB) |")
print("| --- | ---: |")
for name, fn in (
    ("batch-native (batch_ndim=1)", make(1)),
    ("whole-batch (one problem)", make(0)),
    ("vmap per-example", vm),
):
    m = jax.jit(jax.grad(fn)).lower(p).compile().memory_analysis().temp_size_in_bytes / 2**20
    print(f"| {name} | {m:.1f} |", flush=True)
