"""In-memory arrays through grain, batch for batch the same as :class:`ShuffledBatches`.

The order is :class:`~deqjax.data.ShuffledBatches`'s: epoch ``e`` visits the examples in the
permutation :func:`epoch_permutation` ``(N, seed, e)``, cut into ``steps_per_epoch = N // B``
global batches of ``B`` (the remainder dropped), and process ``p`` of ``P`` takes the ``p``-th
contiguous slice of ``B / P`` examples of each. Here that order is a grain ``MapDataset`` of this
process's examples (element ``j`` is example ``perm_e[i B + p B/P + o]`` for
``(e, i, o)`` the epoch, batch and offset of ``j``), batched by ``B / P``: grain reads,
batches and prefetches it, and the iterator's position is grain's checkpoint state.
"""

from __future__ import annotations

import copy
import functools
from typing import Any

import numpy as np

from deqjax._src.data.batching import Arrays, ShuffledBatches
from deqjax._src.data.grain_batches import GrainBatches


def grain_shuffled_examples(batches: ShuffledBatches) -> Any:
    """The examples of ``batches``, this process's, in their order: an endless grain dataset.

    Batching it by ``batches.local_batch_size`` gives what ``batches`` yields, batch for batch;
    per-example grain transformations (``.map``, ``.random_map``) may go before the batching.

    Args:
      batches: the :class:`ShuffledBatches` whose order to follow (its position is not read or
        moved).

    Returns:
      A ``grain.MapDataset`` of ``{name: array[...]}`` examples (one per element).
    """
    import grain

    b, local = batches.batch_size, batches.local_batch_size
    offset = batches.process_index * local
    per_epoch = batches.steps_per_epoch * local  # this process's examples in an epoch

    @functools.lru_cache(maxsize=4)  # prefetch threads may read two epochs at once
    def order(epoch: int) -> np.ndarray:
        return copy.copy(batches).order(epoch)  # a copy: .order caches on its object

    def example_index(j: int, _: Any) -> int:
        epoch, r = divmod(j, per_epoch)
        batch, o = divmod(r, local)
        return int(order(epoch)[batch * b + offset + o])

    examples = batches.arrays
    return (
        grain.MapDataset.range(per_epoch)
        .repeat()  # endless: element j of the repeated range knows its epoch from j
        .map_with_index(example_index)
        .map(lambda i: {k: v[i] for k, v in examples.items()})
    )


def grain_shuffled_batches(
    arrays: Arrays,
    *,
    batch_size: int,
    seed: int,
    process_index: int | None = None,
    process_count: int | None = None,
    shuffle: bool = True,
    read_options: Any = None,
) -> GrainBatches:
    """:class:`ShuffledBatches`'s batches read through grain, as :class:`GrainBatches`.

    ``next()`` gives, bit for bit, what ``ShuffledBatches(arrays, batch_size=batch_size,
    seed=seed, ...)`` gives at the same position, in every epoch; ``state`` is grain's position
    (``{"grain": {"next_index": k}}`` after ``k`` batches), restored to the same next batch.

    Args:
      arrays, batch_size, seed, process_index, process_count, shuffle: as
        :class:`ShuffledBatches`.
      read_options: a ``grain.ReadOptions`` (default: 2 reading threads, 16 batches prefetched).

    Raises:
      ValueError: as :class:`ShuffledBatches`.

    Example:
      >>> train, test, _ = load_classification("fashion_mnist")
      >>> data = grain_shuffled_batches(train, batch_size=128, seed=0)
    """
    import grain

    plan = ShuffledBatches(
        arrays,
        batch_size=batch_size,
        seed=seed,
        process_index=process_index,
        process_count=process_count,
        shuffle=shuffle,
    )
    options = read_options or grain.ReadOptions(num_threads=2, prefetch_buffer_size=16)
    batches = grain_shuffled_examples(plan).batch(plan.local_batch_size, drop_remainder=True)
    return GrainBatches(
        iter(batches.to_iter_dataset(options)),
        batch_size=plan.batch_size,
        steps_per_epoch=plan.steps_per_epoch,
        process_count=plan.batch_size // plan.local_batch_size,
    )
