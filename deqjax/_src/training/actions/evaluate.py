"""Evaluation over a whole data set at each epoch end (or on a schedule of its own) and at the
end of the run."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import jax
import numpy as np

from deqjax._src import checks
from deqjax._src.data.batching import eval_batches
from deqjax._src.training import warm_up
from deqjax._src.training.actions.action import Action, epoch_fields
from deqjax._src.training.data_parallel import SHARDED
from deqjax._src.training.evaluation import EvalFn, evaluate, make_eval_step
from deqjax._src.training.loop_context import LoopContext
from deqjax._src.training.metrics import format_metrics
from deqjax._src.training.resident_batches import fits_on_devices, nbytes
from deqjax._src.training.schedule import Schedule
from deqjax._src.training.step_metrics import Record, StepMetrics

PyTree = Any


class Evaluate(Action):
    """``eval_fn``'s means over ``eval_data`` in full (padded, masked) as the record
    ``{"split": "eval", "step", "epoch", name: mean, "count"}``, each also said as ``"[desc]
    step s eval: ..."``: every ``every_steps`` steps (or ``every_seconds``, or ``at_steps``), or
    with none of these at each end of an epoch of the training data (every
    ``ctx.data.steps_per_epoch`` steps; ``each_epoch=False``: never); and at the end of the run
    (``at_end``) unless it stopped early (``even_if_stopped``: then too) or its last step was just
    evaluated.

    Its program compiles in the background from :meth:`start` on, while the train step compiles
    (:mod:`~deqjax._src.training.warm_up`); :meth:`close` waits for that compilation to end.
    With ``resident``, the padded batches are placed on the devices once, at the first
    :meth:`start`, where they fit (else, as without it, at each evaluation). Reused by runs one
    after the other on the same devices, it compiles and places once.

    Args:
      eval_fn: ``(params, batch) -> {name: per-example values}``.
      eval_data: ``{name: array[N, ...]}``.
      batch_size: the global eval batch (default the training data's ``batch_size``), a
        multiple of the number of devices.
      every_steps, every_seconds, at_steps: its schedule (none: at each epoch end).
      each_epoch: without ``every_steps``, ``every_seconds`` and ``at_steps``, evaluate at each
        epoch end (False: only at the end).
      at_end: evaluate after the last step.
      even_if_stopped: evaluate at the end also when the run stopped early (e.g. diverged).
      resident: keep the evaluation batches on the devices from one evaluation to the next.

    Raises:
      ValueError: ``eval_fn`` not callable, ``eval_data`` not a mapping, a schedule field or
        ``batch_size`` invalid; at :meth:`start`, no schedule and no epochs in the training
        data, or a batch size the devices do not divide.
    """

    def __init__(
        self,
        eval_fn: EvalFn,
        eval_data: Mapping[str, np.ndarray],
        *,
        batch_size: int | None = None,
        every_steps: int | None = None,
        every_seconds: float | None = None,
        at_steps: tuple[int, ...] = (),
        each_epoch: bool = True,
        at_end: bool = True,
        even_if_stopped: bool = False,
        resident: bool = False,
    ):
        if not callable(eval_fn):
            raise ValueError(f"eval_fn must be callable, got {type(eval_fn).__name__}.")
        if not isinstance(eval_data, Mapping) or not eval_data:
            raise ValueError("eval_data must be a non-empty mapping of name -> array.")
        super().__init__(
            every_steps=every_steps, every_seconds=every_seconds, at_steps=at_steps, at_end=at_end
        )
        self._asked = self.schedule  # start adds the epoch ends when no period is given
        self._fn, self._data = eval_fn, eval_data
        self._batch_size = checks.check_int(batch_size, "batch_size", allow_none=True)
        self._each_epoch, self._even_if_stopped = bool(each_epoch), bool(even_if_stopped)
        self._resident = bool(resident)
        self._compiled = lambda: None  # waits for the warm-up's compilation
        self._step, self._for, self._placed = None, None, None  # per DataParallel

    def start(self, ctx: LoopContext) -> None:
        self.schedule = self._asked
        if not self._asked.periodic and self._each_epoch:
            if ctx.data is None or ctx.data.steps_per_epoch is None:
                raise ValueError(
                    "Evaluate needs every_steps, every_seconds or at_steps: the training data "
                    "has no epochs (steps_per_epoch)."
                )
            every = ctx.data.steps_per_epoch
            self.schedule = Schedule(every_steps=every, at_end=self._asked.at_end)
        if self._prepare(ctx):  # a new eval step: compile it while the train step compiles
            first = self._placed[0] if self._placed is not None else next(self._batches())
            (self._compiled,) = warm_up.compile_in_background(
                [(self._step, (ctx.state_shapes.params, *first))]
            )

    def _prepare(self, ctx: LoopContext) -> bool:
        """The eval step and batch size for ``ctx.parallel`` (kept while it stays the same, as
        in runs one after the other), and the batches on the devices if ``resident`` and they
        fit; returns whether the step is new."""
        if ctx.parallel is None:
            raise ValueError("Evaluate needs the run's DataParallel (LoopContext.parallel).")
        if self._for == ctx.parallel:
            return False
        batch_size = self._batch_size
        if batch_size is None and ctx.data is not None:
            batch_size = ctx.data.batch_size
        if batch_size is None:
            raise ValueError("Evaluate needs batch_size: the training data has none.")
        num_local = len(ctx.parallel.local_devices)
        if batch_size % (jax.process_count() * num_local):
            raise ValueError(
                f"the eval batch size ({batch_size}) must be a multiple of process_count x "
                f"local devices ({jax.process_count()} x {num_local})."
            )
        self._for, self._size = ctx.parallel, batch_size
        self._step = make_eval_step(self._fn, ctx.parallel)
        self._placed = None
        if self._resident and fits_on_devices(nbytes(self._data), ctx.parallel.local_devices):
            self._placed = list(self._batches())
        return True

    def _batches(self) -> Iterator[PyTree]:
        """Each padded ``(batch, mask)`` pair of the evaluation set, placed on the devices."""
        for pair in eval_batches(self._data, batch_size=self._size):
            yield self._for.put(pair, SHARDED)

    def run(self, step: int, state: PyTree, metrics: StepMetrics, batch: PyTree) -> Record:
        batches = self._placed if self._placed is not None else self._batches()
        self._compiled()
        means = evaluate(self._step, state.params, batches, self._for, placed=True)
        self.ctx.tell(f"step {step} eval: " + format_metrics(means))
        return {"split": "eval", "step": step, **epoch_fields(step, self.ctx.data), **means}

    def end(self, step: int, state: PyTree, stopped: bool) -> Record | None:
        if (stopped and not self._even_if_stopped) or self.last_step == step:
            return None
        return self.run(step, state, self.ctx.last_metrics, None)

    def close(self) -> None:
        self._compiled()  # no compilation left running when the run ends
