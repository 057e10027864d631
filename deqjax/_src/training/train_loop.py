"""The training loop: per step the next batch, the step function, then the actions due.

Modelled on Flax's ``clu.periodic_actions`` and ``train.py``: the loop knows nothing of logging,
evaluation or checkpoints. Each of those is an :class:`~deqjax.training.Action` whose
:class:`~deqjax.training.Schedule` the loop asks after every step; what an action measures it
returns as a record (a flat dict with ``"split"`` and ``"step"``), which the loop keeps in its
history and hands to ``on_record`` (e.g. a metric writer's ``write``).
:func:`~deqjax.training.fit` is this loop with the actions it is given; a loop of one's own
composes the same parts::

    parallel = data_parallel("sharded")
    update = parallel.map_update(pair.update)
    batches = (parallel.put(next(data), SHARDED) for _ in itertools.count())
    result = train_loop(update, parallel.put(state, STATE_KINDS), batches, num_steps=1000,
                        actions=[LogMetrics(every_steps=100)],
                        context=LoopContext(parallel=parallel, data=data),
                        read_metrics=lambda m: parallel.get(m, REPLICATED))

A step's metrics stay on the device (:class:`StepMetrics`) until an action asks for them on the
host: only on the steps an action logs, the loop's only host syncs. Each step runs inside a
``jax.profiler.StepTraceAnnotation`` (a profiler trace shows the steps;
:class:`~deqjax.training.ProfileSteps`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import jax
import numpy as np

from deqjax._src import checks
from deqjax._src.data.batching import Batches
from deqjax._src.training import warm_up
from deqjax._src.training.actions.action import Action
from deqjax._src.training.loop_context import LoopContext
from deqjax._src.training.metrics import to_python
from deqjax._src.training.step_metrics import Record, StepMetrics

PyTree = Any


class LoopResult(NamedTuple):
    """What :func:`train_loop` returns."""

    state: PyTree  # the state after the last step, where the step function left it
    step: int  # the number of steps taken in all (``start_step`` plus this call's)
    history: list[Record]  # every record the actions returned, in order
    stopped: bool  # an action asked to stop before ``num_steps``


def train_loop(
    step_fn: Callable[[PyTree, PyTree], tuple[PyTree, PyTree]],
    state: PyTree,
    batches: Iterator[PyTree],
    *,
    num_steps: int,
    start_step: int = 0,
    actions: Sequence[Action] = (),
    context: LoopContext | None = None,
    read_metrics: Callable[[PyTree], Mapping[str, Any]] = jax.device_get,
    on_record: Callable[[Record], None] | None = None,
) -> LoopResult:
    """Steps ``state`` from ``start_step`` to ``num_steps``, running the actions that are due.

    Per step: ``batch = next(batches)``; ``state, metrics = step_fn(state, batch)``; then, in
    order, each action whose ``schedule.due(step, ...)``: ``action.run(step, state,
    StepMetrics(metrics), batch) -> record or None`` (``step`` counts the steps taken, the first
    is 1); then each one's ``stop_requested()``. Before the first step each action gets the
    context (``action.ctx``) and its ``start(ctx)``; after the last (or once an action asked to
    stop) each one with ``schedule.at_end`` its ``end(step, state, stopped)``; at last, also
    after an error, each one's ``close()`` in reverse order. With nothing to do (``start_step ==
    num_steps``) no hook runs.

    Args:
      step_fn: ``(state, batch) -> (state, metrics)``, e.g. a mapped
        :class:`~deqjax.training.TrainStep` ``update``.
      state: the state before ``start_step``'s step, placed where ``step_fn`` wants it.
      batches: an endless iterator of batches placed where ``step_fn`` wants them.
      num_steps: the step count at which the loop ends, an int >= 1.
      start_step: the steps ``state`` has already taken (a resumed run's restored step).
      actions: the periodic actions (:class:`~deqjax.training.Action`), run in this order.
      context: the run the actions take part in (default: ``batches`` as its data when they are
        a :class:`~deqjax.data.Batches`); its ``num_steps``, ``start_step`` and
        ``state_shapes`` are set here.
      read_metrics: fetches a step's ``metrics`` to the host as ``{name: scalar}`` (default
        ``jax.device_get``; data-parallel: ``lambda m: parallel.get(m, REPLICATED)``).
      on_record: called with each record as it is made (e.g. a metric writer's ``write``).

    Returns:
      A :class:`LoopResult`; its ``history`` holds Python scalars (nan stays a float).

    Raises:
      ValueError: ``num_steps`` not an int >= 1, ``start_step`` not an int in ``[0,
        num_steps]``, an action not an :class:`~deqjax.training.Action`, or ``batches`` ran
        out before ``num_steps`` (naming the step).
    """
    check_arguments(num_steps, start_step, actions)
    if context is None:
        context = LoopContext(data=batches if isinstance(batches, Batches) else None)
    ctx = dataclasses.replace(
        context, num_steps=num_steps, start_step=start_step, state_shapes=warm_up.abstract(state)
    )
    history: list[Record] = []

    def keep(record: Record | None) -> None:
        if record is not None:
            record = {k: _py_scalar(v) for k, v in record.items()}
            history.append(record)
            if on_record is not None:
                on_record(record)

    if start_step == num_steps:
        return LoopResult(state, start_step, history, False)
    step, stopped = start_step, False
    with contextlib.ExitStack() as closing:  # every close, in reverse, also after an error
        now = time.monotonic()
        for action in actions:
            closing.callback(action.close)
            action.ctx, action.last_run, action.last_step = ctx, now, None
            action.start(ctx)
        while step < num_steps and not stopped:
            with jax.profiler.StepTraceAnnotation(ctx.desc, step_num=step + 1):
                batch = _next(batches, step + 1, num_steps)
                state, metrics = step_fn(state, batch)
            step += 1
            ctx._latest[0] = metrics = StepMetrics(metrics, read_metrics)
            for action in actions:
                if action.schedule.due(step, time.monotonic(), action.last_run):
                    keep(action.run(step, state, metrics, batch))
                    action.last_run, action.last_step = time.monotonic(), step
            stopped = any(action.stop_requested() for action in actions)
        for action in actions:
            if action.schedule.at_end:
                keep(action.end(step, state, stopped))
    return LoopResult(state, step, history, stopped)


def check_arguments(num_steps: Any, start_step: Any, actions: Sequence[Any]) -> None:
    """Raises ``ValueError`` naming the first invalid argument of :func:`train_loop`."""
    checks.check_positive_int(num_steps, "num_steps")
    checks.check_int(start_step, "start_step", minimum=0)
    if start_step > num_steps:
        raise ValueError(f"start_step ({start_step}) must not exceed num_steps ({num_steps}).")
    for i, action in enumerate(actions):
        if not isinstance(action, Action):
            raise ValueError(
                f"actions[{i}] must be a deqjax.training.Action (subclass it: run, start, end), "
                f"got {type(action).__name__}."
            )


def _next(batches: Iterator[PyTree], step: int, num_steps: int) -> PyTree:
    """The batch of ``step``; a clear error when ``batches`` ran out."""
    try:
        return next(batches)
    except StopIteration:
        raise ValueError(
            f"the batches ran out before step {step} of {num_steps}: train_loop needs an "
            f"endless iterator (one that restarts each epoch, like deqjax.data.ShuffledBatches)."
        ) from None


def _py_scalar(value: Any) -> Any:
    if isinstance(value, (str, bool, int, float)) or value is None:
        return value
    arr = np.asarray(value)
    return arr.item() if arr.ndim == 0 else to_python(value)
