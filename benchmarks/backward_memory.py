"""XLA temporary memory of jit(grad) for the implicit adjoint: batch-native vs whole-batch vs vmap.

    python -m benchmarks.backward_memory

f(z) = tanh(W z + U x + b), d=512, batch 128, float32, Anderson tol 1e-4 rel, max 50 steps.
"""

import functools

import jax
import jax.numpy as jnp

import deqjax as dq
from benchmarks.common import markdown_header, markdown_row, tanh_layer

D, B = 512, 128
STEPS = 50


def batch_cell(p, x, z):
    """The whole batch: z, x of shape [B, d]."""
    return jnp.tanh(z @ p["W"].T + x @ p["U"].T + p["b"])


def one_cell(p, x, z):
    """One example: z, x of shape [d]."""
    return jnp.tanh(p["W"] @ z + p["U"] @ x + p["b"])


def losses(x):
    """The three losses whose gradient is compiled: batch-native, whole-batch, vmap."""

    def batch(batch_ndim):
        s = functools.partial(dq.solvers.anderson, tol=1e-4, max_steps=STEPS, batch_ndim=batch_ndim)
        return lambda p: jnp.sum(
            dq.fixed_point(batch_cell, p, x, jnp.zeros_like(x), solver=s)[0] ** 2
        )

    def vmapped(p):
        s = functools.partial(dq.solvers.anderson, tol=1e-4, max_steps=STEPS)

        def one(xi):
            return jnp.sum(dq.fixed_point(one_cell, p, xi, jnp.zeros_like(xi), solver=s)[0] ** 2)

        return jnp.sum(jax.vmap(one)(x))

    return {
        "batch-native (batch_ndim=1)": batch(1),
        "whole-batch (one problem)": batch(0),
        "vmap per-example": vmapped,
    }


def main() -> str:
    p, x = tanh_layer(D, B, radius=1.0)
    lines = markdown_header(["forward + implicit backward", "XLA temp memory (MiB)"], "lr")
    for name, fn in losses(x).items():
        compiled = jax.jit(jax.grad(fn)).lower(p).compile()
        mib = compiled.memory_analysis().temp_size_in_bytes / 2**20
        lines.append(markdown_row([name, mib], ["", ".1f"]))
        print(lines[-1], flush=True)
    return "\n".join(lines)


if __name__ == "__main__":
    main()
