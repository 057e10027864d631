"""Training: pmapped data-parallel steps, multi-host start-up, orbax checkpoints, JSONL metrics.

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

from deqjax._src.training.checkpoint import (
    Checkpointer,
    CheckpointError,
    Restored,
    RestoreError,
    all_finite,
    tree_digest,
)
from deqjax._src.training.distributed import (
    DistributedConfig,
    add_distributed_flags,
    distributed_config,
    initialize_distributed,
)
from deqjax._src.training.evaluation import evaluate, make_eval_step
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
    progress_bar,
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
from deqjax._src.training.train_state import (
    TrainState,
    create_train_state,
    replicate,
    shard,
    unreplicate,
)
from deqjax._src.training.train_step import (
    TrainStep,
    make_diagnostics_step,
    make_train_step,
    pmap_update,
    reduce_metrics,
    train_step,
)
from deqjax._src.training.xla_memory import compile_with_memory

__all__ = [
    "GRADIENTS",
    "CheckpointError",
    "Checkpointer",
    "DistributedConfig",
    "Experiment",
    "FitResult",
    "MetricsWriter",
    "NonFiniteError",
    "RestoreError",
    "Restored",
    "RunContext",
    "RunDir",
    "RunDirError",
    "TrainState",
    "TrainStep",
    "UsageError",
    "add_distributed_flags",
    "add_jr_flags",
    "add_logging_flags",
    "add_optimization_flags",
    "add_run_flags",
    "add_solver_flags",
    "all_finite",
    "compile_with_memory",
    "config_changes",
    "create_train_state",
    "distributed_config",
    "evaluate",
    "fit",
    "fit_kwargs_from_flags",
    "format_metrics",
    "format_value",
    "initialize_distributed",
    "jr_from_flags",
    "line_plot",
    "make_diagnostics_step",
    "make_eval_step",
    "make_optimizer",
    "make_schedule",
    "make_train_step",
    "markdown_table",
    "nonnegative_float",
    "nonnegative_int",
    "num_steps_from_flags",
    "optimizer_from_flags",
    "parse_experiment_args",
    "plot_metrics",
    "plot_panels",
    "plot_sweep",
    "pmap_update",
    "positive_float",
    "positive_int",
    "prepare_run_dir",
    "progress_bar",
    "pyplot",
    "read_jsonl",
    "reduce_metrics",
    "replicate",
    "run",
    "save_figure",
    "shard",
    "short_runs",
    "skip_nonfinite",
    "backward_solver_from_flags",
    "solver_and_adjoint",
    "solvers_from_flags",
    "summarize_runs",
    "to_python",
    "train_step",
    "tree_digest",
    "unreplicate",
    "write_config",
    "write_csv",
    "write_json",
]
