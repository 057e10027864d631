"""Short training runs, many initialisations through one compiled step: the init paper's Fig. 5.

The main job's ``--sweep`` (``experiments/fashion_mnist.py``; its runs listed by
``init_sweep.InitSweepConfig.runs``). :func:`short_runs` is a composition of the public training
parts: one data-parallel train step (:func:`deqjax.training.train_step` mapped by the run's
:class:`deqjax.training.DataParallel`) and one evaluation, both compiled once and reused by every
run (only the initial parameters and the data order differ); each run is a
:func:`deqjax.training.train_loop` with two actions, :class:`StopWhenNonFinite` (the loss read
every ``log_every`` steps, the run stopped as diverged once it is non-finite) and
:class:`deqjax.training.Evaluate` at the end only, also of a run that stopped early
(``each_epoch=False, even_if_stopped=True``: the run evaluated as it stands, diverged or not).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np
import optax
from tqdm.auto import tqdm

from deqjax import data, training

PyTree = Any


class StopWhenNonFinite(training.Action):
    """Reads the loss every ``every_steps`` steps and at the run's last step, and asks the loop
    to stop once it is non-finite: the run has diverged.

    Reusable: :meth:`start` forgets the previous run.

    Args:
      every_steps: steps between reads of the metrics (each a host sync).

    Attributes:
      diverged: the last loss read was non-finite.
      last: the metrics read last, ``{name: float}`` (those of the run's last step once the loop
        has ended: it stops on a step it read, or ends on ``num_steps``).

    Raises:
      ValueError: ``every_steps`` not an int >= 1.
    """

    def __init__(self, *, every_steps: int):
        super().__init__(every_steps=every_steps)
        self._asked = self.schedule  # start adds each run's last step to it
        self.diverged = False
        self.last: dict[str, float] = {}

    def start(self, ctx: training.LoopContext) -> None:
        self.schedule = self._asked.also_at(ctx.num_steps)
        self.diverged, self.last = False, {}

    def run(self, step: int, state: PyTree, metrics: training.StepMetrics, batch: PyTree) -> None:
        self.last = metrics.host()
        self.diverged = not math.isfinite(self.last["loss"])

    def stop_requested(self) -> bool:
        return self.diverged


def short_runs(
    runs: Sequence[Mapping[str, Any]],
    *,
    init: Callable[..., PyTree],
    loss_fn: Callable[..., tuple[jax.Array, Mapping[str, jax.Array]]],
    optimizer: optax.GradientTransformation,
    eval_fn: Callable[[PyTree, PyTree], Mapping[str, jax.Array]],
    train: Mapping[str, np.ndarray],
    test: Mapping[str, np.ndarray],
    batch_size: int,
    eval_batch_size: int,
    num_steps: int,
    log_every: int,
    parallel: training.DataParallel,
    per_device_rng: bool = False,
    progress: bool = True,
    device_resident: bool = False,
    print_fn: Callable[[str], None] | None = print,
) -> list[dict]:
    """Trains and evaluates one short run per entry of ``runs``; returns one row per run.

    Args:
      runs: configurations, each a mapping with a ``"seed"`` (the init key, the training RNG and
        the data order) and any other keys (copied into the row), e.g. ``family`` and ``scale``.
      init: ``init(**run) -> params``.
      loss_fn: ``(params, batch, key, reg_state, step) -> (loss, metrics)`` shared by every run.
      optimizer: the optax transformation (not wrapped: a non-finite loss ends the run instead).
      eval_fn: ``(params, batch) -> {name: per-example values}``.
      train, test: ``{name: array[N, ...]}`` training and evaluation sets.
      batch_size, eval_batch_size, num_steps: per run.
      log_every: the loss is checked for finiteness every this many steps (host syncs).
      parallel: how the steps run over the devices (the run's
        :class:`deqjax.training.DataParallel`, built once by the caller).
      per_device_rng: see :func:`deqjax.training.train_step`.
      progress: a progress bar over the runs (else one printed line per run).
      device_resident: each run's batches gathered on the devices from the training set placed
        there (:class:`deqjax.training.ResidentBatches`: the same batches, no host-to-device copy
        per step), else placed from the host step by step.
      print_fn: where the per-run lines go.

    Returns:
      Rows: the run's keys, ``test_error`` (1 - accuracy; a non-finite accuracy counts as 0),
      ``test_<metric>`` for the other eval metrics, ``train_<metric>_last`` for the last step's
      ``loss``, ``nfe`` and ``rel_residual`` (when logged), ``diverged`` (the loss turned
      non-finite), ``steps_run`` and ``seconds``.
    """
    pair = training.train_step(loss_fn, optimizer, per_device_rng=per_device_rng)
    step_fn = parallel.map_update(pair.update)
    check = StopWhenNonFinite(every_steps=log_every)
    evaluate = training.Evaluate(
        eval_fn, test, batch_size=eval_batch_size, each_epoch=False, even_if_stopped=True
    )
    context = training.LoopContext(parallel=parallel)  # records without epochs
    rows: list[dict] = []
    bar = tqdm(total=len(runs), disable=not progress, desc="sweep", dynamic_ncols=True, leave=True)
    for run in runs:
        t0 = time.perf_counter()
        state = pair.init(init(**run), jax.random.PRNGKey(run["seed"]))
        batches = data.ShuffledBatches(train, batch_size=batch_size, seed=run["seed"])
        if device_resident:
            placed = training.ResidentBatches(batches, parallel)
        else:
            placed = (parallel.put(batch, training.SHARDED) for batch in batches)
        result = training.train_loop(
            step_fn,
            parallel.put(state, training.STATE_KINDS),
            placed,
            num_steps=num_steps,
            actions=(check, evaluate),
            context=context,
            read_metrics=lambda m: parallel.get(m, training.REPLICATED),
        )
        (ev,) = [r for r in result.history if r["split"] == "eval"]
        acc = ev["accuracy"] if math.isfinite(ev["accuracy"]) else 0.0
        row = {**run, "test_error": 1.0 - acc}
        skip = ("split", "step", "accuracy", "count")
        row |= {f"test_{k}": v for k, v in ev.items() if k not in skip}
        last = check.last
        row |= {f"train_{k}_last": last[k] for k in ("loss", "nfe", "rel_residual") if k in last}
        row |= {"diverged": check.diverged, "steps_run": result.step}
        row["seconds"] = time.perf_counter() - t0
        rows.append(row)
        label = " ".join(f"{k} {v}" for k, v in run.items())
        bar.update(1)
        bar.set_postfix_str(f"{label}: err {row['test_error']:.3f}")
        if not progress and print_fn is not None:
            extra = " DIVERGED" if check.diverged else ""
            print_fn(f"{label}: test error {row['test_error']:.4f}{extra}")
    bar.close()
    return rows
