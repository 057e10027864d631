"""The copy-memory task (DEQ paper §5 Table 1, after Bai, Kolter & Koltun 2018 §4).

The input is 10 digits drawn uniformly from ``1..8``, then ``T - 1`` blanks (``0``), a delimiter
``9`` and 10 more blanks (length ``T + 20``); the target is blank everywhere except the last 10
positions, which must repeat the 10 digits. The metric is the cross-entropy over all positions; the
best predictor without memory scores :func:`copy_memory_blank_loss`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from deqjax._src import checks

NUM_DIGITS = 10
VOCAB = 10  # 0 blank, 1..8 digits, 9 delimiter


def copy_memory_batch(
    rng: np.random.Generator, *, batch_size: int, seq_len: int
) -> tuple[np.ndarray, np.ndarray]:
    """``(inputs, targets)``, int32 ``[batch_size, seq_len + 20]`` each (module docstring)."""
    digits = rng.integers(1, 9, size=(batch_size, NUM_DIGITS), dtype=np.int32)
    length = seq_len + 2 * NUM_DIGITS
    inputs = np.zeros((batch_size, length), np.int32)
    targets = np.zeros((batch_size, length), np.int32)
    inputs[:, :NUM_DIGITS] = digits
    inputs[:, NUM_DIGITS + seq_len - 1] = 9
    targets[:, -NUM_DIGITS:] = digits
    return inputs, targets


def copy_memory_blank_loss(seq_len: int) -> float:
    """Cross-entropy of the best predictor without memory: blanks everywhere, then uniform digits.

    It knows where the copy starts (after the delimiter) but not which digits to copy:
    ``10 ln 8 / (T + 20)`` per position.
    """
    return NUM_DIGITS * float(np.log(8.0)) / (seq_len + 2 * NUM_DIGITS)


def copy_memory_steps_to_learn(
    losses: Sequence[float], blank_loss: float, window: int = 20
) -> int | None:
    """First step whose trailing ``window``-step mean train loss is below ``blank_loss / 10``.

    The blank-only loss is a plateau every model sits on before it learns to copy; this is the
    step it leaves it for good (``None``: never within the run).
    """
    losses = np.asarray(losses, np.float64)
    if losses.size < window:
        return None
    means = np.convolve(losses, np.ones(window) / window, mode="valid")
    below = np.nonzero(means < 0.1 * blank_loss)[0]
    return int(below[0] + window - 1) if below.size else None


class CopyMemoryState(NamedTuple):
    """Position of a :class:`CopyMemoryBatches` iterator: batches drawn so far."""

    drawn: int


class CopyMemoryBatches:
    """Endless copy-memory batches from one seeded generator; a :class:`~deqjax.data.Batches`
    (an endless stream: ``steps_per_epoch`` is None).

    Batch ``n`` is the ``n``-th :func:`copy_memory_batch` drawn from
    ``numpy.random.default_rng(seed)``; :meth:`restore` replays the generator to a position, so a
    resumed run sees the batches the uninterrupted one would have. ``next()`` returns
    ``{"inputs", "targets"}``, int32 ``[batch_size, seq_len + 20]``.

    Args:
      seed: seed of the generator.
      batch_size: examples per batch (one process).
      seq_len: ``T``.

    Raises:
      ValueError: for ``batch_size < 1`` or ``seq_len < 1``.
    """

    def __init__(self, *, seed: int, batch_size: int, seq_len: int):
        for name, value in (("batch_size", batch_size), ("seq_len", seq_len)):
            checks.check_positive_int(value, name)
        self.seed, self.batch_size, self.seq_len = int(seed), int(batch_size), int(seq_len)
        self.local_batch_size = self.batch_size
        self.steps_per_epoch: int | None = None  # an endless stream: no epochs
        self.restore(CopyMemoryState(0))

    @property
    def state(self) -> CopyMemoryState:
        return CopyMemoryState(self._drawn)

    def restore(self, state: CopyMemoryState | dict[str, Any]) -> None:
        """Replays the generator to ``state`` (or its dict after a JSON round trip)."""
        drawn = int(state["drawn"] if isinstance(state, dict) else state.drawn)
        if drawn < 0:
            raise ValueError(f"state.drawn must be >= 0, got {drawn}.")
        self._rng, self._drawn = np.random.default_rng(self.seed), 0
        for _ in range(drawn):
            next(self)

    def __iter__(self) -> CopyMemoryBatches:
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        inputs, targets = copy_memory_batch(
            self._rng, batch_size=self.batch_size, seq_len=self.seq_len
        )
        self._drawn += 1
        return {"inputs": inputs, "targets": targets}
