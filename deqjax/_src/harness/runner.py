"""The experiment runner: one command line, one output folder layout, one error policy.

:func:`run` turns an :class:`~deqjax.harness.Experiment` into a program, identically for every
experiment:

* the flags of its configuration (tyro), with its ``--smoke`` and mode defaults;
* ``config.json`` (``<mode>_config.json`` in a mode such as ``--sweep``): every flag plus the
  derived values the experiment's ``setup`` returns, solver objects written field by field
  (:func:`~deqjax.harness.to_python`); the folder is guarded by
  :func:`~deqjax.harness.prepare_run_dir` (no silent overwrite, no resume under other flags);
* ``results.json`` (``<mode>.json``): what ``run`` returns, written atomically;
* JAX's persistent compilation cache for the run (``--compilation_cache``,
  :mod:`~deqjax._src.harness.compilation_cache`): a later run loads the programs it compiled;
* exit statuses: 0 done; 2 bad flags, missing or unreadable data, an unusable ``--out_dir``, a
  ``--resume`` with nothing to restore; 3 training stopped on non-finite values or a checkpoint
  failed to write; 143 stopped by SIGTERM after saving a checkpoint (``--resume`` continues).

Example (the whole of a small experiment file besides its configuration and task functions)::

    EXPERIMENT = harness.Experiment(
        name="synthetic_1d", doc=__doc__, config=Config(), setup=setup, run=run_task,
        smoke={"epochs": 2}, safe_on_resume=("epochs",), outputs=("curves.png",))
    if __name__ == "__main__":
        harness.run(EXPERIMENT)
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from itertools import chain
from typing import Any, NoReturn

from deqjax._src.data.errors import DataFormatError, DataNotFoundError
from deqjax._src.harness.compilation_cache import persistent_compilation_cache
from deqjax._src.harness.experiment import Experiment, run_section
from deqjax._src.harness.flat_config import declared, find_section, flat_dict
from deqjax._src.harness.multihost_config import MultiHostConfig
from deqjax._src.harness.run_config import ResumableRunConfig
from deqjax._src.harness.run_context import RunContext
from deqjax._src.harness.run_dir import RunDirError, prepare_run_dir
from deqjax._src.training.checkpoint import CheckpointError, RestoreError
from deqjax._src.training.fit import NonFiniteError
from deqjax._src.training.metrics import to_python

EXIT_USAGE, EXIT_FAILED, EXIT_SIGTERM = 2, 3, 143


class UsageError(ValueError):
    """A flag combination ``setup`` or ``run`` rejects; the runner exits with status 2."""


def fail(message: str, code: int = EXIT_USAGE) -> NoReturn:
    """Prints ``error: message`` to stderr and exits with ``code``."""
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(code)


def _start(exp: Experiment, config: Any) -> tuple[Any, dict]:
    """Checks the flags, joins a multi-host run, runs ``setup``: ``(inputs, config.json)``."""
    message = exp.check(config) if exp.check is not None else None
    if message:
        fail(message)
    multihost = find_section(config, MultiHostConfig)
    try:
        if multihost is not None:
            multihost.initialize()  # ValueError: an incomplete or inconsistent configuration
    except ValueError as e:
        fail(str(e))
    try:
        inputs, extra = exp.setup(config)
    except (DataNotFoundError, DataFormatError, UsageError) as e:
        fail(str(e))
    return inputs, flat_dict(config) | dict(extra)


def _context(exp: Experiment, config: Any, flat: dict, mode: str | None) -> RunContext:
    """Prepares ``--out_dir`` (writing ``config.json``); the context the run writes through."""
    run = run_section(config)
    resumable = isinstance(run, ResumableRunConfig)
    resume = resumable and run.resume
    try:
        prepare_run_dir(
            run.out_dir,
            flat,
            resume=resume,
            overwrite=run.overwrite,
            force=resumable and run.force,
            safe_keys=[*exp.safe_on_resume, *chain(*declared(config, "SAFE_ON_RESUME"))],
            outputs=exp.outputs,
            config_name=f"{mode}_config.json" if mode else "config.json",
        )
    except RunDirError as e:
        fail(str(e))
    devices = find_section(config, MultiHostConfig)
    parallel = devices.parallel if devices is not None else "sharded"
    return RunContext(run.out_dir, flat, resume, run.overwrite, run.progress, mode, parallel)


def run(exp: Experiment, argv: Sequence[str] | None = None) -> dict:
    """Parses the flags, prepares ``--out_dir``, runs the experiment, writes its results.

    Args:
      exp: the experiment.
      argv: the command line (default ``sys.argv[1:]``).

    Returns:
      The results ``exp.run`` returned (also written to ``results.json``).

    Raises:
      SystemExit: with the statuses of the module docstring.
    """
    config = exp.parse(argv)
    with persistent_compilation_cache(run_section(config).compilation_cache):
        return _run(exp, config)


def _run(exp: Experiment, config: Any) -> dict:
    """:func:`run` after the flags are parsed."""
    mode = exp.mode(config)
    inputs, flat = _start(exp, config)
    ctx = _context(exp, config, flat, mode)
    if ctx.is_main:
        print("config:", json.dumps(to_python(flat), sort_keys=True))
    try:
        results: Mapping[str, Any] = dict(exp.run(config, inputs, ctx))
    except (RestoreError, FileExistsError, UsageError) as e:
        fail(str(e))
    except (NonFiniteError, CheckpointError) as e:
        fail(str(e), EXIT_FAILED)
    ctx.write_json(f"{mode}.json" if mode else "results.json", results)
    if results.get("interrupted"):
        _interrupted(ctx, results)
    return dict(results)


def _interrupted(ctx: RunContext, results: Mapping[str, Any]) -> NoReturn:
    """Says where a run stopped by SIGTERM stands, then exits with status 143."""
    at = ""
    if "final_step" in results and "num_steps" in results:
        at = f" at step {results['final_step']} of {results['num_steps']}"
    ctx.print(
        f"interrupted by SIGTERM{at}: checkpoint saved; continue with --resume. Outputs so far "
        f"in {ctx.out_dir}"
    )
    raise SystemExit(EXIT_SIGTERM)
