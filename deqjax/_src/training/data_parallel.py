"""Data parallelism: one per-device function run over every device, two ways.

A training, evaluation or diagnostics step is written once, for one device's share of the batch,
with its collectives (``pmean``, ``psum``, ``axis_index``) over the axis ``"batch"``. A
:class:`DataParallel` runs it over the devices and places its arguments:

- :class:`Sharded` (the default, ``--parallel sharded``): ``jax.jit`` of ``jax.shard_map`` over a
  one-axis mesh (``jax.make_mesh``): the batch is one global array sharded along its first axis
  (built from each process's rows with ``jax.make_array_from_process_local_data``), the state one
  replicated array. Inside ``shard_map`` each device runs its own solver loops: a DEQ's stopping
  rule reads only its own examples, so no collective runs inside a solver loop and each device
  stops when its own examples are done (under a sharded ``jit`` without ``shard_map`` a
  batch-wide predicate is an all-reduce per iteration). The ``shard_map`` is checked
  (``check_vma=True``): JAX types each value by whether it varies over ``"batch"``, so a result
  declared :data:`REPLICATED` that is not the same on every device (not reduced with ``pmean``,
  ``psum``, ...) is refused when the step is traced, where unchecked it gave one device's value.
  A replicated argument that a per-device loss differentiates is cast to varying first
  (:func:`~deqjax.training.train_step` does), so that its gradient is the device's own, averaged
  afterwards, as under ``pmap``; the solvers' loops start from a carry typed like their body's
  (``deqjax._src.vma``): no data moves and no collective runs for either.
- :class:`Pmapped` (``--parallel pmap``): ``jax.pmap`` over the same devices; arrays carry a
  leading axis of one entry per local device (:func:`~deqjax.training.replicate`,
  :func:`~deqjax.training.shard`).

Both give the same numbers: the same per-device function sees the same shares. Each argument and
result has a *kind* (a prefix tree of them matches a pytree): :data:`REPLICATED` (one value, the
same on every device), :data:`SHARDED` (split along its first axis, the batch) or
:data:`PER_DEVICE` (one value per device, e.g. a recurrent carry; on the host a stack with one
entry per local device).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, Literal

import jax
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from deqjax._src.training.train_state import (
    DEVICE_AXIS,
    TrainState,
    device_sharding,
    replicate,
    shard,
    unreplicate,
)

PyTree = Any
Kind = Literal["replicated", "sharded", "per_device"]
REPLICATED: Kind = "replicated"
SHARDED: Kind = "sharded"
PER_DEVICE: Kind = "per_device"
MODES = ("sharded", "pmap")
# A train state's kinds: everything replicated but the carry (each device's own).
STATE_KINDS = TrainState(REPLICATED, REPLICATED, REPLICATED, REPLICATED, REPLICATED, PER_DEVICE)


def _by_kind(fn: Callable[[Kind, PyTree], PyTree], kinds: PyTree, tree: PyTree) -> PyTree:
    """``fn(kind, subtree)`` for each leaf of the prefix tree ``kinds`` and its subtree."""
    return jax.tree_util.tree_map(fn, kinds, tree, is_leaf=lambda k: isinstance(k, str))


def _check_rows(x: np.ndarray, n: int) -> None:
    if x.ndim == 0 or x.shape[0] % n:
        raise ValueError(
            f"batch leading dimension {x.shape[:1]} must be divisible by the number of local "
            f"devices ({n})."
        )


@dataclasses.dataclass(frozen=True)
class DataParallel:
    """How a per-device function runs over ``devices`` (every process's), and where its
    arguments live. Build one with :func:`data_parallel`."""

    devices: tuple[jax.Device, ...]

    @property
    def local_devices(self) -> list[jax.Device]:
        """This process's share of :attr:`devices`."""
        return [d for d in self.devices if d.process_index == jax.process_index()]

    def map(
        self,
        fn: Callable[..., PyTree],
        in_kinds: tuple[PyTree, ...],
        out_kinds: PyTree,
        *,
        donate_argnums: tuple[int, ...] = (),
    ) -> Callable[..., PyTree]:
        """``fn`` (written for one device, collectives over ``"batch"``) over the devices."""
        raise NotImplementedError

    def map_update(
        self, update: Callable[[TrainState, PyTree], tuple[TrainState, PyTree]], *, donate=True
    ) -> Callable[[TrainState, PyTree], tuple[TrainState, PyTree]]:
        """A train step's ``update(state, batch) -> (state, metrics)`` (e.g.
        :func:`~deqjax.training.train_step`'s) over the devices: the state placed as
        :data:`STATE_KINDS` (its buffers donated), the batch :data:`SHARDED`, the metrics
        :data:`REPLICATED` (on the device: read them with ``get(metrics, REPLICATED)``)."""
        donate_argnums = (0,) if donate else ()
        kinds = (STATE_KINDS, SHARDED), (STATE_KINDS, REPLICATED)
        return self.map(update, *kinds, donate_argnums=donate_argnums)

    def put(self, tree: PyTree, kinds: PyTree) -> PyTree:
        """Places this process's host values (numpy or arrays) on the devices: a
        :data:`SHARDED` leaf holds this process's rows, a :data:`PER_DEVICE` leaf one entry per
        local device."""
        raise NotImplementedError

    def saveable(self, tree: PyTree, kinds: PyTree) -> PyTree:
        """Placed values as a checkpoint holds them, independent of the number of devices where
        the layout allows (:class:`~deqjax.training.Checkpointer` writes global arrays as laid
        out); :meth:`put` places a restored one again."""
        raise NotImplementedError

    def get(self, tree: PyTree, kinds: PyTree) -> PyTree:
        """This process's view of placed values on the host (numpy): the value of a
        :data:`REPLICATED` leaf, this process's rows of a :data:`SHARDED` one, its local
        devices' entries of a :data:`PER_DEVICE` one. A device sync."""
        raise NotImplementedError


@dataclasses.dataclass(frozen=True)
class Pmapped(DataParallel):
    """``jax.pmap`` over the devices; every placed array has a leading per-device axis."""

    def map(self, fn, in_kinds, out_kinds, *, donate_argnums=()):
        del in_kinds, out_kinds  # pmap maps every argument's leading (device) axis
        # None: pmap's own default, every process's local devices (a multi-host run needs it).
        devices = None if self.devices == tuple(jax.devices()) else list(self.devices)
        return jax.pmap(fn, axis_name=DEVICE_AXIS, devices=devices, donate_argnums=donate_argnums)

    def put(self, tree, kinds):
        local = self.local_devices

        def put(kind, sub):
            if kind == REPLICATED:
                return replicate(sub, local)
            if kind == SHARDED:
                return shard(sub, local)
            return jax.device_put(sub, device_sharding(local))

        return _by_kind(put, kinds, tree)

    def saveable(self, tree, kinds):
        return self.get(tree, kinds)  # the first replica: no per-device axis

    def get(self, tree, kinds):
        def get(kind, sub):
            if kind == REPLICATED:
                return unreplicate(sub)
            gathered = jax.tree_util.tree_map(_local_rows, sub)
            if kind == SHARDED:  # [devices, rows, ...] -> [rows, ...]
                return jax.tree_util.tree_map(lambda x: x.reshape(-1, *x.shape[2:]), gathered)
            return gathered

        return _by_kind(get, kinds, tree)


@dataclasses.dataclass(frozen=True)
class Sharded(DataParallel):
    """``jax.jit`` of ``jax.shard_map`` over a one-axis mesh named ``"batch"``."""

    @property
    def mesh(self) -> jax.sharding.Mesh:
        """The devices as a one-axis mesh (``jax.make_mesh``), its axis ``Auto``: arrays placed
        on it keep JAX's automatic sharding outside the mapped steps."""
        return jax.make_mesh(
            (len(self.devices),),
            (DEVICE_AXIS,),
            axis_types=(jax.sharding.AxisType.Auto,),
            devices=self.devices,
        )

    def _spec(self, kind: Kind) -> P:
        return P() if kind == REPLICATED else P(DEVICE_AXIS)

    def map(self, fn, in_kinds, out_kinds, *, donate_argnums=()):
        def one_device(*args):
            # A PER_DEVICE leaf arrives as this device's [1, ...] block: drop that axis.
            args = _by_kind(_unstack_if_per_device, in_kinds, args)
            out = fn(*args)
            return _by_kind(_stack_if_per_device, out_kinds, out)

        mesh = self.mesh
        mapped = jax.shard_map(
            one_device,
            mesh=mesh,
            in_specs=tuple(_spec_tree(self._spec, k) for k in in_kinds),
            out_specs=_spec_tree(self._spec, out_kinds),
            check_vma=True,
        )
        # The results laid out as put lays out their kinds: left to XLA, a result gathered from a
        # replicated operand comes back replicated on a one-device mesh, and a step fed it would
        # compile again for that layout.
        out_shardings = _spec_tree(lambda k: NamedSharding(mesh, self._spec(k)), out_kinds)
        return jax.jit(mapped, donate_argnums=donate_argnums, out_shardings=out_shardings)

    def put(self, tree, kinds):
        mesh = self.mesh
        n_local = len(self.local_devices)

        def put(kind, sub):
            sharding = NamedSharding(mesh, self._spec(kind))

            def one(x):
                if isinstance(x, jax.Array) and x.sharding == sharding:
                    return x  # already laid out (e.g. restored from a checkpoint)
                x = np.asarray(x)
                if kind == REPLICATED:
                    return jax.make_array_from_process_local_data(sharding, x, x.shape)
                _check_rows(x, n_local)
                return jax.make_array_from_process_local_data(sharding, x)

            return jax.tree_util.tree_map(one, sub)

        return _by_kind(put, kinds, tree)

    def saveable(self, tree, kinds):
        del kinds  # global arrays: replicated values fit any mesh, sharded ones are written
        return tree  # by the processes that hold them

    def get(self, tree, kinds):
        def get(kind, sub):
            if kind == REPLICATED:
                return jax.tree_util.tree_map(
                    lambda x: np.asarray(x.addressable_shards[0].data), sub
                )
            return jax.tree_util.tree_map(_local_rows, sub)

        return _by_kind(get, kinds, tree)


def _unstack_if_per_device(kind: Kind, sub: PyTree) -> PyTree:
    return jax.tree_util.tree_map(lambda x: x[0], sub) if kind == PER_DEVICE else sub


def _stack_if_per_device(kind: Kind, sub: PyTree) -> PyTree:
    return jax.tree_util.tree_map(lambda x: x[None], sub) if kind == PER_DEVICE else sub


def _spec_tree(spec: Callable[[Kind], P], kinds: PyTree) -> PyTree:
    return jax.tree_util.tree_map(spec, kinds, is_leaf=lambda k: isinstance(k, str))


def _local_rows(x: jax.Array) -> np.ndarray:
    """This process's shards of ``x`` along its first axis, in order, as one host array."""
    shards = sorted(x.addressable_shards, key=lambda sh: sh.index[0].start or 0)
    return np.concatenate([np.asarray(sh.data) for sh in shards])


def data_parallel(
    mode: str = "sharded", devices: Sequence[jax.Device] | None = None
) -> DataParallel:
    """The :class:`DataParallel` of ``mode`` over ``devices``.

    Args:
      mode: ``"sharded"`` (``jax.jit`` + ``jax.shard_map``; the default) or ``"pmap"``.
      devices: every device to run on, of every process (default ``jax.devices()``); a subset
        only in a single-process run.

    Raises:
      ValueError: an unknown ``mode``, or no devices.
    """
    if mode not in MODES:
        raise ValueError(f"parallel must be one of {MODES}, got {mode!r}.")
    devices = tuple(jax.devices() if devices is None else devices)
    if not devices:
        raise ValueError("devices is empty.")
    return (Sharded if mode == "sharded" else Pmapped)(devices)
