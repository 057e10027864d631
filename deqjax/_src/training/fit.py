"""The generic training driver: resume, step, log, evaluate, checkpoint, stop cleanly on SIGTERM."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import jax
import numpy as np
import optax

from deqjax._src import checks
from deqjax._src.data.batching import BatchIterator, eval_batches, state_dict
from deqjax._src.training.checkpoint import Checkpointer, RestoreError, all_finite
from deqjax._src.training.evaluation import EvalFn, evaluate, make_eval_step
from deqjax._src.training.metrics import MetricsWriter, format_metrics, progress_bar, to_python
from deqjax._src.training.train_state import (
    TrainState,
    device_sharding,
    replicate,
    shard,
    unreplicate,
)
from deqjax._src.training.train_step import (
    DiagnosticsFn,
    LossFn,
    RegUpdateFn,
    TrainStep,
    make_diagnostics_step,
    pmap_update,
)
from deqjax._src.training.train_step import train_step as build_train_step

PyTree = Any


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
    :func:`~deqjax.training.make_train_step` logs as ``skipped_updates`` and ``nonfinite_streak``.
    """
    return optax.apply_if_finite(optimizer, max_consecutive_errors=_NEVER)


class _StopFlag:
    """Set by SIGTERM; the loop saves a checkpoint and returns at the next step boundary."""

    def __init__(self):
        self.value = False

    def __call__(self, signum, frame):
        self.value = True


@contextlib.contextmanager
def _sigterm_handler(enabled: bool):
    flag = _StopFlag()
    if not enabled or threading.current_thread() is not threading.main_thread():
        yield flag
        return
    previous = signal.signal(signal.SIGTERM, flag)
    try:
        yield flag
    finally:
        signal.signal(signal.SIGTERM, previous)


def _any_process(flag: bool) -> bool:
    if jax.process_count() == 1:
        return flag
    from jax.experimental import multihost_utils

    return bool(np.any(multihost_utils.process_allgather(np.asarray(flag, np.int32))))


def _py_scalar(value):
    if isinstance(value, (str, bool, int, float)) or value is None:
        return value
    arr = np.asarray(value)
    return arr.item() if arr.ndim == 0 else to_python(value)


def _stack(tree: PyTree, n: int) -> PyTree:
    """One copy of every leaf per device: ``[n, *x.shape]`` host arrays."""
    return jax.tree_util.tree_map(lambda x: np.stack([np.asarray(x)] * n), tree)


def _to_devices(state: TrainState, devices: Sequence[jax.Device]) -> TrainState:
    """Replicates the state over ``devices``; the carry, already one per device, is split."""
    state_r = replicate(state._replace(carry=()), devices)
    carry = jax.device_put(state.carry, device_sharding(devices))
    return state_r._replace(carry=carry)


