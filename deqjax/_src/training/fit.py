"""The generic training driver: a short loop over named pieces.

:func:`fit` validates its arguments, then runs the pieces below, each with one job: the
:class:`_Saver` restores (or starts fresh, guarding an earlier run's checkpoints) and checkpoints;
the :class:`_Stepper` takes one pmapped optimizer step on the next batch; the :class:`_Logger`
keeps the records (history, JSONL file, progress bar) and the :class:`_NonFiniteGuard` stops a run
whose updates stay non-finite; the :class:`_Evaluator` and :class:`_Diagnostics` measure on their
schedules; a SIGTERM handler asks the loop to checkpoint and return at the next step boundary.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jmp
import numpy as np
import optax

from deqjax._src import checks
from deqjax._src.data.batching import BatchIterator, eval_batches, state_dict
from deqjax._src.training.checkpoint import Checkpointer, RestoreError, all_finite
from deqjax._src.training.evaluation import (
    DiagnosticsFn,
    EvalFn,
    evaluate,
    make_diagnostics_step,
    make_eval_step,
)
from deqjax._src.training.metrics import MetricsWriter, format_metrics, progress_bar, to_python
from deqjax._src.training.train_state import (
    TrainState,
    shard,
    stack,
    state_to_devices,
    state_to_host,
    unreplicate,
)
from deqjax._src.training.train_step import (
    LossFn,
    Metrics,
    RegUpdateFn,
    TrainStep,
    parallel_update,
)
from deqjax._src.training.train_step import train_step as build_train_step
from deqjax._src.training.warm_up import compile_in_background

PyTree = Any
Say = Callable[[str], None] | None  # where messages go (process 0), None: silent


class FitResult(NamedTuple):
    """What :func:`fit` returns."""

    state: TrainState  # the final state, unreplicated, numpy on the host
    data_state: Any  # the training iterator's position (its ``state``) after the last step
    history: list[dict]  # every record logged by this call (train, eval and diagnostics)
    interrupted: bool  # True if stopped early by SIGTERM (after saving a checkpoint)
    restored_step: int | None  # the checkpoint step this call resumed from, None if fresh


class NonFiniteError(FloatingPointError):
    """Training stopped: the loss or gradient stayed non-finite (every such update skipped)."""


# optax.apply_if_finite gives up and applies a non-finite update after this many consecutive
# ones; fit stops the run long before (``max_nonfinite_steps``), so it never gives up.
_NEVER = 2**31 - 1


def skip_nonfinite(optimizer: optax.GradientTransformation) -> optax.GradientTransformation:
    """``optimizer`` that skips (zero update, state unchanged) any non-finite gradient.

    ``optax.apply_if_finite`` that never gives up: its state counts the skipped updates
    (``total_notfinite``) and the current streak (``notfinite_count``), which
    :func:`~deqjax.training.train_step` logs as ``skipped_updates`` and ``nonfinite_streak``.
    """
    return optax.apply_if_finite(optimizer, max_consecutive_errors=_NEVER)


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
    desc: str = "train",
    print_fn: Callable[[str], None] | None = print,
) -> FitResult:
    """Trains for ``num_steps`` optimizer steps, data-parallel over local devices (and hosts).

    The loop, one named piece each: validate the arguments; restore the newest good checkpoint
    with ``resume`` (state, data position and RNG), or start fresh (guarding an earlier run's
    checkpoints); per step take this process's shard of the next global batch and run the
    pmapped update; every ``log_every`` steps fetch the metrics to the host, write a JSONL record
    and update the progress bar; every ``diagnostics_every`` steps run ``diagnostics_fn``; at the
    end of each epoch (or every ``eval_every`` steps) evaluate; every ``checkpoint_every`` steps
    and at the end save a checkpoint. On SIGTERM it saves a checkpoint and returns with
    ``interrupted=True`` (exit with a non-zero status in the caller).

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
        the records carry no ``epoch`` and evaluation needs ``eval_every``.
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
      devices: devices to map over (default all devices of all processes; a subset only in a
        single-process run).
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
    _check_arguments(num_steps, log_every, checkpoint_every, max_nonfinite_steps, train_data)
    _check_resume(checkpoint_dir, resume, overwrite)
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
    local_devices = _local_devices(devices, train_data)
    evaluator = _Evaluator(
        eval_fn, eval_data, eval_batch_size, eval_every, train_data, devices, local_devices
    )
    diagnose = _Diagnostics(diagnostics_fn, diagnostics_every, devices)
    say = print_fn if print_fn is not None and jax.process_index() == 0 else None
    state = pair.init(params, rng, reg_state=reg_state, carry=() if carry is None else carry)
    state = state._replace(carry=stack(state.carry, len(local_devices)))  # one per device
    with contextlib.ExitStack() as resources:  # closed in reverse on return or error
        saver = resources.enter_context(_Saver(checkpoint_dir, keep_checkpoints, desc, config))
        state, restored_step = saver.start(state, train_data, resume, overwrite, say)
        step = int(np.asarray(state.step))
        logger = resources.enter_context(
            _Logger(metrics_path, step, restored_step, overwrite, num_steps, progress, desc)
        )
        guard = _NonFiniteGuard(max_nonfinite_steps, desc, say)
        step_fn = _Stepper(pair, train_data, devices, local_devices)
        stop = resources.enter_context(_sigterm_handler(handle_sigterm))
        state_r, interrupted = state_to_devices(state, local_devices), False
        # The evaluation and diagnostics programs compile while the train step does.
        evaluator.warm_up(state_r)
        diagnose.warm_up(state_r, lambda: shard(_peek(train_data), local_devices))
        while step < num_steps and not interrupted:
            state_r, metrics, batch = step_fn(state_r)
            step += 1
            host = logger.train(step, metrics, train_data, log_every)
            guard.check(step, host, saver.last_checkpoint)
            logger.log(diagnose(state_r, batch, step))
            if evaluator.due(step, train_data):
                logger.eval(step, evaluator(state_r, step), train_data, say)
            if checkpoint_every is not None and step % checkpoint_every == 0:
                saver.save(state_r, step, train_data)
            interrupted = _stop_requested(stop, step, log_every)
        if not interrupted and evaluator.due_at_end(step):
            logger.eval(step, evaluator(state_r, step), train_data, say)
        saver.save(state_r, step, train_data)
        if interrupted and say is not None:
            say(f"[{desc}] SIGTERM: saved checkpoint at step {step}, stopping")
    history = logger.history
    return FitResult(state_to_host(state_r), train_data.state, history, interrupted, restored_step)


