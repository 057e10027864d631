"""The multi-host section: ``--coordinator_address``, ``--num_processes``, ``--process_id``.

An experiment whose configuration holds a :class:`MultiHostConfig` joins a multi-host run before
anything else (the runner calls :meth:`MultiHostConfig.initialize`). Unset flags fall back to the
environment variables ``DEQJAX_COORDINATOR_ADDRESS``, ``DEQJAX_NUM_PROCESSES`` and
``DEQJAX_PROCESS_ID`` (:func:`deqjax.training.initialize_distributed`); none set: one process.
"""

from __future__ import annotations

import dataclasses

from deqjax._src.training.distributed import DistributedConfig, initialize_distributed


@dataclasses.dataclass(frozen=True)
class MultiHostConfig:
    """Multi-host (jax.distributed): where process 0 listens, how many processes, which one."""

    coordinator_address: str | None = None
    """host:port of process 0 (env DEQJAX_COORDINATOR_ADDRESS); unset: single process"""
    num_processes: int | None = None  # process count (env DEQJAX_NUM_PROCESSES)
    process_id: int | None = None  # this process's id (env DEQJAX_PROCESS_ID)

    def initialize(self) -> DistributedConfig | None:
        """Joins the multi-host run these flags (or the environment) describe; None: one
        process. Call before any other JAX call."""
        return initialize_distributed(self.coordinator_address, self.num_processes, self.process_id)
