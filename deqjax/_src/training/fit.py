"""The training driver: :func:`fit` is :func:`~deqjax.training.train_loop` with the actions it
is given (models: Flax's ``train_and_evaluate``, ``clu.periodic_actions``).

It validates what it owns, places the state, restores or claims the checkpoint folder by the
:class:`~deqjax.training.RunPolicy`, opens the metric writers, runs the loop (the caller's
actions, then :class:`~deqjax.training.SaveCheckpoints`) and closes the checkpoints (waiting for
the pending save) and the writers, also after an error. The caller builds the rest
(:func:`~deqjax.training.train_step`, :func:`~deqjax.training.default_actions`, ...).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax

from deqjax._src.data.batching import Batches
from deqjax._src.training.actions.action import Action
from deqjax._src.training.actions.save_checkpoints import SaveCheckpoints
from deqjax._src.training.checkpoints import Checkpoints
from deqjax._src.training.data_parallel import REPLICATED, STATE_KINDS, DataParallel
from deqjax._src.training.loop_context import LoopContext
from deqjax._src.training.nonfinite import NonFiniteError as NonFiniteError
from deqjax._src.training.resident_batches import placed_batches
from deqjax._src.training.run_policy import RunPolicy
from deqjax._src.training.train_loop import check_arguments, train_loop
from deqjax._src.training.train_state import TrainState, stack
from deqjax._src.training.train_step import TrainStep
from deqjax._src.training.writers.metric_writer import MetricWriter


class FitResult(NamedTuple):
    """What :func:`fit` returns."""

    state: TrainState  # the final state, unreplicated, numpy on the host
    data_state: Any  # the training data's position (its ``state``) after the last step
    history: list[dict]  # every record logged by this call (train, eval and diagnostics)
    interrupted: bool  # True if an action (SIGTERM, a preemption) stopped it early
    restored_step: int | None  # the checkpoint step this call resumed from, None if fresh


def fit(
    train_step: TrainStep,
    state: TrainState,
    data: Batches,
    *,
    num_steps: int,
    parallel: DataParallel,
    actions: Sequence[Action] = (),
    checkpoints: Checkpoints | None = None,
    policy: RunPolicy = RunPolicy(),  # noqa: B008 -- an immutable NamedTuple
    writers: Sequence[MetricWriter] = (),
    say: Callable[[str], None] | None = print,
    run_dir: str | None = None,
    desc: str = "train",
) -> FitResult:
    """Trains ``state`` to step ``num_steps`` with ``train_step`` over ``parallel``'s devices,
    running ``actions`` after each step (their schedules decide when).

    A run killed at any point and resumed (``policy=RunPolicy(resume=True)``) reproduces the
    uninterrupted run bit for bit on CPU: the state (params, optimizer, RNG, step, regularizer
    state, carry) and the data position are in each checkpoint. A resumed run with nothing left
    to do returns at once (no step, no action, no compilation).

    Args:
      train_step: the :class:`~deqjax.training.TrainStep` pair (its optimizer wrapped in
        :func:`~deqjax.training.skip_nonfinite` to skip non-finite updates).
      state: ``train_step.init(params, rng, reg_state=..., carry=...)`` on the host (the carry
        one per device from here on).
      data: the training :class:`~deqjax.data.Batches` (host batches, or already on the
        devices: :class:`~deqjax.training.ResidentBatches`).
      num_steps: the run's step count (the run ends when ``state.step == num_steps``).
      parallel: how the steps run over the devices (:func:`~deqjax.training.data_parallel`).
      actions: the periodic actions, run in this order (e.g. ``default_actions(...)``).
      checkpoints: where the run's checkpoints go (saved by their policies, at the end and on
        a stop; closed on return), what ``policy.resume`` restores; None: no checkpoints.
      policy: resume the checkpoints and writers, or start afresh (``overwrite``: over an
        earlier run's).
      writers: where each record goes (e.g. :class:`~deqjax.training.JsonlWriter`; closed on
        return).
      say: the printer of process 0 (None: silent).
      run_dir: the run folder for actions' files (a profiler trace); None: none.
      desc: the run's label in messages and the progress bar.

    Raises:
      ValueError: naming the first invalid argument.
      FileExistsError: a fresh run over an earlier run's checkpoints or metrics, without
        ``overwrite``.
      RestoreError: ``policy.resume`` and no checkpoint restores.
      NonFiniteError: an action (:class:`~deqjax.training.GuardNonFinite`) stopped the run, or
        a non-finite state was to be checkpointed.
    """
    _check(train_step, state, data, num_steps, parallel, actions, checkpoints, policy)
    say = say if jax.process_index() == 0 else None
    state = state._replace(carry=stack(state.carry, len(parallel.local_devices)))
    with contextlib.ExitStack() as resources:  # closed in reverse, also after an error
        restored = None
        if checkpoints is not None:
            resources.callback(checkpoints.close)
            state, restored = checkpoints.restore_or_claim(state, data, policy, parallel, say)
        placed = parallel.put(state, STATE_KINDS)
        step = int(parallel.get(placed.step, REPLICATED))
        if step >= num_steps:
            check_arguments(num_steps, step, ())  # past num_steps: refused
            if say is not None:
                say(f"[{desc}] step {step} of {num_steps}: nothing left to do")
            return FitResult(parallel.get(placed, STATE_KINDS), data.state, [], False, restored)
        for writer in writers:
            writer.open(restored, policy.overwrite)
            resources.callback(writer.close)
        saving = [SaveCheckpoints()] if checkpoints is not None else []
        context = LoopContext(
            parallel, data, run_dir=run_dir, checkpoints=checkpoints, say=say, desc=desc
        )
        out = train_loop(
            parallel.map_update(train_step.update),
            placed,
            placed_batches(data, parallel),
            num_steps=num_steps,
            start_step=step,
            actions=[*actions, *saving],
            context=context,
            read_metrics=lambda metrics: parallel.get(metrics, REPLICATED),
            on_record=lambda record: [writer.write(record) for writer in writers],
        )
    state = parallel.get(out.state, STATE_KINDS)
    return FitResult(state, data.state, out.history, out.stopped, restored)


def _check(train_step, state, data, num_steps, parallel, actions, checkpoints, policy) -> None:
    """Raises ``ValueError`` naming the first argument of :func:`fit` of the wrong kind."""
    kinds = [(train_step, TrainStep, "train_step"), (state, TrainState, "state")]
    kinds += [(data, Batches, "data"), (parallel, DataParallel, "parallel")]
    kinds += [(policy, RunPolicy, "policy")]
    for value, kind, name in kinds:
        if not isinstance(value, kind):
            raise ValueError(f"{name} must be a {kind.__name__}, got {type(value).__name__}.")
    check_arguments(num_steps, 0, actions)
    policy.check()
    if policy.resume and checkpoints is None:
        raise ValueError("policy.resume needs checkpoints (the run to resume).")
    num_local = len(parallel.local_devices)
    if data.local_batch_size % num_local:
        raise ValueError(
            f"the per-process batch ({data.local_batch_size}) must be divisible by the number "
            f"of local devices ({num_local})."
        )
