"""Deterministic, resumable, per-host-sharded batches from in-memory numpy arrays.

The order of epoch ``e`` is a permutation drawn from ``numpy.random.default_rng([seed, e])``, so it
depends only on ``(seed, e)``: every process computes the same global order without
communicating, and a run resumed from a checkpoint that stored :class:`IteratorState`
``(epoch, index)`` sees exactly the batches it would have seen. Process ``p`` of ``P`` takes the
``p``-th contiguous slice of each global batch (each host reads its own shard; the union over hosts
is the global batch).

:class:`Batches` is the protocol :func:`deqjax.training.fit` trains from: any endless iterator
of batches that declares its batch sizes and epoch length and whose position can be read
(``state``, JSON-able) and set back (``restore``), so a checkpoint can hold it and ``--resume``
continue from it. ShuffledBatches implements it; so can any other source (e.g. ordered
language-model segments with memory).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple, Protocol, runtime_checkable

import numpy as np

Arrays = Mapping[str, np.ndarray]


class IteratorState(NamedTuple):
    """Position of an epoch-based batch iterator (:class:`ShuffledBatches`,
    :class:`~deqjax.data.LMBatches`); stored in checkpoints."""

    epoch: int  # epochs (passes over the data) completed before the current one
    index: int  # batches already yielded in the current epoch


def iterator_state(
    state: IteratorState | tuple[int, int] | Mapping[str, Any], steps_per_epoch: int
) -> IteratorState:
    """``state`` (a tuple, or ``{"epoch", "index"}`` after a JSON round trip) as an
    :class:`IteratorState`, checked against ``steps_per_epoch``.

    Raises:
      ValueError: for a negative epoch or an index outside ``[0, steps_per_epoch]``.
    """
    if isinstance(state, Mapping):
        state = (state["epoch"], state["index"])
    epoch, index = (int(s) for s in state)
    if epoch < 0 or not 0 <= index <= steps_per_epoch:
        raise ValueError(
            f"state must have epoch >= 0 and 0 <= index <= {steps_per_epoch}, got {state}."
        )
    return IteratorState(epoch, index)


@runtime_checkable
class Batches(Protocol):
    """What :func:`deqjax.training.fit` trains from: a resumable stream of batches.

    * ``__next__() -> batch``: this process's share of the next global batch, a pytree of arrays
      with a leading batch axis of ``local_batch_size`` (what the step shards over devices);
    * ``batch_size``: the global batch (summed over processes), e.g. for ``examples_per_sec``;
    * ``local_batch_size``: this process's share of it (the local devices must divide it);
    * ``steps_per_epoch``: batches per pass over the data, or None for an endless stream (the
      records then carry no ``epoch``, and an evaluation needs a schedule of its own);
    * ``state``: the position, a NamedTuple or mapping of JSON-able values (saved with every
      checkpoint);
    * ``restore(state)``: moves to a position read from ``state``, given back as a dict after
      the JSON round trip (or as the object ``state`` returned).

    Restoring a saved state and calling ``next`` must give the batch the uninterrupted iterator
    would have given: that is what makes a resumed run reproduce the uninterrupted one.
    :class:`ShuffledBatches`, :class:`~deqjax.data.LMBatches` and
    :class:`~deqjax.data.CopyMemoryBatches` are ``Batches``; so is
    :class:`~deqjax.training.ResidentBatches`, whose batches are already on the devices.
    """

    batch_size: int
    local_batch_size: int
    steps_per_epoch: int | None

    @property
    def state(self) -> Any: ...

    def restore(self, state: Any) -> None: ...

    def __next__(self) -> Any: ...


def state_dict(state: Any) -> dict:
    """A :class:`Batches` position as a JSON-able dict (from a NamedTuple or mapping)."""
    if hasattr(state, "_asdict"):
        state = state._asdict()
    if not isinstance(state, Mapping):
        raise ValueError(
            f"a Batches' state must be a NamedTuple or a mapping, got {type(state).__name__}."
        )
    return {str(k): (v.item() if isinstance(v, np.generic) else v) for k, v in state.items()}


def epoch_permutation(num_examples: int, *, seed: int, epoch: int) -> np.ndarray:
    """The order of ``epoch``: a permutation of ``range(num_examples)`` drawn from (seed, epoch)."""
    return np.random.default_rng([int(seed), int(epoch)]).permutation(num_examples)


def process_info(process_index: int | None, process_count: int | None) -> tuple[int, int]:
    """``(process_index, process_count)``: the values given, else JAX's; checked."""
    if process_index is None or process_count is None:
        import jax

        process_index = jax.process_index() if process_index is None else process_index
        process_count = jax.process_count() if process_count is None else process_count
    if process_count < 1 or not 0 <= process_index < process_count:
        raise ValueError(
            f"process_index must be in [0, process_count); got process_index={process_index}, "
            f"process_count={process_count}."
        )
    return int(process_index), int(process_count)


