"""Training: the fit loop, the optax-style train step, checkpoints, metrics, multi-host start-up.

What a training script of one's own needs. The run harness (run folders, configurations, plots,
sweeps) lives in :mod:`deqjax.harness`.

>>> from deqjax import data, training
>>> opt = training.make_optimizer(learning_rate=training.make_schedule(
...     learning_rate=1e-3, schedule="cosine", warmup_steps=100, total_steps=5000), clip_norm=1.0)
>>> def loss_fn(params, batch, key, reg_state, step):          # one device's share of the batch
...     logits = model.apply(params, batch["image"])
...     loss = cross_entropy(logits, batch["label"])
...     return loss, {"accuracy": jnp.mean(jnp.argmax(logits, -1) == batch["label"])}
>>> result = training.fit(params=params, loss_fn=loss_fn, optimizer=opt,
...                       train_data=data.ShuffledBatches(train, batch_size=256, seed=0),
...                       num_steps=5000, rng=jax.random.PRNGKey(0), log_every=50,
...                       checkpoint_dir="runs/x/ckpt", checkpoint_every=500, resume=True,
...                       metrics_path="runs/x/metrics.jsonl")
"""

from deqjax._src.training.checkpoint import Checkpointer, CheckpointError, RestoreError
from deqjax._src.training.distributed import (
    DistributedConfig,
    add_distributed_flags,
    distributed_config,
    initialize_distributed,
)
from deqjax._src.training.fit import FitResult, NonFiniteError, fit, skip_nonfinite
from deqjax._src.training.flags import (
    GRADIENTS,
    add_jr_flags,
    add_logging_flags,
    add_optimization_flags,
    add_solver_flags,
    backward_solver_from_flags,
    fit_kwargs_from_flags,
    jr_from_flags,
    num_steps_from_flags,
    optimizer_from_flags,
    solver_and_adjoint,
    solvers_from_flags,
)
from deqjax._src.training.metrics import (
    MetricsWriter,
    format_metrics,
    format_value,
    read_jsonl,
    to_python,
)
from deqjax._src.training.optimizer import make_optimizer, make_schedule
from deqjax._src.training.plots import (
    line_plot,
    plot_metrics,
    plot_panels,
    plot_sweep,
    pyplot,
    save_figure,
)
from deqjax._src.training.run_dir import (
    RunDir,
    RunDirError,
    add_run_flags,
    config_changes,
    nonnegative_float,
    nonnegative_int,
    positive_float,
    positive_int,
    prepare_run_dir,
    write_config,
)
from deqjax._src.training.runner import (
    Experiment,
    RunContext,
    UsageError,
    parse_experiment_args,
    run,
    write_json,
)
from deqjax._src.training.sweep import markdown_table, short_runs, summarize_runs, write_csv
from deqjax._src.training.train_state import TrainState, replicate, shard, unreplicate
from deqjax._src.training.train_step import TrainStep, reduce_metrics, train_step
from deqjax._src.training.xla_memory import compile_with_memory

__all__ = [
    "CheckpointError",
    "Checkpointer",
    "DistributedConfig",
    "FitResult",
    "MetricsWriter",
    "NonFiniteError",
    "RestoreError",
    "TrainState",
    "TrainStep",
    "compile_with_memory",
    "fit",
    "initialize_distributed",
    "make_optimizer",
    "make_schedule",
    "read_jsonl",
    "reduce_metrics",
    "replicate",
    "shard",
    "skip_nonfinite",
    "train_step",
    "unreplicate",
]

# Leaving for deqjax.harness (the run harness: command lines, run folders, plots, sweeps, and the
# formatting of configurations and reports); exported here until that module takes them over.
__all__ += [
    "GRADIENTS",
    "Experiment",
    "RunContext",
    "RunDir",
    "RunDirError",
    "UsageError",
    "add_distributed_flags",
    "add_jr_flags",
    "add_logging_flags",
    "add_optimization_flags",
    "add_run_flags",
    "add_solver_flags",
    "backward_solver_from_flags",
    "config_changes",
    "distributed_config",
    "fit_kwargs_from_flags",
    "format_metrics",
    "format_value",
    "jr_from_flags",
    "line_plot",
    "markdown_table",
    "nonnegative_float",
    "nonnegative_int",
    "num_steps_from_flags",
    "optimizer_from_flags",
    "parse_experiment_args",
    "plot_metrics",
    "plot_panels",
    "plot_sweep",
    "positive_float",
    "positive_int",
    "prepare_run_dir",
    "pyplot",
    "run",
    "save_figure",
    "short_runs",
    "solver_and_adjoint",
    "solvers_from_flags",
    "summarize_runs",
    "to_python",
    "write_config",
    "write_csv",
    "write_json",
]
