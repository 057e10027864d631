"""Occasional diagnostics on the current batch (costly monitors: backward residual, ‖J‖_F)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from deqjax._src import checks
from deqjax._src.training import warm_up
from deqjax._src.training.actions.action import Action, due
from deqjax._src.training.data_parallel import REPLICATED, SHARDED, DataParallel
from deqjax._src.training.evaluation import DiagnosticsFn, make_diagnostics_step
from deqjax._src.training.train_loop import Record, StepMetrics

PyTree = Any


class RunDiagnostics(Action):
    """``diagnostics_fn`` on the step's batch every ``every_steps`` steps: the record
    ``{"split": "diagnostics", "step", name: value}`` (its key derived from the state's without
    advancing it, so training stays bit-identical; see
    :func:`~deqjax._src.training.evaluation.make_diagnostics_step`).

    Its program compiles in the background from :meth:`start` on, while the train step compiles
    (:mod:`~deqjax._src.training.warm_up`), for the batch ``example_batch()`` (a host batch,
    fetched only then).

    Args:
      diagnostics_fn: ``(params, batch, key, reg_state) -> {name: scalar}``.
      every_steps: steps between diagnostics.
      parallel: how the train step runs over the devices (the state's and batch's placement).
      example_batch: ``() -> host batch`` of the training data's shape, for the warm-up (None:
        compile on first use).
    """

    def __init__(
        self,
        diagnostics_fn: DiagnosticsFn,
        *,
        every_steps: int,
        parallel: DataParallel,
        example_batch: Callable[[], PyTree] | None = None,
    ):
        self._every = checks.check_positive_int(every_steps, "every_steps")
        self._parallel = parallel
        self._step = make_diagnostics_step(diagnostics_fn, parallel)
        self._example = example_batch
        self._compiled = lambda: None  # waits for the warm-up's compilation

    def start(self, step: int, state: PyTree) -> None:
        if self._example is not None:
            batch = self._parallel.put(self._example(), SHARDED)
            (self._compiled,) = warm_up.compile_in_background([(self._step, (state, batch))])

    def __call__(
        self, step: int, state: PyTree, metrics: StepMetrics, batch: PyTree
    ) -> Record | None:
        if not due(step, self._every):
            return None
        self._compiled()
        diag = self._parallel.get(self._step(state, batch), REPLICATED)
        return {"split": "diagnostics", "step": step, **{k: float(v) for k, v in diag.items()}}
