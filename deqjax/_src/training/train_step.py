"""The train step as an optax-style pair of pure functions: ``init`` builds the state, ``update``
takes one data-parallel optimizer step.

``update`` runs on one device's share of the batch, its collectives over the axis ``"batch"``;
:func:`~deqjax.training.fit` runs it over the devices with a
:class:`~deqjax._src.training.data_parallel.DataParallel` (by default ``jax.jit`` of
``jax.shard_map``, each device solving its own shard; or ``jax.pmap``), so the same step runs on
one device, on N local devices and on N hosts (after
:func:`~deqjax.training.initialize_distributed`): the collectives span every device of every
process.

Metric reduction across devices follows the metric's name: a key ending in ``_max`` is reduced
with ``pmax``, ``_min`` with ``pmin``, ``_sum`` with ``psum``; every other key with ``pmean`` (a
mean of per-device means, i.e. the global-batch mean when devices hold equal batches).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import jmp
import optax

from deqjax._src import vma
from deqjax._src.adjoints.backward_stats import BackwardStats
from deqjax._src.training.train_state import DEVICE_AXIS, TrainState, create_train_state

PyTree = Any
Metrics = dict[str, jax.Array]
LossFn = Callable[[PyTree, PyTree, jax.Array, PyTree, jax.Array], tuple[jax.Array, Metrics]]
RegUpdateFn = Callable[[PyTree, Metrics, jax.Array], PyTree]
AXIS = DEVICE_AXIS


def as_float(x: jax.typing.ArrayLike) -> jax.Array:
    """``x`` as an array of a floating dtype (integers and booleans become float32)."""
    x = jnp.asarray(x)
    return x if jnp.issubdtype(x.dtype, jnp.floating) else x.astype(jnp.float32)


def reduce_metrics(metrics: Mapping[str, jax.Array], axis_name: str) -> Metrics:
    """Reduces scalar metrics over ``axis_name`` by the suffix rule of this module's docstring."""
    out = {}
    for name, value in metrics.items():
        value = as_float(jax.lax.stop_gradient(value))
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
    batch. Neither is mapped or jitted: :func:`~deqjax.training.fit` maps ``update`` over devices
    (its collectives use ``axis_name``, ``"batch"`` by default). In a loop of one's own,
    ``jax.jit(jax.shard_map(pair.update, mesh=mesh, in_specs=(P(), P("batch")),
    out_specs=(P(), P())))`` over a mesh with the axis ``"batch"``, or
    ``jax.pmap(pair.update, axis_name="batch")`` on a state placed with
    :func:`~deqjax.training.replicate` and batches placed with :func:`~deqjax.training.shard`,
    does the same; with ``axis_name=None``, ``update`` runs under plain ``jax.jit`` on one
    device.
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
    loss_scale: jmp.LossScale | None = None,
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
      loss_scale: a ``jmp`` loss scale (e.g. ``jmp.StaticLossScale(2.0**10)`` for a float16
        model): the gradient is taken of the scaled loss and unscaled before it is averaged,
        logged or applied (an overflow gives a non-finite gradient, which a
        :func:`skip_nonfinite` optimizer skips). ``None``: no scaling.

    Returns:
      A :class:`TrainStep`. ``metrics`` always contain ``"loss"`` and ``"grad_norm"`` (global norm
      of the averaged gradient), with an optimizer wrapped in ``optax.apply_if_finite``
      (:func:`~deqjax.training.skip_nonfinite`) also ``"skipped_updates"`` (total) and
      ``"nonfinite_streak"`` (consecutive, 0 after a finite step); a non-finite loss then skips
      the update like a non-finite gradient, and the regularizer state is kept.

    Raises:
      ValueError: if ``loss_fn`` or ``update_reg_state`` is not callable.
    Example:
      >>> pair = train_step(loss_fn, optax.adam(1e-3), axis_name=None)
      >>> state, metrics = jax.jit(pair.update)(pair.init(params, jax.random.PRNGKey(0)), batch)
    """
    if not callable(loss_fn):
        raise ValueError(f"loss_fn must be callable, got {type(loss_fn).__name__}.")
    if update_reg_state is not None and not callable(update_reg_state):
        raise ValueError("update_reg_state must be callable or None.")
    scale = jmp.NoOpLossScale() if loss_scale is None else loss_scale
    gradients = _gradient_fn(loss_fn, per_device_rng, axis_name, backward_stats, with_carry, scale)

    def init(params: PyTree, rng: jax.Array, *, reg_state=(), carry=()) -> TrainState:
        return create_train_state(params, optimizer, rng, reg_state=reg_state, carry=carry)

    def update(state: TrainState, batch: PyTree) -> tuple[TrainState, Metrics]:
        rng, loss, metrics, grads, carry = gradients(state, batch)
        if axis_name is not None:
            grads = jax.lax.pmean(grads, axis_name)
            metrics = reduce_metrics({"loss": loss, **metrics}, axis_name)
        else:
            metrics = {k: as_float(jax.lax.stop_gradient(v)) for k, v in metrics.items()}
            metrics = {"loss": as_float(jax.lax.stop_gradient(loss)), **metrics}
        metrics["grad_norm"] = optax.tree.norm(grads)
        if learning_rate_fn is not None:
            metrics["learning_rate"] = as_float(learning_rate_fn(state.step))
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
        if skipping:
            reg_state, carry = _keep_if_skipped(opt_state, (reg_state, carry), state, metrics)
        new_state = TrainState(params, opt_state, rng, state.step + 1, reg_state, carry)
        return new_state, metrics

    return TrainStep(init=init, update=update)


def _gradient_fn(
    loss_fn: Callable,
    per_device_rng: bool,
    axis_name: str | None,
    stats: bool,
    with_carry: bool,
    loss_scale: jmp.LossScale,
) -> Callable[[TrainState, PyTree], tuple]:
    """``(state, batch) -> (next rng, loss, metrics, grads, carry)``: one device's gradient.

    The step key is split from ``state.rng`` (folded with the device index when
    ``per_device_rng``); with ``stats`` the implicit backward solves' statistics arrive as the
    gradient of a :class:`~deqjax.BackwardStats` probe and join the metrics (the implicit
    backward writes them as the probe's cotangent, whatever the loss's scale). The parameters'
    gradient is that of ``loss_scale.scale(loss)``, unscaled.
    """

    def objective(*args):
        if not with_carry:
            loss, metrics = loss_fn(*args[:-1])
            carry = args[-1]
        else:
            loss, metrics, carry = loss_fn(*args[:-1], carry=args[-1])
        return loss_scale.scale(loss), (loss, metrics, carry)

    def gradients(state: TrainState, batch: PyTree) -> tuple:
        rng, step_key = jax.random.split(state.rng)
        if per_device_rng and axis_name is not None:
            step_key = jax.random.fold_in(step_key, jax.lax.axis_index(axis_name))
        # Inside a checked shard_map, what is differentiated varies by device: its gradient is
        # this device's (pmean-ed by the caller), not autodiff's sum over the devices.
        params = state.params if axis_name is None else vma.vary_over(state.params, axis_name)
        args = (params, batch, step_key, state.reg_state, state.step)
        if stats:  # the gradient channel of dq.BackwardStats: stats arrive as a gradient
            grad_fn = jax.value_and_grad(objective, argnums=(0, 5), has_aux=True)
            probe = BackwardStats.zeros()
            if axis_name is not None:
                probe = vma.vary_over(probe, axis_name)
            (_, (loss, metrics, carry)), (grads, probe_grad) = grad_fn(*args, probe, state.carry)
            metrics = {**metrics, **probe_grad.metrics()}
        else:
            grad_fn = jax.value_and_grad(objective, has_aux=True)
            (_, (loss, metrics, carry)), grads = grad_fn(*args, state.carry)
        grads = loss_scale.unscale(grads)
        return rng, loss, metrics, grads, jax.lax.stop_gradient(carry)

    return gradients


def _keep_if_skipped(
    opt_state: optax.ApplyIfFiniteState, new: PyTree, state: TrainState, metrics: Metrics
) -> PyTree:
    """``new = (reg_state, carry)``, or the old ones where the update was skipped (non-finite).

    Also logs the skip counters of ``optax.apply_if_finite`` into ``metrics`` (in place).
    """
    ok = opt_state.last_finite
    old = (state.reg_state, state.carry)
    kept = jax.tree_util.tree_map(lambda n, o: jnp.where(ok, n, o), new, old)
    metrics["skipped_updates"] = opt_state.total_notfinite.astype(jnp.float32)
    metrics["nonfinite_streak"] = opt_state.notfinite_count.astype(jnp.float32)
    return kept
