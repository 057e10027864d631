"""Test-wide JAX configuration: float64 available, strict dtype promotion, a compilation cache.

Tests that need float32 say so explicitly; code under test must not rely on implicit promotion.
"""

import os
import tempfile

os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=true")
# JAX's persistent compilation cache, shared by the test workers and the experiments the tests run
# as subprocesses: many tests compile the same programs (an eager call recompiles its solve each
# time), and a program found in the cache skips XLA's compiler. It changes no result. Set
# JAX_COMPILATION_CACHE_DIR to use another folder, or JAX_ENABLE_COMPILATION_CACHE=false to run
# without it.
os.environ.setdefault(
    "JAX_COMPILATION_CACHE_DIR",
    os.path.join(tempfile.gettempdir(), f"deqjax-tests-jax-cache-{os.getuid()}"),
)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
# A size bound makes JAX lock the folder (filelock) around every read and write: the workers share it.
os.environ.setdefault("JAX_COMPILATION_CACHE_MAX_SIZE", str(4 * 1024**3))

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)
jax.config.update("jax_numpy_dtype_promotion", "strict")
jax.config.update("jax_numpy_rank_promotion", "raise")
