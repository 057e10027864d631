"""Test-wide JAX configuration: float64 available, strict dtype promotion, full-precision
matmuls.

Tests that need float32 say so explicitly; code under test must not rely on implicit promotion.
Matrix products are pinned to full precision ("highest"): on a CPU that is what float32 products
are anyway, and on a GPU it keeps the float32 tolerances of the suite meaningful (JAX's GPU
default, TF32-class products, carries ~1e-3 relative error per product). Tests of the
precision setting itself set the ambient precision they need (tests/test_precision.py).
"""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=true")

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)
jax.config.update("jax_numpy_dtype_promotion", "strict")
jax.config.update("jax_numpy_rank_promotion", "raise")
jax.config.update("jax_default_matmul_precision", "highest")
