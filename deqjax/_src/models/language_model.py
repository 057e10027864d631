"""Training and evaluating a token model with memory on contiguous segments (DEQ paper §5; the
Transformer-XL protocol of Dai et al. 2019 §3.2).

The memory (a DEQ's previous ``z*``, an explicit model's per-layer states) is the recurrent carry of
:func:`deqjax.training.fit`: :func:`lm_loss` reads it, resets the streams whose pass over the data
begins (``dq.data.LMBatches``' ``batch["reset"]``) and returns the next one (gradient stopped by
``fit``), so training is truncated backpropagation through one segment with the memory carried
along each stream. :func:`evaluate_lm` runs the same protocol without updates.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np

from deqjax._src.data import lm_batching
from deqjax._src.models.memory import next_memory, reset_memory


def token_nll(logits: jax.Array, targets: jax.Array) -> jax.Array:
    """Mean next-token negative log-likelihood (nats) of ``logits [..., V]`` at ``targets``."""
    logp = jax.nn.log_softmax(logits)
    return jnp.mean(-jnp.take_along_axis(logp, targets[..., None], axis=-1))


def lm_loss(model: hk.Transformed, *, memory_length: int | None) -> Callable[..., Any]:
    """``fit``'s loss with carry for ``model.apply(params, rng, tokens, mems, is_training)``.

    Args:
      model: a transformed :class:`SequenceModel` forward (``(logits, aux)``).
      memory_length: ``M`` positions of memory carried to the next segment; ``None``: no memory
        (the carry is ``()``).

    Returns:
      ``loss_fn(params, batch, key, reg_state, step, *, carry) -> (loss, metrics, next_carry)``
      for :func:`deqjax.training.fit` (``carry=`` the zero memory, or ``()``): loss = NLL + the
      model's JR term ``aux["jr"]``; metrics ``nll``, ``nfe``, ``rel_residual``, ``jac_fro_sq``
      (the JR estimate), ``z_rms``.
    """

    def loss_fn(params, batch, key, reg_state, step, *, carry):
        del reg_state
        mems = None if memory_length is None else reset_memory(carry, batch["reset"])
        logits, aux = model.apply(params, key, batch["inputs"], mems, True)
        nll = token_nll(logits, batch["targets"])
        metrics = {k: aux[k] for k in ("nfe", "rel_residual", "z_rms")}
        metrics |= {"nll": nll, "jac_fro_sq": aux["jr/frobenius_sq"]}
        nxt = () if memory_length is None else next_memory(aux["new_mems"], memory_length)
        return nll + aux["jr"], metrics, nxt

    return loss_fn


def evaluate_lm(
    model: hk.Transformed,
    params: hk.Params,
    tokens: np.ndarray,
    *,
    num_streams: int,
    segment_length: int,
    num_segments: int,
    memory: jax.Array | None,
) -> dict[str, float]:
    """Mean NLL, forward NFE and relative residual over the first ``num_segments`` segments of
    ``tokens`` (``is_training=False``), the memory carried from segment to segment.

    Args:
      model, params: as in :func:`lm_loss`.
      tokens: 1-D token stream (laid out in contiguous streams as ``dq.data.LMBatches`` does).
      num_streams, segment_length: ``B`` and ``T``.
      num_segments: how many segments at most.
      memory: the zero memory (``dq.models.initial_memory`` at batch ``B``), or ``None``.

    Returns:
      ``{"nll", "nfe", "rel_residual", "segments"}`` (NaN means with no segment).
    """
    apply = jax.jit(lambda p, x, m: model.apply(p, None, x, m, False))
    length = None if memory is None else memory.shape[-2]
    sums, count = np.zeros(3), 0
    segments = lm_batching.lm_segments(
        tokens, num_streams=num_streams, segment_length=segment_length, memory_length=0
    )
    for seg in segments:
        if count >= num_segments:
            break
        logits, aux = apply(params, seg.inputs, memory)
        nll = token_nll(logits, seg.targets)
        sums += [float(nll), float(aux["nfe"]), float(aux["rel_residual"])]
        count += 1
        memory = None if length is None else next_memory(aux["new_mems"], length)
    means = sums / count if count else np.full(3, np.nan)
    return dict(zip(("nll", "nfe", "rel_residual"), map(float, means))) | {"segments": count}
