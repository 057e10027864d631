"""The memory a sequence model carries from one segment to the next (Transformer-XL, Dai et al.
2019 §3.2; DEQ paper §3.3): zeros before a stream's first segment, the last ``M`` positions of
the model's ``aux["new_mems"]`` after each segment, zeros again where a stream's pass begins.

The DEQ carries one state ``[B, M, D]`` (its previous equilibrium); the explicit models carry one
per layer, ``[depth, B, M, D]``.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

KINDS = ("deq", "tied", "untied")


def initial_memory(
    kind: str,
    *,
    batch_size: int,
    memory_length: int,
    d_model: int,
    depth: int,
    dtype: Any = jnp.float32,
) -> jax.Array:
    """Zero memory before a stream's first segment: ``[B, M, D]`` for the DEQ (``kind="deq"``),
    ``[depth, B, M, D]`` for the explicit models (``"tied"``, ``"untied"``).

    Raises:
      ValueError: for an unknown ``kind``.
    """
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}.")
    shape = (batch_size, memory_length, d_model)
    return jnp.zeros(shape if kind == "deq" else (depth,) + shape, dtype)


def next_memory(new_mems: jax.Array, memory_length: int) -> jax.Array:
    """The next segment's memory: the last ``memory_length`` positions of ``aux["new_mems"]``."""
    return new_mems[..., -memory_length:, :]


def reset_memory(mems: jax.Array, reset: jax.Array) -> jax.Array:
    """``mems`` with the streams flagged by ``reset [B]`` (bool) set to zero: the memory of a
    stream whose new pass begins (``dq.data.LMBatches``' ``batch["reset"]``). ``mems`` is
    ``[B, M, D]`` or ``[depth, B, M, D]``.

    Raises:
      ValueError: if ``mems`` is neither, or its batch axis differs from ``reset``'s.
    """
    if mems.ndim not in (3, 4) or mems.shape[mems.ndim - 3] != reset.shape[0]:
        raise ValueError(
            f"mems must be [B, M, D] or [depth, B, M, D] with B = reset's {reset.shape[0]}, got "
            f"shape {mems.shape}."
        )
    flag = reset[:, None, None] if mems.ndim == 3 else reset[None, :, None, None]
    return jnp.where(flag, jnp.zeros_like(mems), mems)
