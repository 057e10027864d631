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

:class:`LMBatches` is the endless, resumable form for :func:`deqjax.training.fit` (the
``Batches`` protocol: ``next``, ``state``, ``restore``, the batch sizes, ``steps_per_epoch``):
pass after pass over the segments, each batch flagging with ``reset`` the streams whose memory
must start empty (the first segment of every pass), so the model's memory — fit's ``carry`` —
follows the streams across steps.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, NamedTuple

import numpy as np

from deqjax._src.data.batching import IteratorState, iterator_state, process_info


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


class LMBatches:
    """Endless, resumable language-model batches: :func:`lm_segments` pass after pass.

    Implements the :class:`~deqjax.data.Batches` protocol of :func:`deqjax.training.fit`.
    ``next()`` returns this process's streams of the next segment::

        {"inputs": int32[B_p, T], "targets": int32[B_p, T], "reset": bool[B_p]}

    (plus ``"memory": int32[B_p, M]`` and ``"memory_valid": bool[B_p, M]`` when
    ``memory_length > 0``), where ``reset`` is True on the first segment of every pass: a model
    carrying hidden states across steps (:func:`deqjax.models.reset_memory`) starts that segment
    from an empty memory, exactly as a fresh pass over :func:`lm_segments` would.

    Args:
      tokens: int 1-D token stream (the same on every process).
      num_streams: GLOBAL batch size ``B`` (streams), summed over processes; process ``p`` of
        ``P`` takes streams ``[p B/P, (p+1) B/P)``.
      segment_length: ``T``.
      memory_length: ``M`` memory tokens per segment (default 0: none; the token memory of
        :func:`lm_segments`, not the model's hidden-state memory).
      pad_id: value of memory positions before the start of a stream.
      process_index, process_count: this process's shard (default jax's).
      state: start position (default the beginning).

    Raises:
      ValueError: for a bad argument (see :func:`lm_segments`) or ``num_streams`` not divisible
        by ``process_count``.

    Example:
      >>> it = LMBatches(train_tokens, num_streams=16, segment_length=64)
      >>> batch = next(it); it.state
      IteratorState(epoch=0, index=1)
    """

    def __init__(
        self,
        tokens: np.ndarray,
        *,
        num_streams: int,
        segment_length: int,
        memory_length: int = 0,
        pad_id: int = 0,
        process_index: int | None = None,
        process_count: int | None = None,
        state: IteratorState | None = None,
    ):
        # Validates every argument (and that one segment fits) now, not at the first next().
        lm_segments(
            tokens,
            num_streams=num_streams,
            segment_length=segment_length,
            memory_length=memory_length,
            pad_id=pad_id,
        )
        self._process_index, self._process_count = process_info(process_index, process_count)
        if num_streams % self._process_count:
            raise ValueError(
                f"num_streams ({num_streams}) must be divisible by the process count "
                f"({self._process_count})."
            )
        self._tokens = np.asarray(tokens)
        self._kwargs = dict(
            num_streams=num_streams,
            segment_length=segment_length,
            memory_length=memory_length,
            pad_id=pad_id,
        )
        self.batch_size = num_streams
        self.local_batch_size = num_streams // self._process_count
        self.steps_per_epoch = num_lm_segments(
            self._tokens.shape[0], num_streams=num_streams, segment_length=segment_length
        )
        self._segments: Iterator[LMSegment] | None = None
        self.restore(IteratorState(0, 0) if state is None else state)

    @property
    def state(self) -> IteratorState:
        """The position: ``(passes completed, segments yielded in this pass)``."""
        return self._state

    def restore(self, state: IteratorState | dict[str, Any]) -> None:
        """Moves to ``state`` (an :class:`~deqjax.data.IteratorState` or its dict after a JSON
        round trip).

        Raises:
          ValueError: for a position outside ``[0, steps_per_epoch]`` or a negative epoch.
        """
        self._state = iterator_state(state, self.steps_per_epoch)
        self._segments = lm_segments(self._tokens, start=self._state.index, **self._kwargs)

    def __iter__(self) -> LMBatches:
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        epoch, index = self._state
        if index == self.steps_per_epoch:  # a new pass: the streams start again
            epoch, index = epoch + 1, 0
            self._segments = lm_segments(self._tokens, **self._kwargs)
        seg = next(self._segments)
        self._state = IteratorState(epoch, index + 1)
        lo = self._process_index * self.local_batch_size
        rows = slice(lo, lo + self.local_batch_size)
        batch = {
            "inputs": seg.inputs[rows],
            "targets": seg.targets[rows],
            "reset": np.full((self.local_batch_size,), seg.index == 0),
        }
        if self._kwargs["memory_length"]:
            batch["memory"] = seg.memory[rows]
            batch["memory_valid"] = np.broadcast_to(seg.memory_valid, batch["memory"].shape)
        return batch