class GlobalBatches:
    """The batch sizes a :class:`Batches` declares, checked once: the global ``batch_size``
    (summed over processes) and this process's share of it, ``local_batch_size``."""

    def __init__(self, batch_size: int, process_count: int):
        """Raises ``ValueError`` if ``batch_size`` does not divide by ``process_count``."""
        if batch_size % process_count:
            raise ValueError(
                f"batch_size ({batch_size}) must be divisible by process_count ({process_count})."
            )
        self._batch_size = int(batch_size)
        self._local = self._batch_size // process_count

    @property
    def batch_size(self) -> int:
        """The global batch size."""
        return self._batch_size

    @property
    def local_batch_size(self) -> int:
        """The batch size this process yields (``batch_size // process_count``)."""
        return self._local

    def __iter__(self) -> Iterator[Any]:
        return self


def _check_arrays(arrays: Arrays, name: str) -> int:
    if not isinstance(arrays, Mapping) or not arrays:
        raise ValueError(f"{name} must be a non-empty mapping of name -> numpy array.")
    sizes = {k: np.shape(v)[0] if np.ndim(v) else None for k, v in arrays.items()}
    if len(set(sizes.values())) != 1 or None in sizes.values():
        raise ValueError(f"{name} arrays must share the same leading dimension, got {sizes}.")
    return int(next(iter(sizes.values())))


