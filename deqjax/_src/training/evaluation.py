"""Steps that measure without training: evaluation over a whole data set (masked sums per batch,
means at the end) and occasional diagnostics on the current batch."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from deqjax._src import vma
from deqjax._src.training.data_parallel import (
    REPLICATED,
    SHARDED,
    STATE_KINDS,
    DataParallel,
    data_parallel,
)
from deqjax._src.training.train_state import TrainState
from deqjax._src.training.train_step import AXIS, Metrics, as_float, reduce_metrics

PyTree = Any
EvalFn = Callable[[PyTree, PyTree], Mapping[str, jax.Array]]
DiagnosticsFn = Callable[[PyTree, PyTree, jax.Array, PyTree], Metrics]


def make_eval_step(
    eval_fn: EvalFn,
    parallel: DataParallel | None = None,
    *,
    devices: Sequence[jax.Device] | None = None,
) -> Callable[[PyTree, PyTree, jax.Array], Metrics]:
    """Builds the data-parallel evaluation step ``(params, batch, mask) -> sums``.

    Args:
      eval_fn: ``(params, batch) -> {name: per-example values [B]}`` (e.g. ``{"accuracy":
        argmax == label, "loss": per-example cross entropy}``).
      parallel: how the step runs over the devices (:func:`~deqjax.training.data_parallel`).
      devices: instead of ``parallel``, ``jax.pmap`` over these devices (default: every
        process's), as ``data_parallel("pmap", devices)``.

    Returns:
      ``eval_step(params, batch, mask)`` with ``params`` placed :data:`REPLICATED`, ``batch`` and
      ``mask [B]`` (0 on padding, see :func:`~deqjax._src.data.batching.eval_batches`) placed
      :data:`SHARDED`; returns all-device totals ``{name: Σ mask·value, "count": Σ mask}``
      (replicated), and for names ending in ``_max`` the max over real examples.
      :func:`evaluate` turns them into means.

    Raises:
      ValueError: ``eval_fn`` is not callable, or both ``parallel`` and ``devices`` are given.
    """
    if not callable(eval_fn):
        raise ValueError(f"eval_fn must be callable, got {type(eval_fn).__name__}.")

    def step(params, batch, mask):
        values = eval_fn(params, batch)
        out = {"count": jax.lax.psum(jnp.sum(mask), AXIS)}
        for name, v in values.items():
            v = as_float(jax.lax.stop_gradient(v))
            if v.shape != mask.shape:
                raise ValueError(
                    f"eval_fn must return per-example values of shape {mask.shape}; "
                    f"{name!r} has shape {v.shape}."
                )
            m = mask.astype(v.dtype)
            if name.endswith("_max"):
                out[name] = jax.lax.pmax(jnp.max(jnp.where(m > 0, v, -jnp.inf)), AXIS)
            else:
                out[name] = jax.lax.psum(jnp.sum(m * v), AXIS)
        return out

    parallel = _parallel(parallel, devices)
    return parallel.map(step, (REPLICATED, SHARDED, SHARDED), REPLICATED)


def evaluate(
    eval_step: Callable[[PyTree, PyTree, jax.Array], Metrics],
    params: PyTree,
    batches: Iterable[tuple[PyTree, np.ndarray]],
    parallel: DataParallel | None = None,
    *,
    devices: Sequence[jax.Device] | None = None,
    placed: bool = False,
) -> dict[str, float]:
    """Means of ``eval_fn``'s per-example values over all ``batches`` (one host sync at the end).

    Args:
      eval_step: from :func:`make_eval_step`.
      params: parameters placed :data:`REPLICATED` (``state.params`` of the placed train state).
      batches: ``(batch, mask)`` pairs of this process's shard, e.g. from
        :func:`~deqjax._src.data.batching.eval_batches` (the same number of batches on every
        process); placed here unless ``placed``.
      parallel: the ``eval_step``'s (:func:`make_eval_step`).
      devices: instead of ``parallel``, as in :func:`make_eval_step`.
      placed: the pairs are already on the devices (each ``parallel.put(pair, SHARDED)``, e.g.
        an evaluation set placed once for every evaluation).

    Returns:
      ``{name: Σ mask·value / Σ mask}`` (``_max`` names: the max), plus ``"count"``, the number
      of real examples over all processes.
    """
    # Every batch's totals stay on the device until one read at the end (no eager device ops
    # per batch: on a GPU each is a dispatch, the first of each kind a compilation).
    parallel = _parallel(parallel, devices)
    put = (lambda pair: pair) if placed else (lambda pair: parallel.put(pair, SHARDED))
    outs = [eval_step(params, *put(pair)) for pair in batches]
    if not outs:
        raise ValueError("batches is empty: nothing to evaluate.")
    per_batch = [parallel.get(out, REPLICATED) for out in outs]  # all dispatched: each waits
    host = {
        k: (np.max if k.endswith("_max") else np.sum)([np.asarray(o[k]) for o in per_batch])
        for k in per_batch[0]
    }
    count = float(host["count"])
    return {
        k: float(v) if k.endswith("_max") or k == "count" else float(v) / max(count, 1.0)
        for k, v in host.items()
    }


def make_diagnostics_step(
    diagnostics_fn: DiagnosticsFn,
    parallel: DataParallel | None = None,
    *,
    devices: Sequence[jax.Device] | None = None,
) -> Callable[[TrainState, PyTree], Metrics]:
    """Builds a data-parallel ``(state, batch) -> metrics`` for occasional, costly monitors.

    For diagnostics computed every k steps only (backward-solve residual, ‖J‖_F estimate,
    spectral radius). Its key is derived from ``state.rng`` without advancing it, so running it or
    not leaves training bit-identical.

    Args:
      diagnostics_fn: ``(params, batch, key, reg_state) -> {name: scalar}`` (reduced across
        devices by the suffix rule of :func:`~deqjax.training.reduce_metrics`).
      parallel, devices: as in :func:`make_eval_step`.

    Returns:
      ``step(state, batch)`` with ``state`` placed as :data:`STATE_KINDS` and ``batch``
      :data:`SHARDED`; the metrics come back :data:`REPLICATED`.

    Raises:
      ValueError: if ``diagnostics_fn`` is not callable.
    """
    if not callable(diagnostics_fn):
        raise ValueError(f"diagnostics_fn must be callable, got {type(diagnostics_fn).__name__}.")

    def step(state: TrainState, batch: PyTree) -> Metrics:
        key = jax.random.fold_in(jax.random.fold_in(state.rng, 0x0D1A6), jax.lax.axis_index(AXIS))
        # Varying by device inside a checked shard_map: a gradient in the diagnostics is this
        # device's (then reduced), as under pmap.
        params = vma.vary_over(state.params, AXIS)
        metrics = diagnostics_fn(params, batch, key, state.reg_state)
        return reduce_metrics(metrics, AXIS)

    parallel = _parallel(parallel, devices)
    return parallel.map(step, (STATE_KINDS, SHARDED), REPLICATED)


def _parallel(parallel: DataParallel | None, devices: Sequence[jax.Device] | None) -> DataParallel:
    """``parallel``, or (given ``devices`` or nothing) ``jax.pmap`` over ``devices``."""
    if parallel is not None and devices is not None:
        raise ValueError("pass parallel or devices, not both.")
    return parallel if parallel is not None else data_parallel("pmap", devices)