# --- validate ------------------------------------------------------------------------------------


def _check_arguments(
    num_steps: int,
    log_every: int,
    checkpoint_every: int | None,
    max_nonfinite_steps: int | None,
    train_data: Any,
) -> None:
    """Raises ``ValueError`` naming the first invalid count, or ``train_data`` of the wrong kind."""
    checks.check_positive_int(num_steps, "num_steps")
    checks.check_int(max_nonfinite_steps, "max_nonfinite_steps", allow_none=True)
    checks.check_positive_int(log_every, "log_every")
    checks.check_int(checkpoint_every, "checkpoint_every", allow_none=True)
    if not isinstance(train_data, BatchIterator):
        raise ValueError(
            f"train_data must be a deqjax.data.BatchIterator (next(), state, restore(state)), "
            f"got {type(train_data).__name__}."
        )


def _check_resume(checkpoint_dir: str | os.PathLike | None, resume: bool, overwrite: bool) -> None:
    """Raises ``ValueError`` for ``resume`` without checkpoints or together with ``overwrite``."""
    if resume and checkpoint_dir is None:
        raise ValueError("resume=True needs checkpoint_dir.")
    if resume and overwrite:
        raise ValueError("resume and overwrite contradict each other: choose one.")


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


def _local_devices(
    devices: Sequence[jax.Device] | None, train_data: BatchIterator
) -> list[jax.Device]:
    """This process's share of ``devices`` (default all local devices); checks the batch splits.

    pmap gets ``devices`` as given (None: every device of every process, which multi-host
    collectives need); arrays are placed on this process's share of them.
    """
    if devices is None:
        local = jax.local_devices()
    else:
        local = [d for d in devices if d.process_index == jax.process_index()]
    local_batch = getattr(train_data, "local_batch_size", None)
    if local_batch is not None and local_batch % len(local):
        raise ValueError(
            f"the per-process batch ({local_batch}) must be divisible by the "
            f"number of local devices ({len(local)})."
        )
    return local


