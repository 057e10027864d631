"""In-graph image augmentation (JR paper App. A.3): random crop with zero padding, horizontal flip.

Drawn from a ``jax.random`` key inside the (jitted) train step, so a training run's augmentation is
a function of its step key: resumable with the run, no host-side generator to checkpoint.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from deqjax._src import checks


def random_crop_flip(key: jax.Array, images: jax.Array, *, pad: int = 4) -> jax.Array:
    """Per image: zero-pad by ``pad`` pixels, crop back at a uniform offset in ``[0, 2 pad]``,
    flip left-right with probability 1/2.

    Args:
      key: a ``jax.random`` key.
      images: ``[B, H, W, C]`` (any dtype; padding is zeros of that dtype).
      pad: padding (and the largest shift) in pixels, ``>= 0``.

    Returns:
      ``[B, H, W, C]``, same dtype.

    Raises:
      ValueError: for ``images`` not 4-D or a negative ``pad``.
    """
    if jnp.ndim(images) != 4:
        raise ValueError(f"images must be [B, H, W, C], got shape {jnp.shape(images)}.")
    checks.check_int(pad, "pad", minimum=0)
    b, h, w, c = images.shape
    k_dy, k_dx, k_flip = jax.random.split(key, 3)
    dy = jax.random.randint(k_dy, (b,), 0, 2 * pad + 1)
    dx = jax.random.randint(k_dx, (b,), 0, 2 * pad + 1)
    flip = jax.random.bernoulli(k_flip, 0.5, (b,))
    padded = jnp.pad(images, ((0, 0), (pad, pad), (pad, pad), (0, 0)))

    def one(img, y, x, f):
        crop = jax.lax.dynamic_slice(img, (y, x, 0), (h, w, c))
        return jnp.where(f, crop[:, ::-1], crop)

    return jax.vmap(one)(padded, dy, dx, flip)
