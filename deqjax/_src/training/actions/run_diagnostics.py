"""Occasional diagnostics on the current batch (costly monitors: backward residual, ‖J‖_F)."""

from __future__ import annotations

from typing import Any

from deqjax._src import checks
from deqjax._src.training import warm_up
from deqjax._src.training.actions.action import Action
from deqjax._src.training.data_parallel import REPLICATED, SHARDED
from deqjax._src.training.evaluation import DiagnosticsFn, make_diagnostics_step
from deqjax._src.training.loop_context import LoopContext
from deqjax._src.training.resident_batches import PlacedBatches
from deqjax._src.training.step_metrics import Record, StepMetrics

PyTree = Any


class RunDiagnostics(Action):
    """``diagnostics_fn`` on the step's batch every ``every_steps`` steps: the record
    ``{"split": "diagnostics", "step", name: value}`` (its key derived from the state's without
    advancing it, so training stays bit-identical; see
    :func:`~deqjax._src.training.evaluation.make_diagnostics_step`).

    Its program compiles in the background from :meth:`start` on, while the train step compiles
    (:mod:`~deqjax._src.training.warm_up`), for the shape of the data's next batch (read, then
    the data moved back); :meth:`close` waits for that compilation to end.

    Args:
      diagnostics_fn: ``(params, batch, key, reg_state) -> {name: scalar}``.
      every_steps: steps between diagnostics.

    Raises:
      ValueError: ``diagnostics_fn`` not callable, or ``every_steps`` not an int >= 1.
    """

    def __init__(self, diagnostics_fn: DiagnosticsFn, *, every_steps: int):
        if not callable(diagnostics_fn):
            raise ValueError(f"diagnostics_fn must be callable, got {type(diagnostics_fn)}.")
        super().__init__(every_steps=checks.check_positive_int(every_steps, "every_steps"))
        self._fn = diagnostics_fn
        self._step, self._for = None, None  # the mapped step, and the DataParallel it is for
        self._compiled = lambda: None  # waits for the warm-up's compilation

    def start(self, ctx: LoopContext) -> None:
        if ctx.parallel is None:
            raise ValueError("RunDiagnostics needs the run's DataParallel (LoopContext.parallel).")
        if self._for == ctx.parallel:
            return  # runs one after the other on the same devices: compiled once
        self._step, self._for = make_diagnostics_step(self._fn, ctx.parallel), ctx.parallel
        data = ctx.data
        if data is not None:  # the next batch, the data moved back: its shape for the warm-up
            position = data.state
            batch = next(data)
            data.restore(position)
            if not isinstance(data, PlacedBatches):
                batch = ctx.parallel.put(batch, SHARDED)
            (self._compiled,) = warm_up.compile_in_background(
                [(self._step, (ctx.state_shapes, batch))]
            )

    def run(self, step: int, state: PyTree, metrics: StepMetrics, batch: PyTree) -> Record:
        self._compiled()
        diag = self.ctx.parallel.get(self._step(state, batch), REPLICATED)
        return {"split": "diagnostics", "step": step, **{k: float(v) for k, v in diag.items()}}

    def close(self) -> None:
        self._compiled()  # no compilation left running when the run ends
