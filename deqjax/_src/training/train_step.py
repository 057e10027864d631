"""Data-parallel training and evaluation steps: ``jax.pmap`` over local devices, ``lax.pmean``.

The same step runs on one device, on N local devices and on N hosts (after
:func:`~deqjax.training.initialize_distributed`): each process passes arrays whose leading axis is
its local device count, and the collectives span every device of every process.

Metric reduction across devices follows the metric's name: a key ending in ``_max`` is reduced
with ``pmax``, ``_min`` with ``pmin``, ``_sum`` with ``psum``; every other key with ``pmean`` (a
mean of per-device means, i.e. the global-batch mean when devices hold equal batches).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from deqjax._src import adjoints
from deqjax._src.training.train_state import DEVICE_AXIS, TrainState, create_train_state

PyTree = Any
Metrics = dict[str, jax.Array]
LossFn = Callable[[PyTree, PyTree, jax.Array, PyTree, jax.Array], tuple[jax.Array, Metrics]]
RegUpdateFn = Callable[[PyTree, Metrics, jax.Array], PyTree]
AXIS = DEVICE_AXIS


def _as_float(x: jax.typing.ArrayLike) -> jax.Array:
    x = jnp.asarray(x)
    return x if jnp.issubdtype(x.dtype, jnp.floating) else x.astype(jnp.float32)


def reduce_metrics(metrics: Mapping[str, jax.Array], axis_name: str) -> Metrics:
    """Reduces scalar metrics over ``axis_name`` by the suffix rule of this module's docstring."""
    out = {}
    for name, value in metrics.items():
        value = _as_float(jax.lax.stop_gradient(value))
        if name.endswith("_max"):
            out[name] = jax.lax.pmax(value, axis_name)
        elif name.endswith("_min"):
            out[name] = jax.lax.pmin(value, axis_name)
        elif name.endswith("_sum"):
            out[name] = jax.lax.psum(value, axis_name)
        else:
            out[name] = jax.lax.pmean(value, axis_name)
    return out


class TrainStep(NamedTuple):
    """An optax-style pair of pure functions: ``init`` builds the state, ``update`` steps it.

    ``init(params, rng, *, reg_state=(), carry=()) -> TrainState`` (step 0, unreplicated);
    ``update(state, batch) -> (state, metrics)``: one optimizer step on one device's share of the
    batch. Neither is mapped or jitted: :func:`~deqjax.training.fit` and
    :func:`make_train_step` ``pmap`` ``update`` over devices (its collectives use
    ``axis_name``); with ``axis_name=None`` it runs under plain ``jax.jit`` on one device.
    """

    init: Callable[..., TrainState]
    update: Callable[[TrainState, PyTree], tuple[TrainState, Metrics]]


