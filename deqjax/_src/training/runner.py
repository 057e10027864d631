"""The experiment runner: one command line, one output folder layout, one error policy.

An experiment is data, not a script: an :class:`Experiment` names its flags, its ``--smoke`` (and
mode) defaults, how to set up its inputs and how to run; :func:`run` does the rest, identically
for every experiment:

* the shared flags ``--seed``, ``--out_dir`` (default ``runs/<name>[_<mode>][_smoke]``),
  ``--smoke``, ``--no_progress``, ``--resume``, ``--force``, ``--overwrite``;
* ``config.json`` (``<mode>_config.json`` in a mode such as ``--sweep``): every flag plus the
  derived values the experiment's ``setup`` returns, solver objects written field by field
  (:func:`~deqjax.training.to_python`); the folder is guarded by
  :func:`~deqjax.training.prepare_run_dir` (no silent overwrite, no resume under other flags);
* ``results.json`` (``<mode>.json``): what ``run`` returns, written atomically;
* exit statuses: 0 done; 2 bad flags, missing or unreadable data, an unusable ``--out_dir``, a
  ``--resume`` with nothing to restore; 3 training stopped on non-finite values or a checkpoint
  failed to write; 143 stopped by SIGTERM after saving a checkpoint (``--resume`` continues).

Example (the whole of a small experiment file besides its task functions)::

    EXPERIMENT = training.Experiment(
        name="synthetic_1d", doc=__doc__, add_flags=add_flags, setup=setup, run=run_task,
        smoke={"steps": 40}, safe_on_resume=("steps",), outputs=("curves.png",))
    if __name__ == "__main__":
        training.run(EXPERIMENT)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax

from deqjax._src.data.errors import DataFormatError, DataNotFoundError
from deqjax._src.training.checkpoint import CheckpointError, RestoreError
from deqjax._src.training.distributed import add_distributed_flags, initialize_distributed
from deqjax._src.training.fit import NonFiniteError
from deqjax._src.training.metrics import read_jsonl, to_python
from deqjax._src.training.plots import plot_metrics
from deqjax._src.training.run_dir import RunDirError, add_run_flags, prepare_run_dir

EXIT_USAGE, EXIT_FAILED, EXIT_SIGTERM = 2, 3, 143


class UsageError(ValueError):
    """A flag combination ``setup`` or ``check`` rejects; the runner exits with status 2."""


@dataclasses.dataclass(frozen=True)
class Experiment:
    """What an experiment declares; :func:`run` turns it into a command-line program.

    Attributes:
      name: short name; the default output folder is ``runs/<name>``.
      doc: the module docstring (the ``--help`` text).
      add_flags: ``(parser) -> None`` adds the experiment's own flags.
      setup: ``(args) -> (inputs, extra_config)``: loads the data and builds what ``run`` needs;
        ``extra_config`` (derived values: data source, step count, solver objects) is written to
        ``config.json`` with the flags. Raise ``deqjax.data.DataNotFoundError`` /
        ``DataFormatError`` / :class:`UsageError` for exit status 2.
      run: ``(args, inputs, ctx: RunContext) -> results`` (a JSON-able dict written to
        ``results.json``; ``results["interrupted"]`` True exits with 143).
      smoke: flag defaults under ``--smoke`` (explicit flags win).
      modes: ``{flag: defaults}`` for boolean mode flags the experiment adds (e.g. ``sweep``):
        their defaults, their own ``<flag>_config.json``/``<flag>.json`` and out_dir suffix.
      safe_on_resume: flags a ``--resume --force`` may change (e.g. ``steps``).
      outputs: further files the run writes into ``out_dir`` (``--overwrite`` deletes them).
      resumable: offer ``--resume``/``--force`` (runs that checkpoint).
      distributed: add the multi-host flags and call ``initialize_distributed`` first.
      check: ``(args) -> message | None``: a usage error found from the flags alone.
      seed: the default ``--seed``.
    """

    name: str
    doc: str
    add_flags: Callable[[argparse.ArgumentParser], None]
    setup: Callable[[argparse.Namespace], tuple[Any, Mapping[str, Any]]]
    run: Callable[..., Mapping[str, Any]]
    smoke: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    modes: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict)
    safe_on_resume: Sequence[str] = ()
    outputs: Sequence[str] = ()
    resumable: bool = True
    distributed: bool = False
    check: Callable[[argparse.Namespace], str | None] | None = None
    seed: int = 0


@dataclasses.dataclass
class RunContext:
    """Where a run writes, and the keyword arguments every ``fit`` call of the run shares."""

    out_dir: str
    config: dict
    resume: bool
    overwrite: bool
    progress: bool
    mode: str | None = None

    @property
    def is_main(self) -> bool:
        return jax.process_index() == 0

    def path(self, name: str) -> str:
        """``out_dir/name``."""
        return os.path.join(self.out_dir, name)

    def print(self, line: str) -> None:
        """Prints on process 0 without breaking a progress bar."""
        if self.is_main:
            import tqdm

            tqdm.tqdm.write(line)

    def fit_kwargs(self, **overrides: Any) -> dict:
        """``checkpoint_dir``, ``metrics_path``, ``resume``, ``overwrite``, ``progress``,
        ``config`` and ``print_fn`` for :func:`~deqjax.training.fit` (``overrides`` win)."""
        kwargs = {
            "checkpoint_dir": os.path.abspath(self.path("ckpt")),
            "metrics_path": self.path("metrics.jsonl"),
            "resume": self.resume,
            "overwrite": self.overwrite,
            "progress": self.progress,
            "config": self.config,
            "print_fn": self.print,
        }
        return kwargs | overrides

    def plot_metrics(
        self, *, metrics: Sequence[str] | None = None, title: str = "", name: str = "curves.png"
    ) -> str | None:
        """Plots this run's ``metrics.jsonl`` to ``name`` (process 0); returns the path."""
        if not self.is_main:
            return None
        records = read_jsonl(self.path("metrics.jsonl"))
        plot_metrics(records, self.path(name), metrics=metrics, title=title)
        return self.path(name)

    def write_json(self, name: str, obj: Mapping[str, Any]) -> str:
        """Writes ``obj`` to ``out_dir/name`` atomically (process 0); returns the path."""
        return write_json(self.path(name), obj) if self.is_main else self.path(name)


