"""Layer and group normalisation written for the library's strict promotion rules.

Same maths as ``hk.LayerNorm``/``hk.GroupNorm`` (Ba et al. 2016; Wu & He 2018), channels last,
with explicit broadcasting (the test suite runs with ``jax_numpy_rank_promotion="raise"``); the
layer norm is the framework-free cells' (:func:`deqjax._src.cells.layers.layer_norm`).
"""

from __future__ import annotations

import haiku as hk
import jax
import jax.numpy as jnp

from deqjax._src import checks
from deqjax._src.cells import layers


class LayerNorm(hk.Module):
    """Normalises the last axis to zero mean, unit variance; learned scale and offset ``[C]``.

    Args:
      eps: added to the variance.
      name: module name.
    """

    def __init__(self, *, eps: float = 1e-5, name: str | None = None):
        super().__init__(name=name)
        self.eps = eps

    def __call__(self, x: jax.Array) -> jax.Array:
        c = x.shape[-1]
        scale = hk.get_parameter("scale", [c], x.dtype, init=jnp.ones)
        offset = hk.get_parameter("offset", [c], x.dtype, init=jnp.zeros)
        return layers.layer_norm(x, scale, offset, eps=self.eps)


class GroupNorm(hk.Module):
    """Group normalisation of ``[B, ..., C]`` over the non-batch axes within each of ``groups``
    channel groups (Wu & He 2018); learned per-channel scale and offset.

    Args:
      groups: number of channel groups; must divide ``C`` (checked at call time).
      eps: added to the variance.
      name: module name.

    Raises:
      ValueError: if ``groups`` is not a positive int, or does not divide the channel count.
    """

    def __init__(self, groups: int, *, eps: float = 1e-5, name: str | None = None):
        super().__init__(name=name)
        checks.check_positive_int(groups, "groups")
        self.groups = groups
        self.eps = eps

    def __call__(self, x: jax.Array) -> jax.Array:
        c = x.shape[-1]
        if c % self.groups:
            raise ValueError(f"groups={self.groups} does not divide the {c} channels.")
        xg = x.reshape(x.shape[:-1] + (self.groups, c // self.groups))  # [B, ..., G, C/G]
        axes = tuple(range(1, xg.ndim - 2)) + (xg.ndim - 1,)
        mean = jnp.mean(xg, axis=axes, keepdims=True)
        var = jnp.mean(jnp.square(xg - mean), axis=axes, keepdims=True)
        y = ((xg - mean) * jax.lax.rsqrt(var + jnp.asarray(self.eps, x.dtype))).reshape(x.shape)
        bshape = (1,) * (x.ndim - 1) + (c,)
        scale = hk.get_parameter("scale", [c], x.dtype, init=jnp.ones).reshape(bshape)
        offset = hk.get_parameter("offset", [c], x.dtype, init=jnp.zeros).reshape(bshape)
        return y * scale + offset
