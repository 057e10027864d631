"""Helpers shared by the benchmark scripts: timing and a random tanh DEQ layer."""

from __future__ import annotations

import platform
import statistics
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np


def time_fn(fn: Callable[..., Any], *args: Any, repeats: int = 10) -> float:
    """Median wall time in seconds of ``fn(*args)`` after one warm-up call (compiles)."""
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def tanh_layer(d: int, batch: int, radius: float, seed: int = 0, dtype=jnp.float32):
    """Parameters and inputs of ``f(z) = tanh(W z + U x + b)``; W has spectral radius ``radius``."""
    rng = np.random.default_rng(seed)
    w = rng.normal(size=(d, d))
    w *= radius / np.max(np.abs(np.linalg.eigvals(w)))
    params = {
        "W": jnp.asarray(w, dtype),
        "U": jnp.asarray(rng.normal(size=(d, d)) / np.sqrt(d), dtype),
        "b": jnp.asarray(0.1 * rng.normal(size=d), dtype),
    }
    x = jnp.asarray(rng.normal(size=(batch, d)), dtype)
    return params, x


def tanh_cell(p, x, z):
    """One example: ``tanh(W z + U x + b)`` for z, x of shape [d]."""
    return jnp.tanh(p["W"] @ z + p["U"] @ x + p["b"])


def machine() -> str:
    """A one-line description of where the numbers were taken."""
    dev = jax.devices()[0]
    return (
        f"jax {jax.__version__}, {dev.platform} ({dev.device_kind}), "
        f"{len(jax.devices())} device(s), python {platform.python_version()}"
    )
