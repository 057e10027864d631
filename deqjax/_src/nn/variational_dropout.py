"""Variational (recurrent) dropout for DEQ cells (Gal & Ghahramani 2016; DEQ/JR papers).

One Bernoulli mask per forward pass, held fixed across every solver iteration and the backward
pass: the mask is drawn inside :func:`~deqjax.nn.per_forward`, so in a :class:`~deqjax.nn.DEQ` it
is sampled once, outside the solver loop, and replayed. No reset call is needed (pure functions):
the next forward pass draws a fresh key and a fresh mask.
"""

from __future__ import annotations

from collections.abc import Sequence

import haiku as hk
import jax
import jax.numpy as jnp

from deqjax._src.cells.layers import check_rate
from deqjax._src.nn.per_forward import per_forward


class VariationalDropout(hk.Module):
    """Inverted dropout with a mask drawn once per forward pass: ``x ↦ x · m / (1 − rate)``.

    Args:
      rate: drop probability in ``[0, 1)``.
      broadcast_axes: axes along which one mask value is shared (size 1 in the mask), e.g.
        ``(1,)`` for the time axis of ``[B, T, D]`` (the "variational" RNN dropout of the DEQ
        paper's TrellisNet) or ``(1, 2)`` for the spatial axes of ``[B, H, W, C]``.
      name: module name.

    Raises:
      ValueError: if ``rate`` is outside ``[0, 1)`` or ``broadcast_axes`` is not a sequence of
        ints.

    Example:
      >>> h = dq.nn.VariationalDropout(0.25, broadcast_axes=(1, 2))(h, is_training=True)
    """

    def __init__(self, rate: float, *, broadcast_axes: Sequence[int] = (), name: str | None = None):
        super().__init__(name=name)
        self.rate = check_rate(rate, "rate")
        try:
            self.broadcast_axes = tuple(int(a) for a in broadcast_axes)
        except (TypeError, ValueError) as e:
            raise ValueError(
                f"broadcast_axes must be a sequence of ints, got {broadcast_axes!r}."
            ) from e

    def __call__(self, x: jax.Array, *, is_training: bool) -> jax.Array:
        """Applies the mask (identity when ``is_training`` is False or ``rate`` is 0).

        Needs an rng (``hk.next_rng_key``) when training with ``rate > 0``.
        """
        if not is_training or self.rate == 0.0:
            return x
        ndim = x.ndim
        for a in self.broadcast_axes:
            if not -ndim <= a < ndim:
                raise ValueError(
                    f"broadcast_axes {self.broadcast_axes} out of range for {x.shape}."
                )
        axes = {a % ndim for a in self.broadcast_axes}
        mask_shape = tuple(1 if i in axes else s for i, s in enumerate(x.shape))
        keep = 1.0 - self.rate

        def draw():
            m = jax.random.bernoulli(hk.next_rng_key(), keep, mask_shape)
            return m.astype(x.dtype) / jnp.asarray(keep, x.dtype)

        return x * per_forward("mask", draw)


def time_shared_dropout(name: str, value: jax.Array, rate: float) -> jax.Array:
    """Variational dropout over ``[B, T, ...]``: one mask value per (example, feature), shared
    over time, drawn once per forward pass (``rate == 0``: identity, no rng needed).

    The sequence cells' dropout (DEQ paper §4: TrellisNet's and the weight-tied transformer's
    variational dropout); ``name`` names the :class:`VariationalDropout` module.
    """
    if rate == 0.0:
        return value
    drop = VariationalDropout(rate, broadcast_axes=(1,), name=name)
    return drop(value, is_training=True)
