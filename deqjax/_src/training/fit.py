"""The training driver: :func:`fit`, the short :func:`~deqjax.training.train_loop` composed with the
library's periodic actions.

:func:`fit` validates its arguments, builds the train step (an optax-style
:class:`~deqjax.training.TrainStep` pair) and runs it over the devices through one
:class:`~deqjax.training.DataParallel` (``parallel``: ``jax.jit`` + ``jax.shard_map``, or
``jax.pmap``), which also places the state and batches and reads metrics and states back. It
restores or claims the checkpoint folder by the run's
:class:`~deqjax._src.training.run_policy.RunPolicy`, then hands the loop these actions, each in
a module of its own under ``training/actions/`` and each keeping its own schedule:

1. :class:`~deqjax.training.LogMetrics`: the train record every ``log_every`` steps (the metrics'
   only fetch to the host);
2. :class:`~deqjax.training.GuardNonFinite`: reports skipped updates, stops a run whose updates
   stay non-finite;
3. :class:`~deqjax.training.RunDiagnostics`: ``diagnostics_fn`` every ``diagnostics_every`` steps;
4. :class:`~deqjax.training.Evaluate`: at each epoch end (or every ``eval_every`` steps) and at the
   end;
5. :class:`~deqjax.training.SaveCheckpoints`: every ``checkpoint_every`` steps and at the end;
6. :class:`~deqjax.training.StopOnSigterm`: stops at the step boundary after a SIGTERM;
7. :class:`~deqjax.training.ReportProgress`: the progress bar.

Every record goes to the history and the metrics file (:class:`~deqjax.training.MetricsWriter`).
The same loop built by hand from these parts gives the same history.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jmp
import numpy as np
import optax

from deqjax._src import checks
from deqjax._src.data.batching import BatchIterator
from deqjax._src.training.actions.action import Action
from deqjax._src.training.actions.evaluate import Evaluate
from deqjax._src.training.actions.guard_nonfinite import GuardNonFinite
from deqjax._src.training.actions.log_metrics import LogMetrics
from deqjax._src.training.actions.report_progress import ReportProgress
from deqjax._src.training.actions.run_diagnostics import RunDiagnostics
from deqjax._src.training.actions.save_checkpoints import SaveCheckpoints
from deqjax._src.training.actions.stop_on_sigterm import StopOnSigterm
from deqjax._src.training.checkpoint import Checkpointer
from deqjax._src.training.data_parallel import (
    REPLICATED,
    STATE_KINDS,
    DataParallel,
    data_parallel,
)
from deqjax._src.training.evaluation import DiagnosticsFn, EvalFn
from deqjax._src.training.metrics import MetricsWriter
from deqjax._src.training.nonfinite import NonFiniteError as NonFiniteError
from deqjax._src.training.nonfinite import skip_nonfinite
from deqjax._src.training.resident_batches import placed_batches
from deqjax._src.training.run_policy import RunPolicy
from deqjax._src.training.train_loop import train_loop
from deqjax._src.training.train_state import TrainState, stack
from deqjax._src.training.train_step import LossFn, RegUpdateFn, TrainStep
from deqjax._src.training.train_step import train_step as build_train_step

PyTree = Any


class FitResult(NamedTuple):
    """What :func:`fit` returns."""

    state: TrainState  # the final state, unreplicated, numpy on the host
    data_state: Any  # the training iterator's position (its ``state``) after the last step
    history: list[dict]  # every record logged by this call (train, eval and diagnostics)
    interrupted: bool  # True if stopped early by SIGTERM (after saving a checkpoint)
    restored_step: int | None  # the checkpoint step this call resumed from, None if fresh


def fit(
    *,
    params: PyTree,
    loss_fn: LossFn | None = None,
    optimizer: optax.GradientTransformation | None = None,
    train_data: BatchIterator,
    num_steps: int,
    rng: jax.Array,
    train_step: TrainStep | None = None,
    carry: PyTree = None,
    reg_state: PyTree = (),
    update_reg_state: RegUpdateFn | None = None,
    learning_rate_fn: optax.Schedule | None = None,
    per_device_rng: bool = True,
    loss_scale: jmp.LossScale | None = None,
    eval_fn: EvalFn | None = None,
    eval_data: Mapping[str, np.ndarray] | None = None,
    eval_batch_size: int | None = None,
    eval_every: int | None = None,
    diagnostics_fn: DiagnosticsFn | None = None,
    diagnostics_every: int | None = None,
    log_every: int = 100,
    checkpoint_dir: str | os.PathLike | None = None,
    checkpoint_every: int | None = None,
    keep_checkpoints: int = 3,
    resume: bool = False,
    overwrite: bool = False,
    max_nonfinite_steps: int | None = 10,
    metrics_path: str | os.PathLike | None = None,
    config: Mapping[str, Any] | None = None,
    progress: bool = True,
    handle_sigterm: bool = True,
    devices: Sequence[jax.Device] | None = None,
    parallel: str | DataParallel = "sharded",
    desc: str = "train",
    print_fn: Callable[[str], None] | None = print,
) -> FitResult:
    """Trains for ``num_steps`` optimizer steps, data-parallel over the devices (and hosts).

    :func:`~deqjax.training.train_loop` with the library's actions (the module docstring lists
    them): validate the arguments; restore the newest good checkpoint with ``resume`` (state, data
    position and RNG), or start fresh (guarding an earlier run's checkpoints and metrics); per
    step place this process's share of the next global batch (or gather it on the devices, see
    ``train_data``) and run the data-parallel update;
    every ``log_every`` steps fetch the metrics to the host, write a JSONL record and update the
    progress bar; every ``diagnostics_every`` steps run ``diagnostics_fn``; at the end of each
    epoch (or every ``eval_every`` steps) evaluate; every ``checkpoint_every`` steps and at the
    end save a checkpoint. On SIGTERM it saves a checkpoint and returns with ``interrupted=True``
    (exit with a non-zero status in the caller). A loop of one's own composes the same parts
    (:mod:`~deqjax._src.training.train_loop`), with actions of its own among them.

    A non-finite loss or gradient never reaches the parameters: the optimizer is wrapped in
    :func:`skip_nonfinite` (``optax.apply_if_finite``), so such a step leaves params, optimizer and
    regularizer state unchanged and is counted (``skipped_updates``, ``nonfinite_streak`` in the
    metrics). When the streak reaches ``max_nonfinite_steps`` (checked at each logging step) the
    run stops with :class:`NonFiniteError`; a state with non-finite values is never checkpointed.

    A run killed at any point and resumed with ``resume=True`` reproduces the uninterrupted run's
    losses bit for bit on CPU (same devices, same flags), because the state (params, optimizer,
    RNG, step, regularizer state) and the data position are all in the checkpoint.

    Args:
      params: initial parameters (ignored when a checkpoint is restored).
      loss_fn: ``(params, batch, key, reg_state, step) -> (loss, metrics)`` (with ``carry``:
        ``loss_fn(..., carry=c) -> (loss, metrics, next_c)``), see
        :func:`~deqjax.training.train_step`.
      optimizer: an optax transformation (with ``loss_fn``).
      train_data: any :class:`~deqjax.data.BatchIterator` (e.g. ``ShuffledBatches``): its
        position (``state``) is checkpointed and restored on resume. Without ``steps_per_epoch``
        the records carry no ``epoch`` and evaluation needs ``eval_every``. A
        ``ShuffledBatches(..., device_resident=True)`` is placed on the devices once and each
        batch gathered there (:class:`~deqjax.training.ResidentBatches`; the same batches), and
        so is ``eval_data``, where they fit.
      num_steps: total optimizer steps (the run ends when ``state.step == num_steps``).
      rng: the run's key (``jax.random.PRNGKey(seed)``).
      train_step: instead of ``loss_fn`` and ``optimizer``, a :class:`~deqjax.training.TrainStep`
        pair (e.g. from :func:`~deqjax.training.train_step`, its optimizer wrapped in
        :func:`skip_nonfinite` for the non-finite guard: fit wraps only an ``optimizer`` it is
        given). ``update_reg_state``, ``learning_rate_fn`` and ``per_device_rng`` then belong to
        the pair and must not be passed.
      carry: initial recurrent state carried from each step to the next (e.g. a language
        model's zero memory), replicated to every device, then each device's own; checkpointed
        (all local devices' carries) and restored on resume. None: no carry.
      reg_state: initial regularizer state (e.g. ``AdaptiveGamma(...).init()``).
      update_reg_state: ``(reg_state, metrics, step) -> reg_state``; see
        :func:`~deqjax.training.train_step`.
      learning_rate_fn: a schedule, logged as ``"learning_rate"``.
      per_device_rng: see :func:`~deqjax.training.train_step`.
      loss_scale: a ``jmp`` loss scale for a float16 model; see
        :func:`~deqjax.training.train_step`.
      eval_fn: ``(params, batch) -> {name: per-example values}``; needs ``eval_data``.
      eval_data: ``{name: array[N, ...]}`` evaluated in full (padded, masked).
      eval_batch_size: global eval batch (default ``train_data.batch_size``).
      eval_every: evaluate every this many steps (default: at each epoch end); always at the end.
      diagnostics_fn: ``(params, batch, key, reg_state) -> {name: scalar}``, run on the current
        batch every ``diagnostics_every`` steps.
      log_every: steps between metric fetches (the only host syncs of the loop).
      checkpoint_dir: where checkpoints go; None disables checkpointing (and ``resume``).
      checkpoint_every: steps between checkpoints (default: only at the end and on SIGTERM).
      keep_checkpoints: how many checkpoints to keep.
      resume: continue from the newest good checkpoint in ``checkpoint_dir``; raises
        :class:`~deqjax.training.RestoreError` if there is none that restores (nothing is
        renamed or deleted then).
      overwrite: a fresh run (``resume=False``) may delete the checkpoints and metrics file of
        an earlier run found at ``checkpoint_dir`` / ``metrics_path``; without it they raise
        ``FileExistsError``.
      max_nonfinite_steps: stop after this many consecutive skipped (non-finite) updates; None
        disables the skipping (the optimizer is used as given).
      metrics_path: JSONL file of the records (process 0 only), append-only: on resume a marker
        is appended and :func:`~deqjax.training.read_jsonl` drops the records the interrupted
        run logged after the restored step.
      config: JSON-able run configuration stored in every checkpoint's metadata.
      progress: show a tqdm progress bar (process 0 only).
      handle_sigterm: install the SIGTERM handler (main thread only).
      devices: devices to run on (default all devices of all processes; a subset only in a
        single-process run).
      parallel: how the steps run over ``devices``: ``"sharded"`` (``jax.jit`` of
        ``jax.shard_map``, the default) or ``"pmap"`` (``jax.pmap``); both give the same numbers.
        Or a :class:`~deqjax.training.DataParallel` (from
        :func:`~deqjax.training.data_parallel`, its own devices: then ``devices`` must be None).
      desc: progress-bar label.
      print_fn: where evaluation summaries are printed (process 0; None: silent).

    Returns:
      A :class:`FitResult`.

    Raises:
      ValueError: naming the first invalid argument.
      FileExistsError: a fresh run where an earlier run's checkpoints or metrics are, without
        ``overwrite``.
      RestoreError: ``resume`` and no checkpoint can be restored.
      NonFiniteError: ``max_nonfinite_steps`` consecutive non-finite updates.
    """
    _check_arguments(
        num_steps,
        log_every,
        checkpoint_every,
        max_nonfinite_steps,
        train_data,
        eval_fn,
        eval_data,
        eval_every,
        diagnostics_fn,
        diagnostics_every,
    )
    policy = RunPolicy(resume, overwrite).check()
    if resume and checkpoint_dir is None:
        raise ValueError("resume=True needs checkpoint_dir.")
    pair = _train_step_pair(
        train_step,
        loss_fn,
        optimizer,
        max_nonfinite_steps=max_nonfinite_steps,
        with_carry=carry is not None,
        update_reg_state=update_reg_state,
        learning_rate_fn=learning_rate_fn,
        per_device_rng=per_device_rng,
        loss_scale=loss_scale,
    )
    parallel = _data_parallel(parallel, devices, train_data)
    say = print_fn if print_fn is not None and jax.process_index() == 0 else None
    evaluate = None
    if eval_fn is not None:
        evaluate = Evaluate(
            eval_fn,
            eval_data,
            parallel=parallel,
            train_data=train_data,
            batch_size=eval_batch_size,
            every_steps=eval_every,
            resident=getattr(train_data, "device_resident", False),
            desc=desc,
            say=say,
        )
    state = pair.init(params, rng, reg_state=reg_state, carry=() if carry is None else carry)
    state = state._replace(carry=stack(state.carry, len(parallel.local_devices)))  # per device
    with contextlib.ExitStack() as resources:  # closed in reverse on return or error
        save = None
        if checkpoint_dir is not None:
            checkpointer = Checkpointer(checkpoint_dir, max_to_keep=keep_checkpoints)
            resources.enter_context(checkpointer)
            save = SaveCheckpoints(
                checkpointer,
                parallel=parallel,
                train_data=train_data,
                every_steps=checkpoint_every,
                config=config,
                desc=desc,
            )
            state, restored_step = save.restore_or_claim(state, policy, say)
        else:
            restored_step = None
        # The step of a fresh or restored state: numpy, or a replicated global array.
        step = int(np.asarray(getattr(state.step, "addressable_data", lambda i: state.step)(0)))
        writer = MetricsWriter(
            metrics_path if metrics_path is not None else os.devnull,
            keep_until_step=step if restored_step is not None else None,
            overwrite=overwrite,
            enabled=jax.process_index() == 0 and metrics_path is not None,
        )
        resources.enter_context(writer)
        actions: list[Action] = [
            LogMetrics(every_steps=log_every, num_steps=num_steps, data=train_data),
            GuardNonFinite(
                max_nonfinite_steps,
                every_steps=log_every,
                num_steps=num_steps,
                desc=desc,
                say=say,
                last_checkpoint=save.last_checkpoint if save is not None else lambda: "none",
            ),
        ]
        if diagnostics_fn is not None:
            actions.append(
                RunDiagnostics(
                    diagnostics_fn,
                    every_steps=diagnostics_every,
                    parallel=parallel,
                    example_batch=lambda: _peek(train_data),
                )
            )
        actions += [a for a in (evaluate, save) if a is not None]
        if handle_sigterm:
            actions.append(
                resources.enter_context(StopOnSigterm(every_steps=log_every, desc=desc, say=say))
            )
        actions.append(
            resources.enter_context(
                ReportProgress(
                    num_steps=num_steps, every_steps=log_every, desc=desc, enabled=progress
                )
            )
        )
        update = parallel.map_update(pair.update)
        out = train_loop(
            update,
            parallel.put(state, STATE_KINDS),
            placed_batches(train_data, parallel, say),
            num_steps=num_steps,
            start_step=step,
            actions=actions,
            read_metrics=lambda metrics: parallel.get(metrics, REPLICATED),
            on_record=writer.write,
        )
    host_state = parallel.get(out.state, STATE_KINDS)
    return FitResult(host_state, train_data.state, out.history, out.stopped, restored_step)


# --- validate ------------------------------------------------------------------------------------


def _check_arguments(
    num_steps: int,
    log_every: int,
    checkpoint_every: int | None,
    max_nonfinite_steps: int | None,
    train_data: Any,
    eval_fn: EvalFn | None,
    eval_data: Mapping[str, np.ndarray] | None,
    eval_every: int | None,
    diagnostics_fn: DiagnosticsFn | None,
    diagnostics_every: int | None,
) -> None:
    """Raises ``ValueError`` naming the first invalid count, ``train_data`` of the wrong kind, or a
    schedule missing."""
    checks.check_positive_int(num_steps, "num_steps")
    checks.check_int(max_nonfinite_steps, "max_nonfinite_steps", allow_none=True)
    checks.check_positive_int(log_every, "log_every")
    checks.check_int(checkpoint_every, "checkpoint_every", allow_none=True)
    if not isinstance(train_data, BatchIterator):
        raise ValueError(
            f"train_data must be a deqjax.data.BatchIterator (next(), state, restore(state)), "
            f"got {type(train_data).__name__}."
        )
    checks.check_int(eval_every, "eval_every", allow_none=True)
    steps_per_epoch = getattr(train_data, "steps_per_epoch", None)
    if eval_fn is not None and eval_every is None and steps_per_epoch is None:
        raise ValueError("eval_every is required: train_data has no steps_per_epoch.")
    if (eval_fn is None) != (eval_data is None):
        raise ValueError("eval_fn and eval_data must be given together.")
    checks.check_int(diagnostics_every, "diagnostics_every", allow_none=True)
    if diagnostics_fn is not None and diagnostics_every is None:
        raise ValueError("diagnostics_every is required with diagnostics_fn.")


def _train_step_pair(
    train_step: TrainStep | None,
    loss_fn: LossFn | None,
    optimizer: optax.GradientTransformation | None,
    *,
    max_nonfinite_steps: int | None,
    with_carry: bool,
    update_reg_state: RegUpdateFn | None,
    learning_rate_fn: optax.Schedule | None,
    per_device_rng: bool,
    loss_scale: jmp.LossScale | None = None,
) -> TrainStep:
    """The user's pair, or one built from ``loss_fn`` and ``optimizer`` (made to skip non-finite
    updates unless ``max_nonfinite_steps`` is None)."""
    if (train_step is None) == (loss_fn is None) or (loss_fn is None) != (optimizer is None):
        raise ValueError("pass either loss_fn and optimizer, or train_step (a TrainStep pair).")
    if train_step is not None:
        if update_reg_state or learning_rate_fn or not per_device_rng or loss_scale:
            raise ValueError(
                "update_reg_state, learning_rate_fn, per_device_rng and loss_scale belong to the "
                "train_step pair: pass them to deqjax.training.train_step."
            )
        return train_step
    if max_nonfinite_steps is not None:
        optimizer = skip_nonfinite(optimizer)
    return build_train_step(
        loss_fn,
        optimizer,
        update_reg_state=update_reg_state,
        learning_rate_fn=learning_rate_fn,
        per_device_rng=per_device_rng,
        with_carry=with_carry,
        loss_scale=loss_scale,
    )


def _data_parallel(
    parallel: str | DataParallel, devices: Sequence[jax.Device] | None, train_data: BatchIterator
) -> DataParallel:
    """The :class:`DataParallel` of ``parallel`` (a mode, over ``devices``) or ``parallel`` itself;
    checks that its local devices split the per-process batch."""
    if isinstance(parallel, DataParallel):
        if devices is not None:
            raise ValueError("pass devices to data_parallel, not to fit, with a DataParallel.")
    else:
        parallel = data_parallel(parallel, devices)
    num_local = len(parallel.local_devices)
    local_batch = getattr(train_data, "local_batch_size", None)
    if local_batch is not None and local_batch % num_local:
        raise ValueError(
            f"the per-process batch ({local_batch}) must be divisible by the "
            f"number of local devices ({num_local})."
        )
    return parallel


def _peek(data: BatchIterator) -> PyTree:
    """The next batch of ``data``, which stays where it was."""
    position = data.state
    batch = next(data)
    data.restore(position)
    return batch
