"""Language-model batching into contiguous segments with the previous tokens as memory.

The layout of Transformer-XL (Dai et al. 2019) used by the DEQ paper's WikiText-103 model: a token
stream of length ``N`` is cut into ``B = num_streams`` contiguous streams of ``L = N // B`` tokens
(the last ``N mod B`` tokens are dropped), giving ``data[B, L]`` where row ``b`` is
``tokens[b*L:(b+1)*L]``. Segment ``s`` covers positions ``[s*T, (s+1)*T)`` of every stream:

* ``inputs[b, t] = data[b, s*T + t]``, ``targets[b, t] = data[b, s*T + t + 1]`` (next token);
* ``memory[b, m] = data[b, s*T - M + m]``: the ``M = memory_length`` tokens just before the segment
  in the same stream (positions before 0 are ``pad_id``, flagged by ``memory_valid``).

Consecutive segments therefore continue each other: segment ``s + 1`` of stream ``b`` starts where
segment ``s`` ended, and with ``M = T`` its memory is exactly segment ``s``'s inputs. A model that
carries hidden states from one segment to the next (DEQ/Transformer-XL memory) sees each stream in
order. Only full segments are produced (``num_segments = (L - 1) // T``), so every batch has the
same shape under ``jit``. Everything is a pure function of the arguments (deterministic,
resumable with ``start``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

import numpy as np


class LMSegment(NamedTuple):
    """One batch of language-model segments (host numpy arrays)."""

    inputs: np.ndarray  # [B, T] int32: tokens of segment `index` in each stream
    targets: np.ndarray  # [B, T] int32: the next token of each input
    memory: np.ndarray  # [B, M] int32: the M tokens before `inputs` in each stream (pad if none)
    memory_valid: np.ndarray  # [M] bool: False where the memory position lies before the stream
    index: int  # segment number s, 0-based


def stream_layout(tokens: np.ndarray, *, num_streams: int) -> np.ndarray:
    """Cuts a 1-D token stream into ``num_streams`` contiguous rows: ``[num_streams, N // B]``.

    Raises:
      ValueError: if ``tokens`` is not 1-D, ``num_streams < 1``, or a stream would be empty.
    """
    tokens = np.asarray(tokens)
    if tokens.ndim != 1:
        raise ValueError(f"tokens must be 1-D, got shape {tokens.shape}.")
    if not isinstance(num_streams, (int, np.integer)) or num_streams < 1:
        raise ValueError(f"num_streams must be a positive int, got {num_streams!r}.")
    length = tokens.shape[0] // num_streams
    if length == 0:
        raise ValueError(f"{tokens.shape[0]} tokens are too few for num_streams={num_streams}.")
    return tokens[: num_streams * length].reshape(num_streams, length)


def num_lm_segments(num_tokens: int, *, num_streams: int, segment_length: int) -> int:
    """Number of full segments :func:`lm_segments` yields: ``(num_tokens // B - 1) // T``."""
    if segment_length < 1:
        raise ValueError(f"segment_length must be >= 1, got {segment_length}.")
    if num_streams < 1:
        raise ValueError(f"num_streams must be >= 1, got {num_streams}.")
    return max(num_tokens // num_streams - 1, 0) // segment_length


def lm_segments(
    tokens: np.ndarray,
    *,
    num_streams: int,
    segment_length: int,
    memory_length: int | None = None,
    pad_id: int = 0,
    start: int = 0,
) -> Iterator[LMSegment]:
    """Iterates the segments of a token stream in order (see the module docstring).

    Args:
      tokens: int 1-D token stream (e.g. a split from
        :func:`deqjax._src.data.tokenizer.encode_corpus`).
      num_streams: batch size ``B``: number of contiguous streams.
      segment_length: ``T``, tokens per segment (the model's context, 128 in the init paper).
      memory_length: ``M``, tokens of memory before each segment; ``None``: ``T`` (exactly the
        previous segment); ``0``: no memory.
      pad_id: value of memory positions before the start of the stream.
      start: first segment to yield (resume from a checkpoint that stored the next ``index``).

    Returns:
      An iterator of ``LMSegment`` for ``s = start, ..., num_segments - 1``; arrays are int32
      ``[B, T]``, ``[B, M]`` and bool ``[M]``.

    Raises:
      ValueError: at call time (not at the first ``next``), for a bad argument (named) or too few
        tokens for one segment.
    """
    data = stream_layout(tokens, num_streams=num_streams).astype(np.int32, copy=False)
    n = num_lm_segments(tokens.shape[0], num_streams=num_streams, segment_length=segment_length)
    memory_length = segment_length if memory_length is None else memory_length
    if memory_length < 0:
        raise ValueError(f"memory_length must be >= 0, got {memory_length}.")
    if n == 0:
        raise ValueError(
            f"{tokens.shape[0]} tokens in {num_streams} streams of {data.shape[1]} give no full "
            f"segment of segment_length={segment_length} (+1 for the targets)."
        )
    if not 0 <= start <= n:
        raise ValueError(f"start must lie in [0, {n}], got {start}.")
    return _segments(data, n, segment_length, memory_length, pad_id, start)


def _segments(
    data: np.ndarray, n: int, segment_length: int, memory_length: int, pad_id: int, start: int
) -> Iterator[LMSegment]:
    """The generator behind :func:`lm_segments` (arguments already checked there)."""
    num_streams = data.shape[0]
    for s in range(start, n):
        begin = s * segment_length
        inputs = data[:, begin : begin + segment_length]
        targets = data[:, begin + 1 : begin + segment_length + 1]
        first = begin - memory_length  # memory covers positions [first, begin)
        memory = np.full((num_streams, memory_length), pad_id, np.int32)
        have = min(memory_length, begin)
        if have:
            memory[:, memory_length - have :] = data[:, begin - have : begin]
        memory_valid = np.arange(first, begin) >= 0
        yield LMSegment(inputs.copy(), targets.copy(), memory, memory_valid, s)
