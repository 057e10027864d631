"""Test-wide JAX configuration: float64 available, strict dtype promotion, full-precision
matmuls.

Tests that need float32 say so explicitly; code under test must not rely on implicit promotion.
Matrix products are pinned to full precision ("highest"): on a CPU that is what float32 products
are anyway, and on a GPU it keeps the float32 tolerances of the suite meaningful (JAX's GPU
default, TF32-class products, carries ~1e-3 relative error per product). Tests of the
precision setting itself run at the user's default (the ``users_default_precision`` fixture) or
set the ambient precision they need (tests/test_precision.py, tests/solvers/test_verify.py).

The experiment runner's compilation cache (``~/.cache/deqjax/jax`` for a user) is a temporary
folder for the session (``DEQJAX_COMPILATION_CACHE_DIR``, made by the first process of a
session, inherited by pytest-xdist's workers and by every subprocess a test starts, deleted at
the end): the suite writes nothing into the home folder's cache and reads nothing from it.
"""

import os
import shutil
import tempfile

os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=true")

_MADE_CACHE = None
if "PYTEST_XDIST_WORKER" not in os.environ or "DEQJAX_COMPILATION_CACHE_DIR" not in os.environ:
    # (a pytest-xdist worker uses its controller's folder)
    _MADE_CACHE = tempfile.mkdtemp(prefix="deqjax-tests-jax-cache-")
    os.environ["DEQJAX_COMPILATION_CACHE_DIR"] = _MADE_CACHE

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)
jax.config.update("jax_numpy_dtype_promotion", "strict")
jax.config.update("jax_numpy_rank_promotion", "raise")
jax.config.update("jax_default_matmul_precision", "highest")


import pytest  # noqa: E402


def pytest_unconfigure(config):
    """Deletes the session's compilation cache in the process that made it."""
    if _MADE_CACHE is not None:
        shutil.rmtree(_MADE_CACHE, ignore_errors=True)


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
