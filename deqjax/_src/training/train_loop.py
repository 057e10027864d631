"""The training loop: per step the next batch, the step function, then each periodic action.

Modelled on Flax's ``clu.periodic_actions``: the loop knows nothing of logging, evaluation or
checkpoints. Each of those is an *action* (:class:`~deqjax.training.Action`) that owns its own
schedule (``every_steps``) and is called after every step; what it measures it returns as a record
(a flat dict with ``"split"`` and ``"step"``), which the loop keeps in its history and hands to
``on_record`` (e.g. :meth:`~deqjax.training.MetricsWriter.write`). :func:`~deqjax.training.fit` is
this loop with the library's actions; a loop of one's own composes the same parts::

    parallel = data_parallel("sharded")
    update = parallel.map_update(pair.update)
    batches = (parallel.put(next(data), SHARDED) for _ in itertools.count())
    result = train_loop(update, parallel.put(state, STATE_KINDS), batches, num_steps=1000,
                        actions=[LogMetrics(every_steps=100, num_steps=1000)],
                        read_metrics=lambda m: parallel.get(m, REPLICATED))

A step's metrics stay on the device (:class:`StepMetrics`) until an action asks for them on the
host: only on the steps an action logs, the loop's only host syncs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import jax
import numpy as np

from deqjax._src.training.metrics import to_python

PyTree = Any
Record = dict[str, Any]


class StepMetrics:
    """One step's metrics: on the device until :meth:`host` reads them (once: a device sync).

    Attributes:
      on_device: the metrics as the step function returned them.
    """

    def __init__(self, on_device: PyTree, read: Callable[[PyTree], Mapping[str, Any]]):
        self.on_device = on_device
        self._read = read
        self._host: dict[str, float] | None = None

    def host(self) -> dict[str, float]:
        """``{name: float}`` on the host, fetched on the first call (later calls reuse it)."""
        if self._host is None:
            self._host = {k: float(v) for k, v in self._read(self.on_device).items()}
        return self._host


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
    actions: Sequence[Any] = (),
    read_metrics: Callable[[PyTree], Mapping[str, Any]] = jax.device_get,
    on_record: Callable[[Record], None] | None = None,
) -> LoopResult:
    """Steps ``state`` from ``start_step`` to ``num_steps``, calling each action after each step.

    Per step: ``batch = next(batches)``; ``state, metrics = step_fn(state, batch)``; then each
    action in order, ``action(step, state, StepMetrics(metrics), batch) -> record or None``
    (``step`` counts the steps taken, the first is 1). Before the first step each action's
    ``start(start_step, state)`` runs, after the last (or once an action's ``stop_requested()``
    turned True) each one's ``end(step, state, stopped) -> record or None``; the hooks are
    optional (see :class:`~deqjax.training.Action`). An action's exception ends the loop at once
    (no ``end``).

    Args:
      step_fn: ``(state, batch) -> (state, metrics)``, e.g. a mapped
        :class:`~deqjax.training.TrainStep` ``update``.
      state: the state before ``start_step``'s step, placed where ``step_fn`` wants it.
      batches: an iterator of batches placed where ``step_fn`` wants them.
      num_steps: the step count at which the loop ends.
      start_step: the steps ``state`` has already taken (a resumed run's restored step).
      actions: the periodic actions, called in this order.
      read_metrics: fetches a step's ``metrics`` to the host as ``{name: scalar}`` (default
        ``jax.device_get``; data-parallel: ``lambda m: parallel.get(m, REPLICATED)``).
      on_record: called with each record as it is made (e.g. a metrics file's ``write``).

    Returns:
      A :class:`LoopResult`; its ``history`` holds Python scalars (nan stays a float).
    """
    history: list[Record] = []

    def keep(record: Record | None) -> None:
        if record is None:
            return
        record = {k: _py_scalar(v) for k, v in record.items()}
        history.append(record)
        if on_record is not None:
            on_record(record)

    for action in actions:
        _hook(action, "start")(start_step, state)
    step, stopped = start_step, False
    while step < num_steps and not stopped:
        batch = next(batches)
        state, metrics = step_fn(state, batch)
        step += 1
        metrics = StepMetrics(metrics, read_metrics)
        for action in actions:
            keep(action(step, state, metrics, batch))
        stopped = any(_hook(action, "stop_requested")() for action in actions)
    for action in actions:
        keep(_hook(action, "end")(step, state, stopped))
    return LoopResult(state, step, history, stopped)


def _nothing(*args: Any) -> None:
    return None


def _hook(action: Any, name: str) -> Callable[..., Any]:
    """``action``'s optional hook ``name``, or one that does nothing (and returns None)."""
    return getattr(action, name, _nothing)


def _py_scalar(value: Any) -> Any:
    if isinstance(value, (str, bool, int, float)) or value is None:
        return value
    arr = np.asarray(value)
    return arr.item() if arr.ndim == 0 else to_python(value)
