"""The experiment harness: configuration as data, command lines, run folders, plots and sweeps.

What every experiment shares. An experiment declares its configuration as a frozen dataclass: its
own settings, and sections shared between experiments (the run's :class:`RunConfig` /
:class:`ResumableRunConfig`, :class:`SolverConfig`, :class:`JRConfig`,
:class:`OptimizationConfig`, :class:`LoggingConfig`, :class:`MultiHostConfig`, the compute
dtype's :class:`DtypeConfig`, the sequence models' :class:`SequenceModelConfig`, each building
what it describes); a section one experiment alone uses lives next to it, in
``experiments/parts/``. It gets its command line from tyro: one flag per setting, named as the
field (``--train_size``), with no section prefix; checked types (:data:`PositiveInt`,
:data:`FloatList`, ...) reject a bad value naming its flag. :func:`run` does the rest for every
experiment alike: ``--smoke`` and mode defaults, the run folder (:func:`prepare_run_dir`:
``--resume`` refuses changed flags, ``--overwrite``, ``--force``), ``config.json`` with every
hyper-parameter (solver objects field by field), ``results.json`` and the exit statuses (2 bad flags
or data, 3 non-finite stop or checkpoint failure, 143 SIGTERM).

>>> @dataclasses.dataclass(frozen=True)
... class Config:
...     width: harness.PositiveInt = 128  # DEQ state size
...     solver: harness.SolverConfig = harness.SolverConfig()
...     run: harness.ResumableRunConfig = harness.ResumableRunConfig()
>>> EXPERIMENT = harness.Experiment(name="mine", doc=__doc__, config=Config(), setup=setup,
...                                 run=train, smoke={"width": 8})
>>> harness.run(EXPERIMENT)  # python mine.py --width 64 --max_steps 12 --resume

Plots (:func:`plot_metrics`, :func:`line_plot`, :func:`plot_panels`, :func:`plot_sweep`) import
matplotlib when drawn; :func:`grid` lists a sweep's runs, :func:`summarize_runs`,
:func:`write_csv` and :func:`markdown_table` report them.
"""

from deqjax._src.harness.cli import parse_config
from deqjax._src.harness.dtype_config import DtypeConfig
from deqjax._src.harness.experiment import Experiment
from deqjax._src.harness.figures import (
    line_plot,
    plot_panels,
    plot_sweep,
    pyplot,
    save_figure,
)
from deqjax._src.harness.flag_types import (
    FloatList,
    IntList,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    StepWindow,
    Switch,
    at_least,
    choice_list,
)
from deqjax._src.harness.flat_config import flat_dict
from deqjax._src.harness.jr_config import JRConfig
from deqjax._src.harness.logging_config import LoggingConfig
from deqjax._src.harness.metric_curves import plot_metrics
from deqjax._src.harness.multihost_config import MultiHostConfig
from deqjax._src.harness.optimization_config import OptimizationConfig
from deqjax._src.harness.run_config import ResumableRunConfig, RunConfig
from deqjax._src.harness.run_context import RunContext, run_until_interrupted
from deqjax._src.harness.run_dir import (
    RunDir,
    RunDirError,
    config_changes,
    prepare_run_dir,
    write_json,
)
from deqjax._src.harness.runner import UsageError, run
from deqjax._src.harness.sequence_config import SequenceModelConfig
from deqjax._src.harness.solver_config import GRADIENTS, SolverConfig, solver_and_adjoint
from deqjax._src.harness.sweep import (
    grid,
    summarize_runs,
)
from deqjax._src.harness.tables import markdown_table, write_csv
from deqjax._src.training.metrics import format_metrics, format_value, to_python

__all__ = [
    "DtypeConfig",
    "Experiment",
    "FloatList",
    "GRADIENTS",
    "IntList",
    "JRConfig",
    "LoggingConfig",
    "MultiHostConfig",
    "NonNegativeFloat",
    "NonNegativeInt",
    "OptimizationConfig",
    "PositiveFloat",
    "PositiveInt",
    "ResumableRunConfig",
    "RunConfig",
    "RunContext",
    "RunDir",
    "RunDirError",
    "SequenceModelConfig",
    "SolverConfig",
    "StepWindow",
    "Switch",
    "UsageError",
    "at_least",
    "choice_list",
    "config_changes",
    "flat_dict",
    "format_metrics",
    "format_value",
    "grid",
    "line_plot",
    "markdown_table",
    "parse_config",
    "plot_metrics",
    "plot_panels",
    "plot_sweep",
    "prepare_run_dir",
    "pyplot",
    "run",
    "run_until_interrupted",
    "save_figure",
    "solver_and_adjoint",
    "summarize_runs",
    "to_python",
    "write_csv",
    "write_json",
]
