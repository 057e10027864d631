"""An experiment as data: its configuration, its ``--smoke`` and mode defaults, its task.

An :class:`Experiment` names its default configuration (a frozen dataclass holding a
:class:`~deqjax.harness.RunConfig` section), the settings ``--smoke`` and each mode flag (e.g.
``--sweep``) change, and two functions: ``setup(config) -> (inputs, derived values)`` and
``run(config, inputs, ctx) -> results``. :meth:`Experiment.parse` reads a command line into its
configuration; :func:`~deqjax.harness.run` runs it.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Generic, TypeVar

from deqjax._src.harness.cli import parse_config
from deqjax._src.harness.dtype_config import dtype_tolerances
from deqjax._src.harness.flat_config import declared, find_section, flat_dict, replace_flat
from deqjax._src.harness.run_config import RunConfig
from deqjax._src.harness.run_context import RunContext

Config = TypeVar("Config")


@dataclasses.dataclass(frozen=True)
class Experiment(Generic[Config]):
    """What an experiment declares; :func:`~deqjax.harness.run` turns it into a program.

    Attributes:
      name: short name; the default output folder is ``runs/<name>[_<mode>][_smoke]``.
      doc: the module docstring (the ``--help`` text).
      config: the default configuration: a frozen dataclass whose fields are the flags, with a
        :class:`~deqjax.harness.RunConfig` (or ``ResumableRunConfig``) section.
      setup: ``(config) -> (inputs, extra_config)``: loads the data and builds what ``run``
        needs; ``extra_config`` (derived values: data source, step count, solver objects) is
        written to ``config.json`` with the flags. Raise ``deqjax.data.DataNotFoundError`` /
        ``DataFormatError`` / :class:`~deqjax.harness.UsageError` for exit status 2.
      run: ``(config, inputs, ctx: RunContext) -> results`` (a JSON-able dict written to
        ``results.json``; ``results["interrupted"]`` True exits with 143).
      smoke: ``{flag: default}`` under ``--smoke``, besides the sections' own (their
        ``SMOKE``); explicit flags win.
      modes: ``{flag: {flag: default}}`` for the boolean mode flags of the configuration (e.g.
        ``sweep``): their defaults, their own ``<flag>_config.json``/``<flag>.json`` and
        ``out_dir`` suffix.
      safe_on_resume: flags a ``--resume --force`` may change (e.g. ``steps``), besides those the
        configuration's sections declare (their ``SAFE_ON_RESUME``).
      outputs: further files the run writes into ``out_dir`` (``--overwrite`` deletes them).
      check: ``(config) -> message | None``: a usage error found from the flags alone.
    """

    name: str
    doc: str
    config: Config
    setup: Callable[[Config], tuple[Any, Mapping[str, Any]]]
    run: Callable[[Config, Any, RunContext], Mapping[str, Any]]
    smoke: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    modes: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict)
    safe_on_resume: Sequence[str] = ()
    outputs: Sequence[str] = ()
    check: Callable[[Config], str | None] | None = None

    def defaults(self, *, smoke: bool = False, mode: str | None = None) -> Config:
        """The default configuration in ``mode`` (or none) with or without ``--smoke``."""
        values = dict(self.modes[mode]) if mode else {}
        if smoke:  # the sections' smoke settings, then the experiment's
            for section_smoke in declared(self.config, "SMOKE"):
                values.update(section_smoke)
            values.update(self.smoke)
        suffix = (f"_{mode}" if mode else "") + ("_smoke" if smoke else "")
        values.setdefault("out_dir", f"runs/{self.name}{suffix}")
        return replace_flat(self.config, **values)

    def parse(self, argv: Sequence[str] | None = None) -> Config:
        """Reads ``argv`` (default ``sys.argv[1:]``) with the defaults of its mode flag,
        ``--smoke`` and ``--dtype`` (explicit flags win; :meth:`parse_noting`).

        Raises:
          SystemExit: status 0 after ``--help``, 2 for a bad flag or value.
        """
        return self.parse_noting(argv)[0]

    def parse_noting(self, argv: Sequence[str] | None = None) -> tuple[Config, dict[str, float]]:
        """:meth:`parse`, and the tolerances ``--dtype`` picked: ``(config, {flag: tolerance})``.

        A tolerance flag not given whose default the compute dtype cannot resolve takes the
        round tolerance just above its machine epsilon
        (:func:`~deqjax._src.harness.dtype_config.dtype_tolerances`): ``--dtype bfloat16``
        alone runs at ``--tol 0.01``; a ``--tol`` given is kept (and refused if too small).
        """
        argv = list(sys.argv[1:] if argv is None else argv)
        mode = next((m for m in self.modes if f"--{m}" in argv), None)
        defaults = self.defaults(smoke="--smoke" in argv, mode=mode)
        config = parse_config(defaults, argv, description=self.doc)
        tolerances = dtype_tolerances(config, defaults)
        if not tolerances:
            return config, {}
        given = flat_dict(config)
        config = parse_config(replace_flat(defaults, **tolerances), argv, description=self.doc)
        picked = {
            flag: tol for flag, tol in tolerances.items() if flat_dict(config)[flag] != given[flag]
        }
        return config, picked

    def mode(self, config: Config) -> str | None:
        """The mode flag set in ``config`` (the first of :attr:`modes`), or None."""
        flat = flat_dict(config)
        return next((m for m in self.modes if flat[m]), None)


def run_section(config: Any) -> RunConfig:
    """The :class:`~deqjax.harness.RunConfig` section of ``config``.

    Raises:
      TypeError: if ``config`` has none.
    """
    section = find_section(config, RunConfig)
    if section is None:
        raise TypeError(f"{type(config).__name__} has no RunConfig section (field run).")
    return section