def _to_host(state_r: TrainState) -> TrainState:
    """The first replica of the state on the host, with every local device's carry."""

    def gather(x):
        shards = sorted(x.addressable_shards, key=lambda sh: sh.index[0].start or 0)
        return np.concatenate([np.asarray(sh.data) for sh in shards])

    state = unreplicate(state_r._replace(carry=()))
    return state._replace(carry=jax.tree_util.tree_map(gather, state_r.carry))


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

    The loop: build the state (or restore the newest good checkpoint with ``resume``, including
    the data position and RNG); per step take this process's shard of the next global batch and
    run the pmapped step; every ``log_every`` steps fetch the metrics to the host, write a JSONL
    record and update the progress bar; every ``diagnostics_every`` steps run ``diagnostics_fn``;
    at the end of each epoch (or every ``eval_every`` steps) evaluate; every
    ``checkpoint_every`` steps and at the end save a checkpoint. On SIGTERM it saves a checkpoint
    and returns with ``interrupted=True`` (exit with a non-zero status in the caller).

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
        :func:`~deqjax.training.make_train_step`.
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
      update_reg_state: ``(reg_state, metrics, step) -> reg_state``; see ``make_train_step``.
      learning_rate_fn: a schedule, logged as ``"learning_rate"``.
      per_device_rng: see ``make_train_step``.
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
    checks.check_positive_int(num_steps, "num_steps")
    checks.check_int(max_nonfinite_steps, "max_nonfinite_steps", allow_none=True)
    checks.check_positive_int(log_every, "log_every")
    checks.check_int(checkpoint_every, "checkpoint_every", allow_none=True)
    checks.check_int(eval_every, "eval_every", allow_none=True)
    checks.check_int(diagnostics_every, "diagnostics_every", allow_none=True)
    if not isinstance(train_data, BatchIterator):
        raise ValueError(
            f"train_data must be a deqjax.data.BatchIterator (next(), state, restore(state)), "
            f"got {type(train_data).__name__}."
        )
    if (train_step is None) == (loss_fn is None) or (loss_fn is None) != (optimizer is None):
        raise ValueError("pass either loss_fn and optimizer, or train_step (a TrainStep pair).")
    if train_step is not None and (update_reg_state or learning_rate_fn or not per_device_rng):
        raise ValueError(
            "update_reg_state, learning_rate_fn and per_device_rng belong to the train_step pair: "
            "pass them to deqjax.training.train_step."
        )
    steps_per_epoch = getattr(train_data, "steps_per_epoch", None)
    global_batch = getattr(train_data, "batch_size", None)
    local_batch = getattr(train_data, "local_batch_size", None)
    if eval_fn is not None and steps_per_epoch is None and eval_every is None:
        raise ValueError("eval_every is required: train_data has no steps_per_epoch.")
    if (eval_fn is None) != (eval_data is None):
        raise ValueError("eval_fn and eval_data must be given together.")
    if diagnostics_fn is not None and diagnostics_every is None:
        raise ValueError("diagnostics_every is required with diagnostics_fn.")
    if resume and checkpoint_dir is None:
        raise ValueError("resume=True needs checkpoint_dir.")
    if resume and overwrite:
        raise ValueError("resume and overwrite contradict each other: choose one.")
    # pmap gets ``devices`` as given (None: every device of every process, which multi-host
    # collectives need); arrays are placed on this process's share of them.
    if devices is None:
        local_devices = jax.local_devices()
    else:
        local_devices = [d for d in devices if d.process_index == jax.process_index()]
    if local_batch is not None and local_batch % len(local_devices):
        raise ValueError(
            f"the per-process batch ({local_batch}) must be divisible by the "
            f"number of local devices ({len(local_devices)})."
        )
    eval_batch_size = global_batch if eval_batch_size is None else eval_batch_size
    if eval_fn is not None and eval_batch_size is None:
        raise ValueError("eval_batch_size is required: train_data has no batch_size.")
    if eval_fn is not None and eval_batch_size % (jax.process_count() * len(local_devices)):
        raise ValueError(
            f"eval_batch_size ({eval_batch_size}) must be a multiple of process_count x local "
            f"devices ({jax.process_count()} x {len(local_devices)})."
        )
    is_main = jax.process_index() == 0
    if train_step is None:
        if max_nonfinite_steps is not None:
            optimizer = skip_nonfinite(optimizer)
        train_step = build_train_step(
            loss_fn,
            optimizer,
            update_reg_state=update_reg_state,
            learning_rate_fn=learning_rate_fn,
            per_device_rng=per_device_rng,
            with_carry=carry is not None,
        )
    state = train_step.init(params, rng, reg_state=reg_state, carry=() if carry is None else carry)
    # The carry is per device: a template with one copy per local device.
    state = state._replace(carry=_stack(state.carry, len(local_devices)))
    ckpt = Checkpointer(checkpoint_dir, max_to_keep=keep_checkpoints) if checkpoint_dir else None
    restored_step = None
    if ckpt is not None and not resume and ckpt.all_steps():
        if not overwrite:
            ckpt.close()
            raise FileExistsError(
                f"{ckpt.directory} holds checkpoints of an earlier run (steps "
                f"{ckpt.all_steps()}); resume it, or pass overwrite=True (--overwrite) to "
                f"delete them."
            )
        if is_main:
            for s in ckpt.all_steps():
                shutil.rmtree(ckpt.path(s))
        ckpt.all_steps()  # reload the listing
    if ckpt is not None and resume:
        try:
            restored = ckpt.restore(template=state)
        except RestoreError:
            ckpt.close()
            raise
        if restored is None:
            ckpt.close()
            raise RestoreError(
                f"resume: {ckpt.directory} holds no checkpoint to resume from (nothing was "
                f"changed); start a fresh run instead."
            )
        state = TrainState(*restored.state)
        train_data.restore(restored.meta["data"])
        restored_step = restored.step
        if print_fn is not None and is_main:
            print_fn(f"resumed from {ckpt.path(restored.step)} (step {restored.step})")
    step = int(np.asarray(state.step))

    update_fn = pmap_update(train_step, devices=devices)
    eval_step = make_eval_step(eval_fn, devices=devices) if eval_fn is not None else None
    diag_step = None
    if diagnostics_fn is not None:
        diag_step = make_diagnostics_step(diagnostics_fn, devices=devices)
    history: list[dict] = []
    try:
        writer = MetricsWriter(
            metrics_path if metrics_path is not None else os.devnull,
            keep_until_step=step if restored_step is not None else None,
            overwrite=overwrite,
            enabled=is_main and metrics_path is not None,
        )
    except FileExistsError:
        if ckpt is not None:
            ckpt.close()
        raise

    def _epoch(step: int) -> dict:
        return {} if steps_per_epoch is None else {"epoch": step / steps_per_epoch}

    def log(record: dict) -> None:
        # history keeps floats (nan stays a float, formattable); the file gets JSON strings.
        record = {k: _py_scalar(v) for k, v in record.items()}
        history.append(record)
        writer.write(record)

    def save(state_r) -> None:
        if ckpt is None:
            return
        host_state = _to_host(state_r)
        if not all_finite(host_state):
            last = ckpt.all_steps()
            raise NonFiniteError(
                f"[{desc}] step {step}: the training state holds non-finite values (an update "
                f"overflowed); not checkpointed. Last finite checkpoint: "
                f"{ckpt.path(last[-1]) if last else 'none'}. Lower the learning rate or clip "
                f"the gradients."
            )
        meta = {"data": state_dict(train_data.state), "config": to_python(dict(config or {}))}
        ckpt.save(step, host_state, meta)

    def run_eval(state_r) -> None:
        batches = eval_batches(eval_data, batch_size=eval_batch_size)
        means = evaluate(eval_step, state_r.params, batches, devices=local_devices)
        record = {"split": "eval", "step": step, **_epoch(step), **means}
        log(record)
        if print_fn is not None and is_main:
            print_fn(f"[{desc}] step {step} eval: " + format_metrics(means))

    state_r = _to_devices(state, local_devices)
    del state
    interrupted = False
    last_eval_step = None
    bar = progress_bar(total=num_steps, initial=step, enabled=progress and is_main, desc=desc)
    t_window, window_start = time.perf_counter(), step
    skipped_seen = None
    try:
        with _sigterm_handler(handle_sigterm) as stop:
            while step < num_steps:
                batch = shard(next(train_data), local_devices)
                state_r, metrics = update_fn(state_r, batch)
                step += 1
                bar.update(1)
                if step % log_every == 0 or step == num_steps:
                    host = {k: float(v) for k, v in unreplicate(metrics).items()}
                    now = time.perf_counter()
                    rate = (step - window_start) * (global_batch or np.nan)
                    rate /= max(now - t_window, 1e-9)
                    t_window, window_start = now, step
                    log(
                        {
                            "split": "train",
                            "step": step,
                            **_epoch(step),
                            **host,
                            "examples_per_sec": rate,
                        }
                    )
                    bar.set_postfix_str(format_metrics(host, keys=("loss", "accuracy")))
                    skipped = int(host.get("skipped_updates", 0))
                    if skipped != (skipped_seen or 0) and print_fn is not None and is_main:
                        print_fn(
                            f"[{desc}] step {step}: {skipped} update(s) skipped so far "
                            f"(non-finite loss or gradient; loss {host['loss']})"
                        )
                    skipped_seen = skipped
                    streak = int(host.get("nonfinite_streak", 0))
                    if max_nonfinite_steps is not None and streak >= max_nonfinite_steps:
                        last = ckpt.all_steps() if ckpt is not None else []
                        raise NonFiniteError(
                            f"[{desc}] stopped at step {step}: the loss or gradient was "
                            f"non-finite for the last {streak} steps (>= max_nonfinite_steps="
                            f"{max_nonfinite_steps}); each of those updates was skipped, so the "
                            f"state stays finite. Last checkpoint: "
                            f"{ckpt.path(last[-1]) if last else 'none'}. Lower the learning "
                            f"rate or clip the gradients."
                        )
                if diag_step is not None and step % diagnostics_every == 0:
                    diag = {k: float(v) for k, v in unreplicate(diag_step(state_r, batch)).items()}
                    log({"split": "diagnostics", "step": step, **diag})
                # ShuffledBatches: its index; other epoch-based iterators: the step count
                position = getattr(train_data.state, "index", None)
                if position is None and steps_per_epoch is not None:
                    position = (step - 1) % steps_per_epoch + 1
                end_of_epoch = steps_per_epoch is not None and position == steps_per_epoch
                if eval_step is not None and (
                    (eval_every is None and end_of_epoch)
                    or (eval_every is not None and step % eval_every == 0)
                ):
                    run_eval(state_r)
                    last_eval_step = step
                if checkpoint_every is not None and step % checkpoint_every == 0:
                    save(state_r)
                check_now = jax.process_count() == 1 or step % log_every == 0
                if check_now and _any_process(stop.value):
                    interrupted = True
                    save(state_r)
                    if print_fn is not None and is_main:
                        print_fn(f"[{desc}] SIGTERM: saved checkpoint at step {step}, stopping")
                    break
            if not interrupted:
                if eval_step is not None and last_eval_step != step:
                    run_eval(state_r)
                save(state_r)
    finally:
        bar.close()
        writer.close()
        if ckpt is not None:
            ckpt.close()
    return FitResult(
        state=TrainState(*_to_host(state_r)),
        data_state=train_data.state,
        history=history,
        interrupted=interrupted,
        restored_step=restored_step,
    )
