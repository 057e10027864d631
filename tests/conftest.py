"""Test-wide JAX configuration: float64 available, strict dtype promotion.

Tests that need float32 say so explicitly; code under test must not rely on implicit promotion.
"""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=true")

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)
jax.config.update("jax_numpy_dtype_promotion", "strict")
jax.config.update("jax_numpy_rank_promotion", "raise")