class ShuffledBatches(GlobalBatches):
    """An endless iterator over shuffled global batches, yielding this process's shard of each.

    Each epoch visits ``steps_per_epoch = num_examples // batch_size`` full batches (the remainder
    of the permutation is dropped, a different remainder each epoch). ``next()`` returns
    ``{name: array[batch_size // process_count, ...]}``.

    Args:
      arrays: ``{name: array[N, ...]}`` with a common leading dimension (the same on every process).
      batch_size: GLOBAL batch size, summed over all processes and devices.
      seed: seed of the per-epoch permutations.
      process_index, process_count: this process's shard; default ``jax.process_index()`` /
        ``jax.process_count()``.
      shuffle: if False, batches follow the stored order (every epoch the same).
      state: start position (default the beginning).

    On the devices: :class:`~deqjax.training.ResidentBatches` of it places ``arrays`` there once
    and gathers each batch there (the same batches in the same order, without a host-to-device
    copy per step).

    Raises:
      ValueError: if ``batch_size`` does not divide by ``process_count`` or exceeds ``N``.

    Example:
      >>> it = ShuffledBatches(load_digits(), batch_size=128, seed=0)
      >>> batch = next(it); it.state
      IteratorState(epoch=0, index=1)
    """

    def __init__(
        self,
        arrays: Arrays,
        *,
        batch_size: int,
        seed: int,
        process_index: int | None = None,
        process_count: int | None = None,
        shuffle: bool = True,
        state: IteratorState | None = None,
    ):
        self._num_examples = _check_arrays(arrays, "arrays")
        self._process_index, self._process_count = process_info(process_index, process_count)
        if batch_size < 1 or batch_size > self._num_examples:
            raise ValueError(
                f"batch_size must be in [1, {self._num_examples}] (the number of examples), "
                f"got {batch_size}."
            )
        super().__init__(batch_size, self._process_count)
        self._arrays = {k: np.asarray(v) for k, v in arrays.items()}
        self._seed = int(seed)
        self._shuffle = bool(shuffle)
        self._perm_epoch: int | None = None
        self._perm: np.ndarray | None = None
        self._state = IteratorState(0, 0)
        if state is not None:
            self.restore(state)

    @property
    def num_examples(self) -> int:
        return self._num_examples

    @property
    def arrays(self) -> dict[str, np.ndarray]:
        """The examples, ``{name: array[N, ...]}`` (the same on every process)."""
        return self._arrays

    @property
    def process_index(self) -> int:
        """This process's shard of each global batch."""
        return self._process_index

    @property
    def steps_per_epoch(self) -> int:
        """Full global batches per epoch (``num_examples // batch_size``)."""
        return self._num_examples // self._batch_size

    @property
    def state(self) -> IteratorState:
        """The position: the next ``next()`` yields batch ``index`` of epoch ``epoch``."""
        return self._state

    def restore(self, state: IteratorState | tuple[int, int] | Mapping[str, Any]) -> None:
        """Moves to a position saved from :attr:`state` (a tuple or ``{"epoch", "index"}``)."""
        self._state = iterator_state(state, self.steps_per_epoch)

    def order(self, epoch: int) -> np.ndarray:
        """The order of ``epoch``: global batch ``i`` of it is the examples
        ``order(epoch)[i * batch_size : (i + 1) * batch_size]``."""
        if self._perm_epoch != epoch:
            self._perm = (
                epoch_permutation(self._num_examples, seed=self._seed, epoch=epoch)
                if self._shuffle
                else np.arange(self._num_examples)
            )
            self._perm_epoch = epoch
        return self._perm

    def next_position(self) -> IteratorState:
        """Moves past the next batch without gathering it: returns where that batch is, global
        batch ``index`` of epoch ``epoch`` (what ``next()`` would have yielded a shard of)."""
        epoch, index = self._state
        if index >= self.steps_per_epoch:
            epoch, index = epoch + 1, 0
        self._state = IteratorState(epoch, index + 1)
        return IteratorState(epoch, index)

    def __next__(self) -> dict[str, np.ndarray]:
        epoch, index = self.next_position()
        start = index * self._batch_size + self._process_index * self._local
        idx = self.order(epoch)[start : start + self._local]
        return {k: v[idx] for k, v in self._arrays.items()}


def eval_batches(
    arrays: Arrays,
    *,
    batch_size: int,
    process_index: int | None = None,
    process_count: int | None = None,
) -> Iterator[tuple[dict[str, np.ndarray], np.ndarray]]:
    """One pass over ``arrays`` in order, padded so every batch (on every process) has one shape.

    Global batch ``b`` covers examples ``[b * batch_size, (b + 1) * batch_size)``; this process
    yields its slice. The last batch is padded by repeating example 0 with mask 0, so every process
    runs the same number of equally shaped steps (one compilation, no collective deadlock).

    Yields:
      ``(batch, mask)``: ``{name: array[batch_size // process_count, ...]}`` and a float32 mask of
      the same leading size, 1 for real examples and 0 for padding. Each example has mask 1 exactly
      once over all processes and batches.
    """
    n = _check_arrays(arrays, "arrays")
    p, count = process_info(process_index, process_count)
    if batch_size < 1 or batch_size % count:
        raise ValueError(
            f"batch_size must be a positive multiple of process_count ({count}), got {batch_size}."
        )
    local = batch_size // count
    num_batches = -(-n // batch_size)
    for b in range(num_batches):
        start = b * batch_size + p * local
        idx = np.arange(start, start + local)
        mask = (idx < n).astype(np.float32)
        idx = np.where(idx < n, idx, 0)
        yield {k: np.asarray(v)[idx] for k, v in arrays.items()}, mask
