"""The devices-and-hosts section: ``--parallel``, ``--coordinator_address``, ``--num_processes``,
``--process_id``.

``--parallel sharded`` (the default) trains data-parallel with ``jax.jit`` over a mesh of every
device, each device solving its own shard inside ``jax.shard_map``; ``--parallel pmap`` with
``jax.pmap`` (the same numbers). See :mod:`deqjax._src.training.data_parallel`. The runner builds
the :class:`~deqjax.training.DataParallel` once (:meth:`MultiHostConfig.data_parallel`) and hands
it to the run (``ctx.data_parallel``).

An experiment whose configuration holds a :class:`MultiHostConfig` joins a multi-host run before
anything else (the runner calls :meth:`MultiHostConfig.initialize`). Unset flags fall back to the
environment variables ``DEQJAX_COORDINATOR_ADDRESS``, ``DEQJAX_NUM_PROCESSES`` and
``DEQJAX_PROCESS_ID`` (:func:`deqjax.training.initialize_distributed`); none set: one process.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar, Literal

from deqjax._src.training.data_parallel import DataParallel, data_parallel
from deqjax._src.training.distributed import DistributedConfig, initialize_distributed


@dataclasses.dataclass(frozen=True)
class MultiHostConfig:
    """Devices and hosts: how steps run over the devices, and (jax.distributed) where process 0
    listens, how many processes, which one."""

    # The two ways give the same numbers: a run may resume the other way (with --force).
    SAFE_ON_RESUME: ClassVar[tuple[str, ...]] = ("parallel",)

    coordinator_address: str | None = None
    """host:port of process 0 (env DEQJAX_COORDINATOR_ADDRESS); unset: single process"""
    num_processes: int | None = None  # process count (env DEQJAX_NUM_PROCESSES)
    process_id: int | None = None  # this process's id (env DEQJAX_PROCESS_ID)
    parallel: Literal["sharded", "pmap"] = "sharded"
    """data parallel over every device: sharded (jax.jit + shard_map) or pmap"""

    def initialize(self) -> DistributedConfig | None:
        """Joins the multi-host run these flags (or the environment) describe; None: one
        process. Call before any other JAX call."""
        return initialize_distributed(self.coordinator_address, self.num_processes, self.process_id)

    def data_parallel(self) -> DataParallel:
        """The :class:`~deqjax.training.DataParallel` of ``--parallel`` over every device (call
        after :meth:`initialize`)."""
        return data_parallel(self.parallel)