# --- restore and checkpoint ----------------------------------------------------------------------


class _Saver:
    """The run's checkpoints: restores or guards an earlier run's on start, saves finite states.

    A no-op without ``checkpoint_dir``. Each checkpoint holds the host state (every device's
    carry) and, as metadata, the data position and the run's ``config``.
    """

    def __init__(
        self,
        directory: str | os.PathLike | None,
        keep: int,
        desc: str,
        config: Mapping[str, Any] | None,
    ):
        self._ckpt = Checkpointer(directory, max_to_keep=keep) if directory else None
        self._desc = desc
        self._config = to_python(dict(config or {}))

    def __enter__(self) -> _Saver:
        return self

    def __exit__(self, *exc) -> None:
        if self._ckpt is not None:
            self._ckpt.close()

    def start(
        self, state: TrainState, data: BatchIterator, resume: bool, overwrite: bool, say: Say
    ) -> tuple[TrainState, int | None]:
        """``(state, restored step)``: the newest good checkpoint with ``resume`` (the data
        iterator moved to its position), else ``state`` as given once no earlier run's
        checkpoints remain.

        Raises:
          FileExistsError: a fresh run finds checkpoints and ``overwrite`` is False.
          RestoreError: ``resume`` and no checkpoint restores (nothing is renamed or deleted).
        """
        if self._ckpt is None:
            return state, None
        if not resume:
            self._clear_earlier_run(overwrite)
            return state, None
        restored = self._ckpt.restore(template=state)
        if restored is None:
            raise RestoreError(
                f"resume: {self._ckpt.directory} holds no checkpoint to resume from (nothing was "
                f"changed); start a fresh run instead."
            )
        data.restore(restored.meta["data"])
        if say is not None:
            say(f"resumed from {self._ckpt.path(restored.step)} (step {restored.step})")
        return TrainState(*restored.state), restored.step

    def _clear_earlier_run(self, overwrite: bool) -> None:
        steps = self._ckpt.all_steps()
        if not steps:
            return
        if not overwrite:
            raise FileExistsError(
                f"{self._ckpt.directory} holds checkpoints of an earlier run (steps {steps}); "
                f"resume it, or pass overwrite=True (--overwrite) to delete them."
            )
        if jax.process_index() == 0:
            for s in steps:
                shutil.rmtree(self._ckpt.path(s))
        self._ckpt.all_steps()  # reload the listing

    def last_checkpoint(self) -> str:
        """The folder of the newest checkpoint on disk, or ``"none"``."""
        steps = self._ckpt.all_steps() if self._ckpt is not None else []
        return self._ckpt.path(steps[-1]) if steps else "none"

    def save(self, state_r: TrainState, step: int, data: BatchIterator) -> None:
        """Checkpoints the replicated ``state_r`` at ``step`` with the data position.

        Raises:
          NonFiniteError: the state holds a non-finite value (it is never checkpointed).
        """
        if self._ckpt is None:
            return
        host_state = state_to_host(state_r)
        if not all_finite(host_state):
            raise NonFiniteError(
                f"[{self._desc}] step {step}: the training state holds non-finite values (an "
                f"update overflowed); not checkpointed. Last finite checkpoint: "
                f"{self.last_checkpoint()}. Lower the learning rate or clip the gradients."
            )
        meta = {"data": state_dict(data.state), "config": self._config}
        self._ckpt.save(step, host_state, meta)


