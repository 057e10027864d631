"""Transformer-XL relative positional attention: sinusoidal relative embeddings, the rel-shift and
the attention score ``(q_i + u)·k_j + (q_i + v)·r_{i-j}`` (Dai et al. 2019, §3.3).

Pure functions, no framework: the DEQ-Transformer cells (:mod:`deqjax._src.cells.transformer`)
own the parameters. Keys may include a memory of ``M`` positions before the ``T`` query positions
(the previous segment's equilibrium, DEQ paper §4 "history padding"); query ``i``
(``0 <= i < T``) then sits at key position ``M + i``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from deqjax._src import checks


def sinusoidal_embedding(positions: jax.Array, dim: int) -> jax.Array:
    """Transformer-XL sinusoids ``[sin(p ω_k), cos(p ω_k)]``, ``ω_k = 10000^(-2k/dim)``.

    Args:
      positions: ``[L]`` (relative) positions, float.
      dim: embedding width, even.

    Returns:
      ``[L, dim]`` embeddings in ``positions``' dtype.

    Raises:
      ValueError: if ``dim`` is not a positive even integer.
    """
    if checks.check_positive_int(dim, "dim") % 2:
        raise ValueError(f"dim must be a positive even integer, got {dim!r}.")
    dtype = positions.dtype
    inv_freq = 1.0 / (10000.0 ** (jnp.arange(0, dim, 2, dtype=dtype) / dim))  # [dim/2]
    angles = positions[:, None] * inv_freq[None, :]  # [L, dim/2]
    return jnp.concatenate([jnp.sin(angles), jnp.cos(angles)], axis=-1)  # [L, dim]


def relative_positions(num_keys: int, dtype) -> jax.Array:
    """The relative distances ``K-1, K-2, ..., 0`` that :func:`rel_shift` expects, ``[K]``."""
    return jnp.arange(num_keys - 1, -1, -1, dtype=dtype)


def rel_shift(scores: jax.Array) -> jax.Array:
    """Re-indexes position scores from relative distance to key index (Transformer-XL App. B).

    Given ``scores[..., i, p]`` for query ``i`` and relative distance ``K-1-p`` (the order of
    :func:`relative_positions`), returns ``out[..., i, j] = scores[..., i, j + T-1-i]``: the score
    of query ``i`` for key ``j`` at distance ``(M + i) - j`` with ``M = K - T`` memory positions.
    Exact for every causal entry ``j <= M + i``; entries with ``j > M + i`` are arbitrary and must
    be masked. Implemented with the pad-and-reshape trick (no gather).

    Args:
      scores: ``[..., T, K]`` with ``K >= T``.

    Returns:
      ``[..., T, K]``.
    """
    *lead, t, k = scores.shape
    padded = jnp.pad(scores, [(0, 0)] * len(lead) + [(0, 0), (1, 0)])  # [..., T, K+1]
    padded = padded.reshape(*lead, k + 1, t)  # [..., K+1, T]
    return padded[..., 1:, :].reshape(*lead, t, k)  # [..., T, K]


def causal_mask(num_queries: int, num_keys: int) -> jax.Array:
    """``mask[i, j] = j <= (K - T) + i``: query ``i`` sees all memory keys and keys up to itself."""
    mem = num_keys - num_queries
    q = jnp.arange(num_queries)[:, None]
    k = jnp.arange(num_keys)[None, :]
    return k <= q + mem  # [T, K] bool


def relative_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    r: jax.Array,
    u_bias: jax.Array,
    v_bias: jax.Array,
) -> jax.Array:
    """Causal multi-head attention with Transformer-XL relative scores.

    ``A[i, j] = ((q_i + u)·k_j + rel_shift((q_i + v)·r)[i, j]) / sqrt(d_head)``, masked to
    ``j <= M + i``, softmax over ``j``, then ``Σ_j A[i, j] v_j``.

    Args:
      q: ``[..., T, H, Dh]`` queries (the ``T`` current positions).
      k: ``[..., K, H, Dh]`` keys, ``K = M + T`` (memory first).
      v: ``[..., K, H, Dh]`` values.
      r: ``[K, H, Dh]`` projected relative embeddings for distances ``K-1, ..., 0``.
      u_bias: ``[H, Dh]`` content bias ``u``.
      v_bias: ``[H, Dh]`` position bias ``v``.

    Returns:
      ``[..., T, H, Dh]`` attention output per head.
    """
    num_q, num_k, d_head = q.shape[-3], k.shape[-3], q.shape[-1]
    lead = (1,) * (q.ndim - 2)  # explicit broadcasting (rank promotion may be "raise")
    content = jnp.einsum("...ihd,...jhd->...hij", q + u_bias.reshape(lead + u_bias.shape), k)
    position = jnp.einsum("...ihd,jhd->...hij", q + v_bias.reshape(lead + v_bias.shape), r)
    # content, position: [..., H, T, K]; position is indexed by distance until rel_shift
    scores = (content + rel_shift(position)) / jnp.sqrt(jnp.asarray(d_head, q.dtype))
    mask = causal_mask(num_q, num_k)  # [T, K]
    mask = jnp.broadcast_to(mask, scores.shape)
    # The most negative finite value of the scores' dtype (-1e30 would be -inf in float16).
    scores = jnp.where(mask, scores, jnp.finfo(scores.dtype).min)
    probs = jax.nn.softmax(scores, axis=-1)  # [..., H, T, K]
    return jnp.einsum("...hij,...jhd->...ihd", probs, v)  # [..., T, H, Dh]