def write_json(path: str, obj: Mapping[str, Any]) -> str:
    """Writes ``obj`` as indented, sorted JSON to ``path`` atomically; returns the path."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(to_python(dict(obj)), f, indent=2, sort_keys=True)
    os.replace(tmp, path)
    return path


def build_parser(exp: Experiment) -> argparse.ArgumentParser:
    """The experiment's flags plus the shared ones (see the module docstring)."""
    p = argparse.ArgumentParser(description=exp.doc, formatter_class=argparse.RawTextHelpFormatter)
    exp.add_flags(p)
    g = p.add_argument_group("run")
    g.add_argument("--seed", type=int, default=exp.seed, help="seed of init, data and order")
    g.add_argument("--out_dir", default=f"runs/{exp.name}", help="output folder")
    g.add_argument("--smoke", action="store_true", help="tiny run for tests (minutes on a CPU)")
    g.add_argument("--no_progress", dest="progress", action="store_false", help="no progress bar")
    add_run_flags(p, resume=exp.resumable)
    if exp.distributed:
        add_distributed_flags(p)
    return p


def active_mode(exp: Experiment, args: argparse.Namespace) -> str | None:
    """The mode flag that is set (at most one), or None."""
    return next((m for m in exp.modes if getattr(args, m, False)), None)


def parse_experiment_args(exp: Experiment, argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parses ``argv`` with the mode and ``--smoke`` defaults applied (explicit flags win)."""
    p = build_parser(exp)
    known, _ = p.parse_known_args(argv)
    mode = active_mode(exp, known)
    defaults: dict[str, Any] = dict(exp.modes.get(mode, {})) if mode else {}
    if known.smoke:
        defaults.update(exp.smoke)
    suffix = (f"_{mode}" if mode else "") + ("_smoke" if known.smoke else "")
    defaults.setdefault("out_dir", f"runs/{exp.name}{suffix}")
    p.set_defaults(**defaults)
    return p.parse_args(argv)


def fail(message: str, code: int = EXIT_USAGE) -> None:
    """Prints ``error: message`` to stderr and exits with ``code``."""
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(code)


def run(exp: Experiment, argv: Sequence[str] | None = None) -> dict:
    """Parses the flags, prepares ``--out_dir``, runs the experiment, writes its results.

    Returns:
      The results ``exp.run`` returned (also written to ``results.json``).

    Raises:
      SystemExit: with the statuses of the module docstring.
    """
    args = parse_experiment_args(exp, argv)
    mode = active_mode(exp, args)
    message = exp.check(args) if exp.check is not None else None
    if message:
        build_parser(exp).error(message)
    if exp.distributed:
        initialize_distributed(args.coordinator_address, args.num_processes, args.process_id)
    try:
        inputs, extra = exp.setup(args)
    except (DataNotFoundError, DataFormatError, UsageError) as e:
        fail(str(e))
    config = vars(args) | dict(extra)
    resume = bool(getattr(args, "resume", False))
    try:
        prepare_run_dir(
            args.out_dir,
            config,
            resume=resume,
            overwrite=args.overwrite,
            force=bool(getattr(args, "force", False)),
            safe_keys=exp.safe_on_resume,
            outputs=exp.outputs,
            config_name=f"{mode}_config.json" if mode else "config.json",
        )
    except RunDirError as e:
        fail(str(e))
    ctx = RunContext(args.out_dir, config, resume, args.overwrite, args.progress, mode)
    if ctx.is_main:
        print("config:", json.dumps(to_python(config), sort_keys=True))
    try:
        results = dict(exp.run(args, inputs, ctx))
    except (RestoreError, FileExistsError, UsageError) as e:
        fail(str(e))
    except (NonFiniteError, CheckpointError) as e:
        fail(str(e), EXIT_FAILED)
    ctx.write_json(f"{mode}.json" if mode else "results.json", results)
    if results.get("interrupted"):
        sys.exit(EXIT_SIGTERM)
    return results
