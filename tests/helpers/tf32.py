"""A cell whose products behave like an NVIDIA GPU's at JAX's default precision, on any backend.

At JAX's default matmul precision a GPU multiplies float32 in TF32: each operand is rounded to
10 mantissa bits. :func:`tf32_cell` does that rounding itself (``jax.lax.reduce_precision``)
unless the matmul precision in force while it is traced is a full one, so the CPU reproduces the
GPU's numbers (the H200's relative residual floor of 3.6e-4 for a tanh layer at tol 1e-4) and the
tests of honest convergence run without a GPU. It reads the precision the way a GPU's products
do: ``precision="highest"`` on ``dq.fixed_point`` (or the ambient setting) makes it exact.
"""

from __future__ import annotations

import jax.numpy as jnp

from benchmarks.common import round_tf32 as tf32
from benchmarks.common import tanh_layer  # noqa: F401  (the loop-cost benchmark's problem)
from benchmarks.peers import per_example_rel_residual as rel_residual_f64  # noqa: F401


def tf32_cell(p, x, z):
    """``tanh(z Wᵀ + x Uᵀ + b)`` on a batch ``[B, d]``, its products TF32-rounded."""
    pre = tf32(z) @ tf32(p["W"]).T + tf32(x) @ tf32(p["U"]).T
    return jnp.tanh(pre + p["b"][None])
