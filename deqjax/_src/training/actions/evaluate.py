"""Evaluation over a whole data set at each epoch end (or every ``every_steps`` steps) and at the
end of the run."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import jax
import numpy as np

from deqjax._src import checks
from deqjax._src.data.batching import eval_batches
from deqjax._src.training import warm_up
from deqjax._src.training.actions.action import Action, due, epoch_fields
from deqjax._src.training.data_parallel import SHARDED, DataParallel
from deqjax._src.training.evaluation import EvalFn, evaluate, make_eval_step
from deqjax._src.training.metrics import format_metrics
from deqjax._src.training.resident_batches import fits_on_devices, nbytes
from deqjax._src.training.train_loop import Record, StepMetrics

PyTree = Any


class Evaluate(Action):
    """``eval_fn``'s means over ``eval_data`` in full (padded, masked) as the record
    ``{"split": "eval", "step", "epoch", name: mean, "count"}``: every ``every_steps`` steps, or
    (None) at the end of each epoch of ``train_data``; and at the end of the run unless it stopped
    early or its last step was just evaluated. Each evaluation is also said as ``"[desc] step s
    eval: ..."``.

    Its program compiles in the background from :meth:`start` on, while the train step compiles
    (:mod:`~deqjax._src.training.warm_up`). With ``resident``, the padded batches are placed on
    the devices once, at :meth:`start`, where they fit (else, as without it, at each evaluation).

    Args:
      eval_fn: ``(params, batch) -> {name: per-example values}``.
      eval_data: ``{name: array[N, ...]}``.
      parallel: how the train step runs over the devices (the parameters' placement).
      train_data: the training :class:`~deqjax.data.BatchIterator` (its epochs, and the default
        ``batch_size``).
      batch_size: the global eval batch (default ``train_data.batch_size``), a multiple of the
        number of devices.
      every_steps: steps between evaluations (None: at each epoch end).
      resident: keep the evaluation batches on the devices from one evaluation to the next.
      desc: the run's label in messages.
      say: where the evaluation summaries go (None: silent).

    Raises:
      ValueError: ``every_steps`` is None and ``train_data`` has no epochs, or no batch size, or
        one that the devices do not divide.
    """

    def __init__(
        self,
        eval_fn: EvalFn,
        eval_data: Mapping[str, np.ndarray],
        *,
        parallel: DataParallel,
        train_data: Any,
        batch_size: int | None = None,
        every_steps: int | None = None,
        resident: bool = False,
        desc: str = "train",
        say: Callable[[str], None] | None = None,
    ):
        self._every = checks.check_int(every_steps, "every_steps", allow_none=True)
        self._epoch_steps = getattr(train_data, "steps_per_epoch", None)
        if every_steps is None and self._epoch_steps is None:
            raise ValueError("every_steps is required: train_data has no steps_per_epoch.")
        if batch_size is None:
            batch_size = getattr(train_data, "batch_size", None)
        if batch_size is None:
            raise ValueError("batch_size is required: train_data has no batch_size.")
        num_local = len(parallel.local_devices)
        if batch_size % (jax.process_count() * num_local):
            raise ValueError(
                f"the eval batch size ({batch_size}) must be a multiple of process_count x "
                f"local devices ({jax.process_count()} x {num_local})."
            )
        self._data, self._batch_size = eval_data, batch_size
        self._parallel, self._train_data = parallel, train_data
        self._desc, self._say = desc, say
        self._step = make_eval_step(eval_fn, parallel)
        self._compiled = lambda: None  # waits for the warm-up's compilation
        self._last_step: int | None = None
        self._resident = bool(resident)
        self._placed: list[PyTree] | None = None  # the placed (batch, mask) pairs, if resident

    def start(self, step: int, state: PyTree) -> None:
        devices = self._parallel.local_devices
        if self._resident and fits_on_devices(nbytes(self._data), devices):
            self._placed = list(self._placed_batches())
            first = self._placed[0]
        else:
            first = next(self._placed_batches())
        (self._compiled,) = warm_up.compile_in_background([(self._step, (state.params, *first))])

    def _placed_batches(self) -> Iterator[PyTree]:
        """Each padded ``(batch, mask)`` pair of the evaluation set, placed on the devices."""
        for pair in eval_batches(self._data, batch_size=self._batch_size):
            yield self._parallel.put(pair, SHARDED)

    def __call__(
        self, step: int, state: PyTree, metrics: StepMetrics, batch: PyTree
    ) -> Record | None:
        return self._evaluate(step, state) if self._due(step) else None

    def end(self, step: int, state: PyTree, stopped: bool) -> Record | None:
        if stopped or self._last_step == step:
            return None
        return self._evaluate(step, state)

    def _due(self, step: int) -> bool:
        """Whether ``step`` (just taken) is a multiple of ``every_steps``, or ends an epoch."""
        if self._every is not None:
            return due(step, self._every)
        # ShuffledBatches: its index; other epoch-based iterators: the step count
        position = getattr(self._train_data.state, "index", None)
        if position is None:
            position = (step - 1) % self._epoch_steps + 1
        return position == self._epoch_steps

    def _evaluate(self, step: int, state: PyTree) -> Record:
        batches = self._placed if self._placed is not None else self._placed_batches()
        self._last_step = step
        self._compiled()
        means = evaluate(self._step, state.params, batches, self._parallel, placed=True)
        if self._say is not None:
            self._say(f"[{self._desc}] step {step} eval: " + format_metrics(means))
        return {"split": "eval", "step": step, **epoch_fields(step, self._train_data), **means}
