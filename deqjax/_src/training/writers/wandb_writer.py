"""The metrics of a run sent to Weights & Biases, when wandb is installed and asked for."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from deqjax._src.training.metrics import to_python
from deqjax._src.training.writers.metric_writer import ScalarWriter, claim, require

RUN_ID_FILE = "wandb_run_id.txt"


class WandbWriter(ScalarWriter):
    """Logs every numeric field of each record to a W&B run (a
    :class:`~deqjax.training.MetricWriter`), as ``"<split>/<name>"`` at the record's step.

    wandb is never required: it is imported when the writer is opened, and constructing the
    writer without it installed raises an error naming ``pip install wandb``. The W&B run's id is
    kept in ``run_dir/wandb_run_id.txt``, so a resumed run continues the same W&B run (a fresh run
    over an earlier run's id is refused unless ``overwrite``). W&B keeps a run's steps
    increasing: the records a resumed run logs again for steps the interrupted run had already
    sent are dropped by W&B (the JSONL and TensorBoard files keep the resumed values).
    ``WANDB_MODE=offline`` and W&B's other environment variables apply as usual.

    Args:
      project: the W&B project.
      run_dir: the run folder: W&B's local files and the run id go there.
      config: the run's configuration, shown by W&B (made JSON-able like ``config.json``).
      enabled: whether this process logs (None: only JAX's process 0).

    Raises:
      ModuleNotFoundError: wandb is not installed (the message names ``pip install wandb``).
      FileExistsError: from :meth:`open`, for a fresh run over an earlier run's id without
        ``overwrite``.
    """

    def __init__(
        self,
        project: str,
        run_dir: str | os.PathLike,
        config: Mapping[str, Any] | None = None,
        *,
        enabled: bool | None = None,
    ):
        require("wandb", "wandb", "WandbWriter (--wandb)")
        if not isinstance(project, str) or not project:
            raise ValueError(f"project must be a non-empty string, got {project!r}.")
        super().__init__(enabled)
        self.project = self.label = project
        self.run_dir = os.fspath(run_dir)
        self._config = to_python(dict(config or {}))

    def _start(self, restored_step: int | None, overwrite: bool) -> Any:
        """The W&B run: a fresh one, or the one whose id the run folder keeps."""
        import wandb

        id_path = os.path.join(self.run_dir, RUN_ID_FILE)
        found = os.path.exists(id_path)
        claim([id_path] if found else [], restored_step, overwrite, f"{id_path} names the W&B run")
        run_id = None
        if restored_step is not None and found:
            with open(id_path) as f:
                run_id = f.read().strip() or None
        os.makedirs(self.run_dir, exist_ok=True)
        run = wandb.init(
            project=self.project,
            dir=self.run_dir,
            config=self._config,
            id=run_id,
            resume="allow" if run_id else None,
        )
        with open(id_path, "w") as f:
            f.write(str(run.id))
        return run

    def _send(self, step: int, values: dict[str, float]) -> None:
        """Logs the scalars at ``step``."""
        if values:
            self._sink.log(values, step=step)

    def _stop(self) -> None:
        self._sink.finish()
