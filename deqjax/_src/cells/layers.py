"""The pure layers the DEQ cells are made of, in every framework: layer norm, weight norm, the
variational dropout mask, and the default initializers.

Functions of arrays only (no framework): Haiku's modules (``dq.nn.LayerNorm``, ``dq.nn.WeightNorm``)
and the framework-free cells (:mod:`deqjax._src.cells.mlp`, :mod:`deqjax._src.cells.transformer`)
compute with them, so every framework's cell computes the same numbers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from deqjax._src import checks

Initializer = Callable[..., jax.Array]  # JAX's protocol: (key, shape, dtype) -> array
LN_EPS = 1e-5


def check_rate(rate: float, name: str) -> float:
    """``rate`` as a float, checked to be a dropout rate in ``[0, 1)``.

    Raises:
      ValueError: naming ``name``, for a non-real ``rate`` or one outside ``[0, 1)``.
    """
    if not 0.0 <= checks.check_real(rate, name) < 1.0:
        raise ValueError(f"{name} must be a float in [0, 1), got {rate!r}.")
    return float(rate)


def check_initializer(value: Any, name: str) -> None:
    """Raises ``ValueError`` naming ``name`` unless ``value`` is ``None`` or callable."""
    if value is not None and not callable(value):
        raise ValueError(
            f"{name} must be an initializer (callable (shape, dtype)) or None, got {value!r}."
        )


def layer_norm(
    x: jax.Array, scale: jax.Array, offset: jax.Array, *, eps: float = LN_EPS
) -> jax.Array:
    """``(x - mean) / sqrt(var + eps) * scale + offset`` over the last axis (Ba et al. 2016),
    with explicit broadcasting of ``scale``, ``offset`` ``[C]``."""
    c = x.shape[-1]
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
    y = (x - mean) * jax.lax.rsqrt(var + jnp.asarray(eps, x.dtype))
    bshape = (1,) * (x.ndim - 1) + (c,)
    return y * scale.reshape(bshape) + offset.reshape(bshape)


def layer_norm_params(size: int, dtype: Any) -> dict[str, jax.Array]:
    """A layer norm's parameters at init: ``{"scale": ones, "offset": zeros}`` ``[size]``."""
    return {"scale": jnp.ones((size,), dtype), "offset": jnp.zeros((size,), dtype)}


def norm_axes(shape: Sequence[int], axes: Sequence[int] | None = None) -> tuple[int, ...]:
    """The axes weight norm runs over: ``axes``, or every axis but the last (one gain per output
    unit of an ``[in, out]`` or ``[kh, kw, in, out]`` kernel)."""
    if axes is None:
        return tuple(range(len(shape) - 1)) if len(shape) > 1 else (0,)
    return tuple(axes)


def weight_norm_gain(v: jax.Array, axes: Sequence[int] | None = None) -> jax.Array:
    """``g = ‖v‖`` over ``axes`` (kept as size-1 axes): the gain that makes ``w = v`` at init."""
    axes = norm_axes(v.shape, axes)
    return jnp.sqrt(jnp.sum(jnp.square(v), axis=axes, keepdims=True))


def weight_normalised(v: jax.Array, g: jax.Array, axes: Sequence[int] | None = None) -> jax.Array:
    """``w = g · v / ‖v‖`` (Salimans & Kingma 2016, Eq. 2), the norm over ``axes``."""
    return v * (g / weight_norm_gain(v, axes))


def weight(param: jax.Array | dict[str, jax.Array]) -> jax.Array:
    """A cell's weight from its parameter: the array itself, or ``g · v / ‖v‖`` for a
    weight-normalised ``{"v": v, "g": g}``."""
    if isinstance(param, dict):
        return weight_normalised(param["v"], param["g"])
    return param


def weight_param(
    key: jax.Array, shape: Sequence[int], dtype: Any, init: Initializer, *, weight_norm: bool
) -> jax.Array | dict[str, jax.Array]:
    """A weight's parameter at init: ``init(key, shape, dtype)``, or with ``weight_norm``
    ``{"v": that, "g": ‖v‖}`` (so that the weight equals ``v`` at init)."""
    v = init(key, tuple(shape), dtype)
    return {"v": v, "g": weight_norm_gain(v)} if weight_norm else v


def dropout_mask(key: jax.Array, shape: Sequence[int], rate: float, dtype: Any) -> jax.Array:
    """An inverted-dropout mask ``m / (1 - rate)``, ``m ~ Bernoulli(1 - rate)``, of ``shape``."""
    keep = 1.0 - rate
    m = jax.random.bernoulli(key, keep, tuple(shape))
    return m.astype(dtype) / jnp.asarray(keep, dtype)


def lecun_truncated_normal(key: jax.Array, shape: Sequence[int], dtype: Any = None) -> jax.Array:
    """Truncated normal of variance ``1 / fan_in`` (``fan_in = prod(shape[:-1])``): the law of
    ``hk.Linear``'s default ``VarianceScaling(1.0, "fan_in", "truncated_normal")``."""
    init = jax.nn.initializers.variance_scaling(
        1.0, "fan_in", "truncated_normal", in_axis=tuple(range(len(shape) - 1))
    )
    return init(key, tuple(shape), jnp.float32 if dtype is None else dtype)


def normal(stddev: float) -> Initializer:
    """``N(0, stddev²)`` entries (the DEQ-Transformer's ``N(0, 0.01)``)."""

    def init(key: jax.Array, shape: Sequence[int], dtype: Any = None) -> jax.Array:
        dtype = jnp.float32 if dtype is None else dtype
        return stddev * jax.random.normal(key, tuple(shape), dtype)

    return init


def uniform(low: float, high: float) -> Initializer:
    """``U(low, high)`` entries."""

    def init(key: jax.Array, shape: Sequence[int], dtype: Any = None) -> jax.Array:
        dtype = jnp.float32 if dtype is None else dtype
        return jax.random.uniform(key, tuple(shape), dtype, low, high)

    return init