# --- step ----------------------------------------------------------------------------------------


class _Stepper:
    """One data-parallel optimizer step: this process's shard of the next global batch through
    the pmapped update (the state's buffers donated)."""

    def __init__(
        self,
        pair: TrainStep,
        data: BatchIterator,
        devices: Sequence[jax.Device] | None,
        local_devices: Sequence[jax.Device],
    ):
        from deqjax._src.training.data_parallel import data_parallel

        self._update = parallel_update(pair, data_parallel("pmap", devices))
        self._data = data
        self._local_devices = local_devices

    def __call__(self, state_r: TrainState) -> tuple[TrainState, Metrics, PyTree]:
        """``(new state, metrics on device, the sharded batch)``."""
        batch = shard(next(self._data), self._local_devices)
        state_r, metrics = self._update(state_r, batch)
        return state_r, metrics, batch


# --- log -----------------------------------------------------------------------------------------


def _py_scalar(value: Any) -> Any:
    if isinstance(value, (str, bool, int, float)) or value is None:
        return value
    arr = np.asarray(value)
    return arr.item() if arr.ndim == 0 else to_python(value)


def _epoch(step: int, data: BatchIterator) -> dict:
    steps_per_epoch = getattr(data, "steps_per_epoch", None)
    return {} if steps_per_epoch is None else {"epoch": step / steps_per_epoch}


class _Logger:
    """The run's records: kept in ``history``, appended to the JSONL file (process 0), shown on
    the progress bar. Fetching the train metrics every ``log_every`` steps is the loop's only
    host sync."""

    def __init__(
        self,
        path: str | os.PathLike | None,
        step: int,
        restored_step: int | None,
        overwrite: bool,
        num_steps: int,
        progress: bool,
        desc: str,
    ):
        is_main = jax.process_index() == 0
        self.history: list[dict] = []
        self._writer = MetricsWriter(
            path if path is not None else os.devnull,
            keep_until_step=step if restored_step is not None else None,
            overwrite=overwrite,
            enabled=is_main and path is not None,
        )
        self._bar = progress_bar(
            total=num_steps, initial=step, enabled=progress and is_main, desc=desc
        )
        self._desc = desc
        self._num_steps = num_steps
        self._window = (time.perf_counter(), step)  # examples_per_sec since the last record

    def __enter__(self) -> _Logger:
        return self

    def __exit__(self, *exc) -> None:
        self._bar.close()
        self._writer.close()

    def log(self, record: dict | None) -> None:
        """Keeps and writes ``record`` (None: nothing). history keeps floats (nan stays a float,
        formattable); the file gets JSON strings for non-finite values."""
        if record is None:
            return
        record = {k: _py_scalar(v) for k, v in record.items()}
        self.history.append(record)
        self._writer.write(record)

    def train(
        self, step: int, metrics: Metrics, data: BatchIterator, log_every: int
    ) -> dict[str, float] | None:
        """Advances the bar; on a logging step records the metrics and returns them (host)."""
        self._bar.update(1)
        if step % log_every and step != self._num_steps:
            return None
        host = {k: float(v) for k, v in unreplicate(metrics).items()}
        now, (then, start) = time.perf_counter(), self._window
        rate = (step - start) * (getattr(data, "batch_size", None) or np.nan)
        rate /= max(now - then, 1e-9)
        self._window = (now, step)
        record = {"split": "train", "step": step, **_epoch(step, data), **host}
        self.log({**record, "examples_per_sec": rate})
        self._bar.set_postfix_str(format_metrics(host, keys=("loss", "accuracy")))
        return host

    def eval(self, step: int, means: dict[str, float], data: BatchIterator, say: Say) -> None:
        """Records an evaluation's means and prints them."""
        self.log({"split": "eval", "step": step, **_epoch(step, data), **means})
        if say is not None:
            say(f"[{self._desc}] step {step} eval: " + format_metrics(means))


