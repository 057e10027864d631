"""Sweeps of short training runs: many initialisations through one compiled step, and their tables.

:func:`short_runs` trains one short run per configuration (e.g. init family × scale × seed, the
init paper's Fig. 5; :func:`grid` lists them), reusing a single compiled train and eval step (only
the initial parameters and the data order differ), stops a run whose loss turns non-finite and
evaluates every run as it stands. :func:`summarize_runs` groups the rows (median, mean, min, max
of one value) and :func:`median_rows` gives the median of every value (e.g. over seeds).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np
import optax

from deqjax._src.data.batching import ShuffledBatches, eval_batches
from deqjax._src.training.data_parallel import (
    REPLICATED,
    SHARDED,
    STATE_KINDS,
    data_parallel,
)
from deqjax._src.training.evaluation import EvalFn, evaluate, make_eval_step
from deqjax._src.training.metrics import progress_bar
from deqjax._src.training.train_state import create_train_state
from deqjax._src.training.train_step import LossFn, make_train_step

PyTree = Any


def grid(**axes: Sequence[Any]) -> list[dict]:
    """Every combination of the axes' values, one dict each, the last axis varying fastest:
    ``grid(family=("gaussian", "goe"), seed=(0, 1))`` gives four runs."""
    runs: list[dict] = [{}]
    for name, values in axes.items():
        runs = [run | {name: value} for run in runs for value in values]
    return runs


def short_runs(
    runs: Sequence[Mapping[str, Any]],
    *,
    init: Callable[..., PyTree],
    loss_fn: LossFn,
    optimizer: optax.GradientTransformation,
    eval_fn: EvalFn,
    train: Mapping[str, np.ndarray],
    test: Mapping[str, np.ndarray],
    batch_size: int,
    eval_batch_size: int,
    num_steps: int,
    log_every: int,
    per_device_rng: bool = False,
    progress: bool = True,
    parallel: str = "sharded",
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
      per_device_rng: see :func:`~deqjax.training.train_step`.
      progress: a progress bar over the runs (else one printed line per run).
      parallel: how the steps run over every device: ``"sharded"`` or ``"pmap"``
        (:func:`~deqjax.training.data_parallel`).
      print_fn: where the per-run lines go.

    Returns:
      Rows: the run's keys, ``test_error`` (1 - accuracy; a non-finite accuracy counts as 0),
      ``test_<metric>`` for the other eval metrics, ``train_<metric>_last`` for the last step's
      ``loss``, ``nfe`` and ``rel_residual`` (when logged), ``diverged`` (the loss turned
      non-finite), ``steps_run`` and ``seconds``.
    """
    parallel = data_parallel(parallel)
    step_fn = make_train_step(loss_fn, optimizer, per_device_rng=per_device_rng, parallel=parallel)
    eval_step = make_eval_step(eval_fn, parallel)
    rows: list[dict] = []
    bar = progress_bar(total=len(runs), enabled=progress, desc="sweep")
    for run in runs:
        t0 = time.perf_counter()
        params = init(**run)
        key = jax.random.PRNGKey(run["seed"])
        state = parallel.put(create_train_state(params, optimizer, key), STATE_KINDS)
        it = ShuffledBatches(train, batch_size=batch_size, seed=run["seed"])
        diverged = False
        for step in range(num_steps):
            state, metrics = step_fn(state, parallel.put(next(it), SHARDED))
            if (step + 1) % log_every == 0 or step + 1 == num_steps:
                if not math.isfinite(float(parallel.get(metrics, REPLICATED)["loss"])):
                    diverged = True
                    break
        last = {k: float(v) for k, v in parallel.get(metrics, REPLICATED).items()}
        batches = eval_batches(test, batch_size=eval_batch_size)
        ev = evaluate(eval_step, state.params, batches, parallel)
        acc = ev["accuracy"] if math.isfinite(ev["accuracy"]) else 0.0
        row = {**run, "test_error": 1.0 - acc}
        row |= {f"test_{k}": v for k, v in ev.items() if k not in ("accuracy", "count")}
        row |= {f"train_{k}_last": last[k] for k in ("loss", "nfe", "rel_residual") if k in last}
        row |= {"diverged": diverged, "steps_run": step + 1, "seconds": time.perf_counter() - t0}
        rows.append(row)
        label = " ".join(f"{k} {v}" for k, v in run.items())
        bar.update(1)
        bar.set_postfix_str(f"{label}: err {row['test_error']:.3f}")
        if not progress and print_fn is not None:
            extra = " DIVERGED" if diverged else ""
            print_fn(f"{label}: test error {row['test_error']:.4f}{extra}")
    bar.close()
    return rows


def summarize_runs(
    rows: Sequence[Mapping[str, Any]],
    by: Sequence[str],
    value: str = "test_error",
    *,
    name: str = "error",
    means: Sequence[str] = ("test_nfe",),
) -> list[dict]:
    """One row per group of ``by`` values (in first-seen order): ``n``, ``median_<name>``,
    ``mean_<name>``, ``min_<name>``, ``max_<name>`` of ``value`` and ``mean_<m>`` of ``means``."""
    groups: dict[tuple, list] = {}
    for r in rows:
        groups.setdefault(tuple(r[k] for k in by), []).append(r)
    out = []
    for key, rs in groups.items():
        v = np.array([r[value] for r in rs], dtype=np.float64)
        row = dict(zip(by, key)) | {"n": int(v.size)}
        row |= {f"median_{name}": float(np.median(v)), f"mean_{name}": float(np.mean(v))}
        row |= {f"min_{name}": float(np.min(v)), f"max_{name}": float(np.max(v))}
        row |= {f"mean_{m}": float(np.mean([r[m] for r in rs])) for m in means if m in rs[0]}
        out.append(row)
    return out


def median_rows(rows: Sequence[Mapping[str, Any]], by: Sequence[str]) -> list[dict]:
    """One row per group of ``by`` values (in first-seen order): those values, then the median
    of every other key of the group's first row (e.g. the median over seeds of each metric)."""
    groups: dict[tuple, list] = {}
    for r in rows:
        groups.setdefault(tuple(r[k] for k in by), []).append(r)
    out = []
    for key, rs in groups.items():
        values = {k: float(np.median([r[k] for r in rs])) for k in rs[0] if k not in by}
        out.append(dict(zip(by, key)) | values)
    return out