def train_step(
    loss_fn: LossFn,
    optimizer: optax.GradientTransformation,
    *,
    update_reg_state: RegUpdateFn | None = None,
    learning_rate_fn: optax.Schedule | None = None,
    per_device_rng: bool = True,
    axis_name: str | None = AXIS,
    backward_stats: bool = False,
    with_carry: bool = False,
) -> TrainStep:
    """Builds the :class:`TrainStep` pair (pure, unmapped) from a loss function.

    ``update`` per device: split ``state.rng``; ``(loss, metrics), grads = value_and_grad(loss_fn)
    (params, batch, key, reg_state, step)``; ``grads = pmean(grads)``; metrics reduced across
    devices (:func:`reduce_metrics`); one optimizer update; then
    ``reg_state = update_reg_state(reg_state, metrics, step)`` from the REDUCED metrics, so every
    replica computes the same new regularizer state (e.g. an adaptive-γ controller fed with the
    forward solver's residual).

    Args:
      loss_fn: ``(params, batch, key, reg_state, step) -> (loss, metrics)``: ``batch`` is this
        device's share, ``key`` a raw PRNG key for this step, ``step`` the int32 number of updates
        applied so far (feed it to schedules such as γ ramps), ``metrics`` a dict of scalars
        (treated as constants; see the module docstring for the ``_max``/``_min``/``_sum``
        suffixes). All configuration is closed over or static: no global flags. With
        ``with_carry`` it takes ``carry=`` as a keyword and returns ``(loss, metrics, carry)``.
      optimizer: an optax transformation (e.g. :func:`~deqjax.training.make_optimizer`).
      update_reg_state: ``(reg_state, metrics, step) -> reg_state``, pure; default: unchanged.
      learning_rate_fn: if given, its value at ``step`` is logged as ``"learning_rate"``.
      per_device_rng: if True (default) each device's key is ``fold_in(key, device index)``
        (independent dropout masks / probes per shard); if False every device gets the same key
        (a decision that must agree across devices, like the JR paper's Bernoulli gate).
      axis_name: the mapped axis the gradients and metrics are averaged over; None: no
        collectives (one device, plain ``jit``).
      backward_stats: if True, ``loss_fn`` takes a sixth argument, a :class:`~deqjax.BackwardStats`
        probe, to pass to ``dq.fixed_point(..., backward_stats=probe)`` (or ``dq.nn.DEQ``); the
        step differentiates with respect to it too and logs the implicit backward solves'
        ``bwd_steps``, ``bwd_rel_residual``, ``bwd_failure_rate`` and ``bwd_fallback_rate``
        (means per solve on each device, averaged across devices).
      with_carry: recurrent state across steps (truncated backpropagation through time, e.g. a
        language model's memory): ``loss_fn(..., carry=state.carry)`` returns the next carry
        third, stored (gradient stopped) in the new state. A skipped (non-finite) update keeps the
        old carry too. Each device keeps its own carry (its shard of the stream).

    Returns:
      A :class:`TrainStep`. ``metrics`` always contain ``"loss"`` and ``"grad_norm"`` (global norm
      of the averaged gradient), with an optimizer wrapped in ``optax.apply_if_finite``
      (:func:`~deqjax.training.skip_nonfinite`) also ``"skipped_updates"`` (total) and
      ``"nonfinite_streak"`` (consecutive, 0 after a finite step); a non-finite loss then skips
      the update like a non-finite gradient, and the regularizer state is kept.
    """
    if not callable(loss_fn):
        raise ValueError(f"loss_fn must be callable, got {type(loss_fn).__name__}.")
    if update_reg_state is not None and not callable(update_reg_state):
        raise ValueError("update_reg_state must be callable or None.")

    def init(params: PyTree, rng: jax.Array, *, reg_state=(), carry=()) -> TrainState:
        return create_train_state(params, optimizer, rng, reg_state=reg_state, carry=carry)

    def objective(*args):
        if not with_carry:
            return loss_fn(*args[:-1])
        loss, metrics, carry = loss_fn(*args[:-1], carry=args[-1])
        return loss, (metrics, carry)

    def update(state: TrainState, batch: PyTree) -> tuple[TrainState, Metrics]:
        rng, step_key = jax.random.split(state.rng)
        if per_device_rng and axis_name is not None:
            step_key = jax.random.fold_in(step_key, jax.lax.axis_index(axis_name))
        args = (state.params, batch, step_key, state.reg_state, state.step)
        if backward_stats:  # the gradient channel of dq.BackwardStats: stats arrive as a gradient
            grad_fn = jax.value_and_grad(objective, argnums=(0, 5), has_aux=True)
            probe = adjoints.BackwardStats.zeros()
            (loss, aux), (grads, stats) = grad_fn(*args, probe, state.carry)
        else:
            (loss, aux), grads = jax.value_and_grad(objective, has_aux=True)(*args, state.carry)
            stats = None
        metrics, carry = aux if with_carry else (aux, state.carry)
        carry = jax.lax.stop_gradient(carry)
        if stats is not None:
            metrics = {**metrics, **stats.metrics()}
        if axis_name is not None:
            grads = jax.lax.pmean(grads, axis_name)
            metrics = reduce_metrics({"loss": loss, **metrics}, axis_name)
        else:
            metrics = {k: _as_float(jax.lax.stop_gradient(v)) for k, v in metrics.items()}
            metrics = {"loss": _as_float(jax.lax.stop_gradient(loss)), **metrics}
        metrics["grad_norm"] = optax.tree.norm(grads)
        if learning_rate_fn is not None:
            metrics["learning_rate"] = _as_float(learning_rate_fn(state.step))
        skipping = isinstance(state.opt_state, optax.ApplyIfFiniteState)
        if skipping:
            # A non-finite loss skips the update even when its gradient is finite.
            loss_ok = jnp.isfinite(metrics["loss"])
            grads = jax.tree_util.tree_map(lambda g: jnp.where(loss_ok, g, jnp.nan), grads)
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        reg_state = state.reg_state
        if update_reg_state is not None:
            reg_state = update_reg_state(reg_state, metrics, state.step)
        if skipping:  # the update was skipped: the regularizer state and the carry stay too
            ok = opt_state.last_finite
            keep = lambda new, old: jnp.where(ok, new, old)  # noqa: E731
            reg_state = jax.tree_util.tree_map(keep, reg_state, state.reg_state)
            carry = jax.tree_util.tree_map(keep, carry, state.carry)
            metrics["skipped_updates"] = opt_state.total_notfinite.astype(jnp.float32)
            metrics["nonfinite_streak"] = opt_state.notfinite_count.astype(jnp.float32)
        new_state = TrainState(params, opt_state, rng, state.step + 1, reg_state, carry)
        return new_state, metrics

    return TrainStep(init=init, update=update)