class _NonFiniteGuard:
    """Reports skipped (non-finite) updates; stops the run when they last too long."""

    def __init__(self, max_steps: int | None, desc: str, say: Say):
        self._max_steps = max_steps
        self._desc = desc
        self._say = say
        self._skipped_seen = 0

    def check(self, step: int, host: dict[str, float] | None, last_checkpoint: Callable) -> None:
        """Reads a logging step's metrics (None: not a logging step).

        Raises:
          NonFiniteError: the streak of skipped updates reached ``max_nonfinite_steps``.
        """
        if host is None:
            return
        skipped = int(host.get("skipped_updates", 0))
        if skipped != self._skipped_seen and self._say is not None:
            self._say(
                f"[{self._desc}] step {step}: {skipped} update(s) skipped so far "
                f"(non-finite loss or gradient; loss {host['loss']})"
            )
        self._skipped_seen = skipped
        streak = int(host.get("nonfinite_streak", 0))
        if self._max_steps is not None and streak >= self._max_steps:
            raise NonFiniteError(
                f"[{self._desc}] stopped at step {step}: the loss or gradient was non-finite for "
                f"the last {streak} steps (>= max_nonfinite_steps={self._max_steps}); each of "
                f"those updates was skipped, so the state stays finite. Last checkpoint: "
                f"{last_checkpoint()}. Lower the learning rate or clip the gradients."
            )


# --- evaluate ------------------------------------------------------------------------------------


class _Evaluator:
    """Evaluation on ``eval_data`` in full (padded, masked): at each epoch end or every
    ``eval_every`` steps, and at the end of the run. Inactive without ``eval_fn``."""

    def __init__(
        self,
        eval_fn: EvalFn | None,
        eval_data: Mapping[str, np.ndarray] | None,
        batch_size: int | None,
        every: int | None,
        train_data: BatchIterator,
        devices: Sequence[jax.Device] | None,
        local_devices: Sequence[jax.Device],
    ):
        checks.check_int(every, "eval_every", allow_none=True)
        if eval_fn is not None and every is None and _steps_per_epoch(train_data) is None:
            raise ValueError("eval_every is required: train_data has no steps_per_epoch.")
        if (eval_fn is None) != (eval_data is None):
            raise ValueError("eval_fn and eval_data must be given together.")
        self._step = make_eval_step(eval_fn, devices=devices) if eval_fn is not None else None
        self._data, self._every, self._local_devices = eval_data, every, local_devices
        self._compiled = lambda: None  # waits for the warm-up's compilation
        if batch_size is None:
            batch_size = getattr(train_data, "batch_size", None)
        self._batch_size = batch_size
        self.last_step: int | None = None
        if eval_fn is not None:
            self._check_batch_size()

    def _check_batch_size(self) -> None:
        if self._batch_size is None:
            raise ValueError("eval_batch_size is required: train_data has no batch_size.")
        num_local = len(self._local_devices)
        if self._batch_size % (jax.process_count() * num_local):
            raise ValueError(
                f"eval_batch_size ({self._batch_size}) must be a multiple of process_count x "
                f"local devices ({jax.process_count()} x {num_local})."
            )

    def warm_up(self, state_r: TrainState) -> None:
        """Compiles the evaluation step in the background (:mod:`~deqjax._src.training.warm_up`)."""
        if self._step is None:
            return
        batch, mask = next(iter(eval_batches(self._data, batch_size=self._batch_size)))
        args = (state_r.params, shard(batch, self._local_devices), shard(mask, self._local_devices))
        (self._compiled,) = compile_in_background([(self._step, args)])

    def due(self, step: int, train_data: BatchIterator) -> bool:
        """Whether ``step`` (just taken) ends an epoch, or is a multiple of ``eval_every``."""
        if self._step is None:
            return False
        if self._every is not None:
            return step % self._every == 0
        steps_per_epoch = _steps_per_epoch(train_data)
        # ShuffledBatches: its index; other epoch-based iterators: the step count
        position = getattr(train_data.state, "index", None)
        if position is None and steps_per_epoch is not None:
            position = (step - 1) % steps_per_epoch + 1
        return steps_per_epoch is not None and position == steps_per_epoch

    def due_at_end(self, step: int) -> bool:
        """Whether the run's last step still needs its evaluation."""
        return self._step is not None and self.last_step != step

    def __call__(self, state_r: TrainState, step: int) -> dict[str, float]:
        """The means over ``eval_data`` of the replicated state's parameters."""
        batches = eval_batches(self._data, batch_size=self._batch_size)
        self.last_step = step
        self._compiled()
        return evaluate(self._step, state_r.params, batches, devices=self._local_devices)


