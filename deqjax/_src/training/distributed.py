"""Multi-host start-up: ``jax.distributed.initialize`` from flags or environment variables.

Every process of a multi-host run calls :func:`initialize_distributed` once, before any other JAX
call, with the same coordinator address (``host:port`` of process 0) and process count and its own
process id. Afterwards the data-parallel step's collectives (sharded or ``jax.pmap``) span all
processes' devices, and each process feeds its local devices with its own shard of the data
(:class:`~deqjax.data.ShuffledBatches` shards by ``jax.process_index()``). On CPU the cross-process
collectives use gloo (bundled with jaxlib).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import NamedTuple

import jax

ENV_COORDINATOR = "DEQJAX_COORDINATOR_ADDRESS"
ENV_NUM_PROCESSES = "DEQJAX_NUM_PROCESSES"
ENV_PROCESS_ID = "DEQJAX_PROCESS_ID"


class DistributedConfig(NamedTuple):
    """Where the coordinator is, how many processes take part, and which one this is."""

    coordinator_address: str  # "host:port" of process 0
    num_processes: int
    process_id: int


def distributed_config(
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    *,
    environ: Mapping[str, str] | None = None,
) -> DistributedConfig | None:
    """Resolves the multi-host configuration: explicit values first, then environment variables.

    Returns:
      ``None`` for a single-process run (no coordinator address anywhere, or one process),
      else the validated :class:`DistributedConfig`.

    Raises:
      ValueError: if the configuration is incomplete or inconsistent (naming the missing value).
    """
    env = os.environ if environ is None else environ
    if coordinator_address is None:
        coordinator_address = env.get(ENV_COORDINATOR) or None
    if num_processes is None and env.get(ENV_NUM_PROCESSES):
        num_processes = int(env[ENV_NUM_PROCESSES])
    if process_id is None and env.get(ENV_PROCESS_ID):
        process_id = int(env[ENV_PROCESS_ID])
    if coordinator_address is None and num_processes in (None, 1):
        return None
    if coordinator_address is None:
        raise ValueError(
            f"coordinator_address (or {ENV_COORDINATOR}) is required when num_processes="
            f"{num_processes}."
        )
    if num_processes is None or num_processes < 1:
        raise ValueError(
            f"num_processes (or {ENV_NUM_PROCESSES}) must be >= 1, got {num_processes}."
        )
    if num_processes == 1:
        return None
    if process_id is None or not 0 <= process_id < num_processes:
        raise ValueError(
            f"process_id (or {ENV_PROCESS_ID}) must be in [0, {num_processes}), got {process_id}."
        )
    if ":" not in coordinator_address:
        raise ValueError(f"coordinator_address must be 'host:port', got {coordinator_address!r}.")
    return DistributedConfig(coordinator_address, int(num_processes), int(process_id))


def initialize_distributed(
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    *,
    timeout_s: int = 300,
    environ: Mapping[str, str] | None = None,
) -> DistributedConfig | None:
    """Joins a multi-host run (a no-op for a single process). Call before any other JAX call.

    Args:
      coordinator_address, num_processes, process_id: as in ``jax.distributed.initialize``;
        ``None`` falls back to the ``DEQJAX_*`` environment variables.
      timeout_s: how long to wait for all processes to connect before failing (never forever).
      environ: environment to read (default ``os.environ``).

    Returns:
      The configuration used, or ``None`` when running as a single process.

    Raises:
      ValueError: for an incomplete or inconsistent configuration.
    """
    config = distributed_config(coordinator_address, num_processes, process_id, environ=environ)
    if config is None:
        return None
    # Cross-process collectives on CPU need an implementation; gloo ships with jaxlib.
    if jax.config.jax_cpu_collectives_implementation is None:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        coordinator_address=config.coordinator_address,
        num_processes=config.num_processes,
        process_id=config.process_id,
        initialization_timeout=int(timeout_s),
    )
    return config