def make_train_step(
    loss_fn: LossFn,
    optimizer: optax.GradientTransformation,
    *,
    update_reg_state: RegUpdateFn | None = None,
    learning_rate_fn: optax.Schedule | None = None,
    per_device_rng: bool = True,
    donate: bool = True,
    devices: Sequence[jax.Device] | None = None,
    backward_stats: bool = False,
    with_carry: bool = False,
) -> Callable[[TrainState, PyTree], tuple[TrainState, Metrics]]:
    """The pmapped ``update`` of :func:`train_step`: ``(state, batch) -> (state, metrics)``.

    Args:
      loss_fn, optimizer, update_reg_state, learning_rate_fn, per_device_rng, backward_stats,
        with_carry: as in :func:`train_step`.
      donate: donate the input state's buffers to the output (do not reuse the input state).
      devices: devices to map over; default (None) pmap's: every process's local devices, with
        collectives spanning all processes. Pass a list only in a single-process run (a list of
        local devices would cut a multi-host run into independent replicas).

    Returns:
      ``step_fn(state, batch)``: ``state`` replicated (:func:`~deqjax.training.replicate`),
      ``batch`` a pytree of ``[num_devices, per_device_batch, ...]`` arrays
      (:func:`~deqjax.training.shard`). The metrics (see :func:`train_step`) stay on device:
      fetch them with :func:`~deqjax.training.unreplicate` only when logging.
    """
    pair = train_step(
        loss_fn,
        optimizer,
        update_reg_state=update_reg_state,
        learning_rate_fn=learning_rate_fn,
        per_device_rng=per_device_rng,
        backward_stats=backward_stats,
        with_carry=with_carry,
    )
    return pmap_update(pair, donate=donate, devices=devices)


def pmap_update(
    pair: TrainStep, *, donate: bool = True, devices: Sequence[jax.Device] | None = None
) -> Callable[[TrainState, PyTree], tuple[TrainState, Metrics]]:
    """``jax.pmap`` of ``pair.update`` over the device axis (see :func:`make_train_step`)."""
    donate_argnums = (0,) if donate else ()
    return jax.pmap(pair.update, axis_name=AXIS, donate_argnums=donate_argnums, devices=devices)


DiagnosticsFn = Callable[[PyTree, PyTree, jax.Array, PyTree], Metrics]


def make_diagnostics_step(
    diagnostics_fn: DiagnosticsFn, *, devices: Sequence[jax.Device] | None = None
) -> Callable[[TrainState, PyTree], Metrics]:
    """Builds a pmapped ``(state, batch) -> metrics`` for occasional, costly monitors.

    For diagnostics computed every k steps only (backward-solve residual, ‖J‖_F estimate,
    spectral radius). Its key is derived from ``state.rng`` without advancing it, so running it or
    not leaves training bit-identical.

    Args:
      diagnostics_fn: ``(params, batch, key, reg_state) -> {name: scalar}`` (reduced across
        devices by the suffix rule of :func:`reduce_metrics`).
      devices: as in :func:`make_train_step`.
    """
    if not callable(diagnostics_fn):
        raise ValueError(f"diagnostics_fn must be callable, got {type(diagnostics_fn).__name__}.")

    def step(state: TrainState, batch: PyTree) -> Metrics:
        key = jax.random.fold_in(jax.random.fold_in(state.rng, 0x0D1A6), jax.lax.axis_index(AXIS))
        metrics = diagnostics_fn(state.params, batch, key, state.reg_state)
        return reduce_metrics(metrics, AXIS)

    return jax.pmap(step, axis_name=AXIS, devices=devices)
