"""Training batches gathered on the devices from a data set placed there once.

A :class:`~deqjax.data.ShuffledBatches` gives the host one batch per step, which the loop then
places on the devices (:meth:`~deqjax.training.DataParallel.put`): on a GPU a host-to-device copy
per step, on a CPU the placement's own cost, more than the gather (BENCHMARKS.md, "The main
job's wall time outside the train steps"). Device residency is a kind of iterator:
:class:`ResidentBatches` of a ShuffledBatches is a :class:`~deqjax.data.Batches` whose batches
are already on the devices (:class:`PlacedBatches`). The arrays are placed once, replicated on
every device, the epoch's order (an int32 ``[N]``) once per epoch, and one compiled program per
step gathers each device's rows of the next global batch, laid out as
:meth:`~deqjax.training.DataParallel.put` lays out a host batch, and advances a device-side
cursor: no host-to-device copy at all per step. :func:`resident_if_fits` chooses it where the
arrays fit in the devices' memory.

The order is the :class:`~deqjax.data.ShuffledBatches`' own (numpy's permutation of ``(seed,
epoch)``) and a gather copies values exactly, so the batches, and a training run, are bit-identical
to the host path's; the position is still the ShuffledBatches' ``state`` (checkpointed and restored
as before).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from deqjax._src.data.batching import Batches, ShuffledBatches
from deqjax._src.training.data_parallel import REPLICATED, SHARDED, DataParallel
from deqjax._src.training.train_state import DEVICE_AXIS

PyTree = Any
# A resident data set may take at most this share of a device's free memory (the rest is the
# model's); devices that report no memory statistics (CPU) are assumed to have room.
MEMORY_FRACTION = 0.5


def nbytes(tree: PyTree) -> int:
    """The bytes of ``tree``'s arrays."""
    return int(sum(np.asarray(x).nbytes for x in jax.tree_util.tree_leaves(tree)))


def fits_on_devices(
    num_bytes: int, devices: list[jax.Device], *, fraction: float = MEMORY_FRACTION
) -> bool:
    """Whether ``num_bytes`` fit in ``fraction`` of each device's free memory (by its
    ``memory_stats()``; a device without them, e.g. a CPU, counts as having room)."""
    for device in devices:
        try:
            stats = device.memory_stats()
        except Exception:  # noqa: BLE001 -- a backend without statistics
            stats = None
        if not stats or "bytes_limit" not in stats:
            continue
        free = stats["bytes_limit"] - stats.get("bytes_in_use", 0)
        if num_bytes > fraction * free:
            return False
    return True


def _of_data(name: str, doc: str) -> property:
    """A read-only property of :class:`ResidentBatches`: its ``data``'s attribute ``name``."""
    return property(lambda self: getattr(self._data, name), doc=doc)


class PlacedBatches:
    """A :class:`~deqjax.data.Batches` whose ``next()`` gives batches already placed where the
    step runs (laid out as :meth:`~deqjax.training.DataParallel.put` lays out a host batch):
    :func:`~deqjax.training.fit` takes them as they are."""

    placed: ClassVar[bool] = True


