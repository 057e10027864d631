"""The training state carried through the data-parallel step, and its placement for ``jax.pmap``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

PyTree = Any
# Name of the pmapped axis, and of the mesh axis replicated / sharded arrays are laid out on: they
# must agree, or every step whose inputs come from replicate()/shard() compiles anew.
DEVICE_AXIS = "batch"


class TrainState(NamedTuple):
    """Everything a training step reads and writes; the unit that is checkpointed.

    Inside the pmapped step each leaf is one replica; outside it every leaf has a leading axis of
    size ``jax.local_device_count()`` (see :func:`replicate`).
    """

    params: PyTree  # model parameters (e.g. a Haiku params dict)
    opt_state: PyTree  # optax optimizer state
    rng: jax.Array  # uint32 [2]: raw PRNG key, split once per step
    step: jax.Array  # int32 []: number of optimizer updates applied so far
    reg_state: PyTree = ()  # regularizer/controller state, e.g. an AdaptiveGammaState; any pytree
    # recurrent state carried from one batch to the next (e.g. a language model's memory); one
    # per device (each device's shard of the stream has its own); () when unused
    carry: PyTree = ()


def create_train_state(
    params: PyTree,
    optimizer: optax.GradientTransformation,
    rng: jax.Array,
    *,
    reg_state: PyTree = (),
    carry: PyTree = (),
) -> TrainState:
    """A fresh :class:`TrainState` at step 0 (unreplicated).

    Args:
      params: initial model parameters.
      optimizer: the optax transformation whose ``init`` builds ``opt_state``.
      rng: a ``jax.random`` key, raw (``uint32[2]``) or typed (``jax.random.key``); stored raw so
        that checkpoints hold plain arrays.
      reg_state: initial regularizer state (default: none).
      carry: initial recurrent state carried across steps (default: none), e.g. zero memory.

    Raises:
      ValueError: if ``rng`` is not a key.
    """
    rng = jnp.asarray(rng) if not isinstance(rng, jax.Array) else rng
    if jnp.issubdtype(rng.dtype, jax.dtypes.prng_key):
        rng = jax.random.key_data(rng)
    if rng.dtype != jnp.uint32 or rng.ndim != 1:
        raise ValueError(f"rng must be a jax.random key, got dtype {rng.dtype} shape {rng.shape}.")
    return TrainState(
        params=params,
        opt_state=jax.jit(optimizer.init)(params),  # one compilation, not one per leaf op
        rng=rng,
        step=jnp.zeros((), jnp.int32),
        reg_state=reg_state,
        carry=carry,
    )


def device_sharding(devices: Sequence[jax.Device] | None = None) -> jax.sharding.NamedSharding:
    """Sharding of an array whose leading axis is split over ``devices`` (default: local ones)."""
    devices = list(jax.local_devices() if devices is None else devices)
    mesh = jax.sharding.Mesh(np.asarray(devices), (DEVICE_AXIS,))
    return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(DEVICE_AXIS))


def replicate(tree: PyTree, devices: Sequence[jax.Device] | None = None) -> PyTree:
    """Stacks one copy of every leaf per device: ``x -> [num_devices, *x.shape]`` on ``devices``.

    The result is what a ``jax.pmap``-ed function over ``devices`` expects for a replicated
    argument (``jax.device_put_replicated`` no longer exists in this JAX).
    """
    devices = list(jax.local_devices() if devices is None else devices)
    sharding = device_sharding(devices)
    n = len(devices)

    def put(x):
        x = np.asarray(x)
        return jax.device_put(np.broadcast_to(x[None], (n, *x.shape)), sharding)

    return jax.tree_util.tree_map(put, tree)


def shard(tree: PyTree, devices: Sequence[jax.Device] | None = None) -> PyTree:
    """Splits a host batch ``[B, ...]`` into ``[num_devices, B // num_devices, ...]`` on devices.

    Raises:
      ValueError: if ``B`` is not divisible by the number of devices.
    """
    devices = list(jax.local_devices() if devices is None else devices)
    sharding = device_sharding(devices)
    n = len(devices)

    def put(x):
        x = np.asarray(x)
        if x.ndim == 0 or x.shape[0] % n:
            raise ValueError(
                f"batch leading dimension {x.shape[:1]} must be divisible by the number of local "
                f"devices ({n})."
            )
        return jax.device_put(x.reshape(n, x.shape[0] // n, *x.shape[1:]), sharding)

    return jax.tree_util.tree_map(put, tree)


def unreplicate(tree: PyTree) -> PyTree:
    """The first local replica of every leaf, fetched to the host as numpy (a device sync)."""

    def first(x):
        if isinstance(x, jax.Array):
            return np.asarray(x.addressable_shards[0].data)[0]
        return np.asarray(x)[0]

    return jax.tree_util.tree_map(first, tree)


def stack(tree: PyTree, n: int) -> PyTree:
    """One copy of every leaf per device: ``[n, *x.shape]`` host arrays (a per-device carry)."""
    return jax.tree_util.tree_map(lambda x: np.stack([np.asarray(x)] * n), tree)
