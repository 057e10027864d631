"""A grain iterator as training batches: its position is grain's own checkpoint state.

grain (Google's input pipeline for JAX) iterators (``iter(grain.MapDataset ...)``,
``iter(grain.IterDataset ...)``, ``iter(grain.DataLoader(...))``) save and restore their position
with ``get_state()`` / ``set_state(state)``. :class:`GrainBatches` puts that position where
:func:`deqjax.training.fit` stores a data position (``state``, a JSON-able dict, and ``restore``),
so a checkpoint holds it and a resumed run continues from the same next batch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from deqjax._src import checks
from deqjax._src.data.batching import GlobalBatches, process_info

_DICT, _BYTES = "grain", "grain_json"  # the state's key: a dict state, or a bytes (JSON) one


class GrainBatches(GlobalBatches):
    """Adapts a grain iterator of batches to the training data protocol.

    Each ``next()`` is the grain iterator's next element: this process's share of a global batch,
    a pytree of numpy arrays whose leading axis is ``local_batch_size`` (checked). ``state`` is
    ``{"grain": get_state()}`` (``{"grain_json": text}`` for iterators whose state is bytes of
    JSON, e.g. ``grain.DataLoader``'s), JSON-able; ``restore`` gives it back to ``set_state``.

    Args:
      iterator: a grain ``DatasetIterator`` or ``DataLoaderIterator`` (anything with
        ``__next__``, ``get_state`` and ``set_state``), or a grain dataset (it is iterated).
      batch_size: the GLOBAL batch size, summed over processes.
      steps_per_epoch: batches in one pass over the data (None: an endless stream without
        epochs).
      process_count: the processes sharing each global batch (default ``jax.process_count()``).

    Raises:
      ValueError: ``iterator`` cannot save its position, a size is not a positive int, or
        ``batch_size`` does not divide by ``process_count``.

    Example:
      >>> ds = grain.MapDataset.source(records).shuffle(seed=0).repeat().batch(128)
      >>> data = GrainBatches(iter(ds), batch_size=128)
      >>> batch = next(data); state = data.state   # {"grain": {"next_index": 1}}
    """

    def __init__(
        self,
        iterator: Any,
        *,
        batch_size: int,
        steps_per_epoch: int | None = None,
        process_count: int | None = None,
    ):
        if not hasattr(iterator, "get_state") and hasattr(iterator, "__iter__"):
            iterator = iter(iterator)  # a grain dataset: its iterator
        missing = [m for m in ("__next__", "get_state", "set_state") if not hasattr(iterator, m)]
        if missing:
            raise ValueError(
                f"iterator must be a grain iterator (with __next__, get_state and set_state); "
                f"{type(iterator).__name__} has no {', '.join(missing)}."
            )
        self._iterator = iterator
        checks.check_positive_int(batch_size, "batch_size")
        self._steps_per_epoch = checks.check_int(
            steps_per_epoch, "steps_per_epoch", allow_none=True
        )
        super().__init__(batch_size, process_info(0, process_count)[1])

    @property
    def iterator(self) -> Any:
        """The grain iterator adapted."""
        return self._iterator

    @property
    def steps_per_epoch(self) -> int | None:
        return self._steps_per_epoch

    @property
    def state(self) -> dict[str, Any]:
        """The position: ``{"grain": the iterator's get_state()}`` (JSON-able)."""
        state = self._iterator.get_state()
        if isinstance(state, bytes):
            return {_BYTES: state.decode()}
        return {_DICT: state}

    def restore(self, state: Mapping[str, Any]) -> None:
        """Moves to a position saved from :attr:`state` (also after a JSON round trip).

        Raises:
          ValueError: ``state`` is not a mapping with the key ``"grain"`` or ``"grain_json"``.
        """
        if not isinstance(state, Mapping) or not ({_DICT, _BYTES} & set(state)):
            raise ValueError(
                f"state must be a GrainBatches.state ({{'grain': ...}}), got {state!r}."
            )
        if _BYTES in state:
            self._iterator.set_state(state[_BYTES].encode())
        else:
            self._iterator.set_state(state[_DICT])

    def __next__(self) -> Any:
        batch = next(self._iterator)
        for leaf in jax.tree.leaves(batch):
            if np.ndim(leaf) < 1 or np.shape(leaf)[0] != self._local:
                raise ValueError(
                    f"the grain iterator yielded a batch of leading shape {np.shape(leaf)[:1]}; "
                    f"expected local_batch_size = batch_size // process_count = {self._local} "
                    f"(batch the grain dataset by it)."
                )
        return batch

    def close(self) -> None:
        """Stops the grain iterator's prefetch threads or processes, if it has any."""
        close = getattr(self._iterator, "close", None)
        if close is not None:
            close()
