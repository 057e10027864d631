"""The experiment runner: one command line, one output folder layout, one error policy.

:func:`run` turns an :class:`~deqjax.harness.Experiment` into a program, identically for every
experiment:

* the flags of its configuration (tyro), with its ``--smoke`` and mode defaults;
* the devices: one :class:`~deqjax.training.DataParallel` built from ``--parallel`` (default
  sharded), handed to the run as ``ctx.data_parallel``; a batch flag the devices do not divide
  (those the configuration's sections declare in ``SPLIT_OVER_DEVICES``) is refused before
  anything is written;
* ``config.json`` (``<mode>_config.json`` in a mode such as ``--sweep``): every flag plus the
  derived values the experiment's ``setup`` returns, solver objects written field by field
  (:func:`~deqjax.harness.to_python`); the folder is guarded by
  :func:`~deqjax.harness.prepare_run_dir` (no silent overwrite, no resume under other flags);
  the run starts by printing a few short lines: the experiment and its folder, the settings
  given that differ from the defaults, the tolerances ``--dtype`` picked (a ``--dtype
  bfloat16`` without ``--tol`` runs at a tolerance bfloat16 resolves), and where the full
  configuration is;
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

import os
import sys
import textwrap
from collections.abc import Mapping, Sequence
from itertools import chain
from typing import Any, NoReturn

import jax

from deqjax._src.data.errors import DataFormatError, DataNotFoundError
from deqjax._src.harness.compilation_cache import persistent_compilation_cache
from deqjax._src.harness.dtype_config import tolerance_note
from deqjax._src.harness.experiment import Experiment, run_section
from deqjax._src.harness.flat_config import declared, find_section, flat_dict
from deqjax._src.harness.multihost_config import MultiHostConfig
from deqjax._src.harness.run_config import ResumableRunConfig
from deqjax._src.harness.run_context import RunContext
from deqjax._src.harness.run_dir import RunDirError, prepare_run_dir
from deqjax._src.training.checkpoint import CheckpointError, RestoreError
from deqjax._src.training.data_parallel import DataParallel, data_parallel
from deqjax._src.training.fit import NonFiniteError
from deqjax._src.training.metrics import to_python

EXIT_USAGE, EXIT_FAILED, EXIT_SIGTERM = 2, 3, 143
# The sections' (and configurations') declared batch flags the devices share equally.
SPLIT = "SPLIT_OVER_DEVICES"
LINE, VALUE = 120, 40  # the start of a run: line width, the characters of a value shown


class UsageError(ValueError):
    """A flag combination ``setup`` or ``run`` rejects; the runner exits with status 2."""


def fail(message: str, code: int = EXIT_USAGE) -> NoReturn:
    """Prints ``error: message`` to stderr and exits with ``code``."""
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(code)


def _start(exp: Experiment, config: Any) -> tuple[Any, dict, DataParallel]:
    """Checks the flags, joins a multi-host run, builds the devices' :class:`DataParallel` (a
    batch they do not divide refused), runs ``setup``: ``(inputs, config.json, parallel)``.
    Nothing is written yet."""
    message = run_section(config).check() or (exp.check(config) if exp.check else None)
    if message:
        fail(message)
    multihost = find_section(config, MultiHostConfig)
    try:
        if multihost is not None:
            multihost.initialize()  # ValueError: an incomplete or inconsistent configuration
    except ValueError as e:
        fail(str(e))
    parallel = multihost.data_parallel() if multihost is not None else data_parallel("sharded")
    flat = flat_dict(config)
    _check_batches(parallel, {name: flat[name] for name in chain(*declared(config, SPLIT))})
    try:
        inputs, extra = exp.setup(config)
    except (DataNotFoundError, DataFormatError, UsageError) as e:
        fail(str(e))
    return inputs, flat | dict(extra), parallel


def _check_batches(parallel: DataParallel, batches: Mapping[str, int]) -> None:
    """Exits with status 2 naming the first batch flag the devices cannot share equally."""
    num_devices = jax.process_count() * len(parallel.local_devices)
    for name, size in batches.items():
        if size % num_devices:
            fail(
                f"--{name} {size} must be a multiple of the {num_devices} devices (each device "
                f"takes an equal share of the batch)."
            )


def _context(
    exp: Experiment, config: Any, flat: dict, mode: str | None, parallel: DataParallel
) -> RunContext:
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
    return RunContext(
        run.out_dir, flat, resume, run.overwrite, run.progress, mode, parallel, exp.name
    )


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
    config, picked = exp.parse_noting(argv)
    with persistent_compilation_cache(run_section(config).compilation_cache):
        return _run(exp, config, picked)


def _run(exp: Experiment, config: Any, picked: Mapping[str, float]) -> dict:
    """:func:`run` after the flags are parsed (``picked``: the tolerances ``--dtype`` chose)."""
    mode = exp.mode(config)
    inputs, flat, parallel = _start(exp, config)
    ctx = _context(exp, config, flat, mode, parallel)
    if ctx.is_main:
        print("\n".join(_start_lines(exp, config, mode, ctx.resume, picked)))
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


def _start_lines(
    exp: Experiment, config: Any, mode: str | None, resume: bool, picked: Mapping[str, float]
) -> list[str]:
    """What a run prints first, each line at most :data:`LINE` characters where its names
    allow: the experiment and its folder, the settings that differ from the defaults in effect
    (values cut at :data:`VALUE` characters), the tolerances ``--dtype`` picked (``picked``),
    where the full configuration is."""
    run = run_section(config)
    flags = [mode, "smoke" if run.smoke else None, "resume" if resume else None]
    labels = ", ".join(f"--{flag}" for flag in flags if flag)
    default_config = exp.defaults(smoke=run.smoke, mode=mode)
    defaults = flat_dict(default_config)
    given = [
        f"{name}={_short(value)}"
        for name, value in flat_dict(config).items()
        if name not in {"out_dir", *flags} and value != defaults.get(name)
    ]
    changed = "settings changed from the defaults: " + (", ".join(given) or "none")
    config_name = f"{mode}_config.json" if mode else "config.json"
    note = tolerance_note(config, picked, default_config)
    return [
        f"{exp.name}{f' ({labels})' if labels else ''}: run folder {run.out_dir}",
        *textwrap.wrap(changed, LINE, subsequent_indent="  ", break_on_hyphens=False),
        *([note] if note else []),
        f"full configuration: {os.path.join(run.out_dir, config_name)}",
    ]


def _short(value: Any) -> str:
    """A setting's value as the start of a run shows it (at most :data:`VALUE` characters)."""
    value = to_python(value)
    if isinstance(value, (list, tuple)):
        text = ",".join(map(str, value))
    else:
        text = str(value) if value != "" else "''"
    return text if len(text) <= VALUE else text[: VALUE - 3] + "..."


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
