"""Test-wide JAX configuration: float64 available, strict dtype promotion, full-precision
matmuls.

Tests that need float32 say so explicitly; code under test must not rely on implicit promotion.
Matrix products are pinned to full precision ("highest"): on a CPU that is what float32 products
are anyway, and on a GPU it keeps the float32 tolerances of the suite meaningful (JAX's GPU
default, TF32-class products, carries ~1e-3 relative error per product). Tests of the
precision setting itself run at the user's default (the ``users_default_precision`` fixture) or
set the ambient precision they need (tests/test_precision.py, tests/solvers/test_verify.py).
"""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=true")

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)
jax.config.update("jax_numpy_dtype_promotion", "strict")
jax.config.update("jax_numpy_rank_promotion", "raise")
jax.config.update("jax_default_matmul_precision", "highest")


import pytest  # noqa: E402


@pytest.fixture
def users_default_precision():
    """JAX's own default matmul precision (``None``) for one test, as a user has it: the suite
    pins "highest" above, under which a precision test could not fail."""
    pinned = jax.config.jax_default_matmul_precision
    jax.config.update("jax_default_matmul_precision", None)
    try:
        yield
    finally:
        jax.config.update("jax_default_matmul_precision", pinned)