class ResidentBatches(PlacedBatches):
    """The batches of ``data``, gathered on the devices of ``parallel`` from its arrays placed
    there once; each batch laid out as ``parallel.put(next(data), SHARDED)`` would lay it out,
    with the same values.

    A :class:`~deqjax.data.Batches`: ``next()`` moves ``data`` and returns the placed batch; the
    batch sizes, epochs and position (``state``, ``restore``) are ``data``'s. Each device holds
    every example (the arrays are :data:`REPLICATED`), so each gathers its own rows without
    communicating.

    Args:
      data: the batches' order, position and arrays (the same on every process).
      parallel: how the train step runs over the devices.

    Raises:
      ValueError: ``data`` is not this process's shard (its ``process_index`` or local batch
        disagrees with JAX's), or the global batch does not divide by the device count.

    Example:
      >>> parallel = training.data_parallel("sharded")
      >>> batches = ResidentBatches(data.ShuffledBatches(train, batch_size=128, seed=0), parallel)
      >>> training.fit(pair, state, batches, num_steps=1000, parallel=parallel)
    """

    def __init__(self, data: ShuffledBatches, parallel: DataParallel):
        if (
            data.process_index != jax.process_index()
            or data.local_batch_size * jax.process_count() != data.batch_size
        ):
            raise ValueError(
                f"data must be this process's shard (process {jax.process_index()} of "
                f"{jax.process_count()}), got process_index={data.process_index} with local "
                f"batch {data.local_batch_size} of {data.batch_size}."
            )
        num_devices = len(parallel.devices)
        if data.batch_size % num_devices:
            raise ValueError(
                f"the batch ({data.batch_size}) must be divisible by the number of devices "
                f"({num_devices})."
            )
        if data.num_examples >= 2**31:
            raise ValueError(f"too many examples for int32 indices: {data.num_examples}.")
        self._data = data
        self._parallel = parallel
        self._arrays = parallel.put(data.arrays, REPLICATED)
        self._take = _take_program(parallel, data.batch_size // num_devices)
        self._epoch: int | None = None
        self._order: jax.Array | None = None  # the epoch's order on the devices
        self._cursor: jax.Array | None = None  # the next batch's first row in it, if it is...
        self._cursor_index: int | None = None  # ...this batch of the epoch

    @property
    def data(self) -> ShuffledBatches:
        """The host iterator whose order and position these batches follow."""
        return self._data

    batch_size = _of_data("batch_size", "The global batch size.")
    local_batch_size = _of_data("local_batch_size", "This process's share of each batch.")
    steps_per_epoch = _of_data("steps_per_epoch", "Batches per epoch.")
    state = _of_data("state", "The position: ``next()`` gathers batch ``index`` of ``epoch``.")

    def restore(self, state: Any) -> None:
        """Moves to a position saved from :attr:`state` (see ``ShuffledBatches.restore``)."""
        self._data.restore(state)

    def __iter__(self) -> Iterator[PyTree]:
        return self

    def __next__(self) -> PyTree:
        epoch, index = self._data.next_position()
        if epoch != self._epoch:
            order = self._data.order(epoch).astype(np.int32)
            self._order = self._parallel.put(order, REPLICATED)
            self._epoch, self._cursor_index = epoch, None
        if index != self._cursor_index:  # a new epoch, or a restored position
            start = np.int32(index * self._data.batch_size)
            self._cursor = self._parallel.put(start, REPLICATED)
        batch, self._cursor = self._take(self._arrays, self._order, self._cursor)
        self._cursor_index = index + 1
        return batch


def _take_program(
    parallel: DataParallel, per_device: int
) -> Callable[[PyTree, jax.Array, jax.Array], tuple[PyTree, jax.Array]]:
    """``take(arrays, order, start) -> (batch, start + batch size)`` over ``parallel``'s devices:
    device ``d`` takes the examples ``order[start + d * per_device :][:per_device]``."""
    batch_size = per_device * len(parallel.devices)

    def one_device(arrays: PyTree, order: jax.Array, start: jax.Array):
        offset = start + jax.lax.axis_index(DEVICE_AXIS) * per_device
        rows = jax.lax.dynamic_slice_in_dim(order, offset, per_device)  # [per_device]
        batch = jax.tree_util.tree_map(lambda x: jnp.take(x, rows, axis=0), arrays)
        return batch, start + batch_size

    return parallel.map(one_device, (REPLICATED, REPLICATED, REPLICATED), (SHARDED, REPLICATED))


def resident_if_fits(
    data: ShuffledBatches, parallel: DataParallel, say: Callable[[str], None] | None = None
) -> Batches:
    """:class:`ResidentBatches` of ``data`` where its arrays fit in the devices' memory
    (:func:`fits_on_devices`), else ``data`` itself (placed batch by batch): the same batches
    either way.

    Args:
      data: the training batches.
      parallel: how the train step runs over the devices.
      say: where the line naming the choice goes (None: silent).
    """
    size, devices = nbytes(data.arrays), parallel.local_devices
    fits = fits_on_devices(size, devices)
    if say is not None and fits:
        say(
            f"training data on the devices: {size / 2**20:.1f} MiB on each of "
            f"{len(devices)} device(s), placed once"
        )
    elif say is not None:
        say(
            f"training data ({size / 2**20:.1f} MiB) does not fit on the devices: each batch is "
            f"placed from the host"
        )
    return ResidentBatches(data, parallel) if fits else data


def placed_batches(data: Batches, parallel: DataParallel) -> Iterator[PyTree]:
    """The training loop's batches of ``data``, placed where ``parallel`` runs the step: a
    :class:`PlacedBatches` as it is, any other ``Batches`` each host batch placed with
    ``parallel.put``."""
    if isinstance(data, PlacedBatches):
        return data
    return _put_each(data, parallel)


def _put_each(data: Batches, parallel: DataParallel) -> Iterator[PyTree]:
    """Each host batch of ``data`` placed with ``parallel.put``, until ``data`` runs out."""
    while True:
        try:
            batch = next(data)
        except StopIteration:
            return
        yield parallel.put(batch, SHARDED)