def _steps_per_epoch(data: BatchIterator) -> int | None:
    return getattr(data, "steps_per_epoch", None)


def _peek(data: BatchIterator) -> PyTree:
    """The next batch of ``data``, which stays where it was."""
    position = data.state
    batch = next(data)
    data.restore(position)
    return batch


class _Diagnostics:
    """``diagnostics_fn`` on the current batch every ``diagnostics_every`` steps (its key derived
    from the state's without advancing it). Inactive without ``diagnostics_fn``."""

    def __init__(
        self,
        diagnostics_fn: DiagnosticsFn | None,
        every: int | None,
        devices: Sequence[jax.Device] | None,
    ):
        checks.check_int(every, "diagnostics_every", allow_none=True)
        if diagnostics_fn is not None and every is None:
            raise ValueError("diagnostics_every is required with diagnostics_fn.")
        self._every = every
        self._step = None
        self._compiled = lambda: None  # waits for the warm-up's compilation
        if diagnostics_fn is not None:
            self._step = make_diagnostics_step(diagnostics_fn, devices=devices)

    def warm_up(self, state_r: TrainState, example: Callable[[], PyTree]) -> None:
        """Compiles the diagnostics step in the background, for the batch ``example()`` (called
        only when there are diagnostics)."""
        if self._step is not None:
            (self._compiled,) = compile_in_background([(self._step, (state_r, example()))])

    def __call__(self, state_r: TrainState, batch: PyTree, step: int) -> dict | None:
        """The diagnostics record of ``step``, or None when none is due."""
        if self._step is None or step % self._every:
            return None
        self._compiled()
        diag = {k: float(v) for k, v in unreplicate(self._step(state_r, batch)).items()}
        return {"split": "diagnostics", "step": step, **diag}


# --- stop on SIGTERM -----------------------------------------------------------------------------


class _StopFlag:
    """Set by SIGTERM; the loop saves a checkpoint and returns at the next step boundary."""

    def __init__(self):
        self.value = False

    def __call__(self, signum, frame):
        self.value = True


@contextlib.contextmanager
def _sigterm_handler(enabled: bool) -> Iterator[_StopFlag]:
    """Installs the SIGTERM handler (main thread only) for the duration of the loop."""
    flag = _StopFlag()
    if not enabled or threading.current_thread() is not threading.main_thread():
        yield flag
        return
    previous = signal.signal(signal.SIGTERM, flag)
    try:
        yield flag
    finally:
        signal.signal(signal.SIGTERM, previous)


def _stop_requested(stop: _StopFlag, step: int, log_every: int) -> bool:
    """Whether any process got SIGTERM (asked of all processes on logging steps only)."""
    if jax.process_count() == 1:
        return stop.value
    if step % log_every:
        return False
    from jax.experimental import multihost_utils

    flags = multihost_utils.process_allgather(np.asarray(stop.value, np.int32))
    return bool(np.any(flags))
