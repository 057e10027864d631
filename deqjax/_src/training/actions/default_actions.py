"""The usual list of actions of a training run, in the order they work together."""

from __future__ import annotations

import jax

from deqjax._src.training.actions.action import Action
from deqjax._src.training.actions.guard_nonfinite import GuardNonFinite
from deqjax._src.training.actions.log_metrics import LogMetrics
from deqjax._src.training.actions.report_progress import ReportProgress
from deqjax._src.training.actions.stop_on_sigterm import StopOnSigterm


def default_actions(
    *extra: Action,
    log_every: int = 100,
    max_nonfinite_steps: int | None = 10,
    progress: bool = True,
    handle_sigterm: bool = True,
) -> list[Action]:
    """``[LogMetrics, GuardNonFinite, *extra, StopOnSigterm, ReportProgress]``: the train record
    and the non-finite check every ``log_every`` steps (one fetch of the metrics), then the
    caller's actions (e.g. :class:`~deqjax.training.RunDiagnostics`,
    :class:`~deqjax.training.Evaluate`), a stop at a SIGTERM (checked each step; in a multi-host
    run agreed every ``log_every`` steps) and the progress bar.

    Args:
      *extra: actions run after the logging ones, in this order.
      log_every: steps between train records (the metrics' only fetch to the host).
      max_nonfinite_steps: the streak of non-finite steps that stops the run (None: report
        only).
      progress: show the progress bar (process 0).
      handle_sigterm: stop at a SIGTERM (main thread only).

    Example:
      >>> actions = default_actions(Evaluate(eval_fn, test), log_every=50)
      >>> fit(pair, state, batches, num_steps=5000, parallel=parallel, actions=actions)
    """
    actions: list[Action] = [
        LogMetrics(every_steps=log_every),
        GuardNonFinite(max_nonfinite_steps, every_steps=log_every),
        *extra,
    ]
    if handle_sigterm:
        actions.append(StopOnSigterm(every_steps=1 if jax.process_count() == 1 else log_every))
    if progress:
        actions.append(ReportProgress())
    return actions
