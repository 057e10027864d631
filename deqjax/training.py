"""Training: :func:`fit` (the loop plus the actions you pass), its parts (a short loop, periodic
actions with schedules, data parallelism, checkpoints, metric writers), the optax-style train
step, multi-host start-up.

What a training script of one's own needs. The run harness (run folders, configurations, plots,
sweeps) lives in :mod:`deqjax.harness`.

>>> from deqjax import data, training
>>> opt = training.make_optimizer(learning_rate=training.make_schedule(
...     learning_rate=1e-3, schedule="cosine", warmup_steps=100, total_steps=5000), clip_norm=1.0)
>>> def loss_fn(params, batch, key, reg_state, step):          # one device's share of the batch
...     logits = model.apply(params, batch["image"])
...     loss = cross_entropy(logits, batch["label"])
...     return loss, {"accuracy": jnp.mean(jnp.argmax(logits, -1) == batch["label"])}
>>> pair = training.train_step(loss_fn, training.skip_nonfinite(opt))
>>> result = training.fit(
...     pair, pair.init(params, jax.random.PRNGKey(0)),
...     data.ShuffledBatches(train, batch_size=256, seed=0),
...     num_steps=5000, parallel=training.data_parallel("sharded"),
...     actions=training.default_actions(training.Evaluate(eval_fn, test), log_every=50),
...     checkpoints=training.Checkpoints("runs/x/ckpt", every_steps=500),
...     policy=training.RunPolicy(resume=True),
...     writers=[training.JsonlWriter("runs/x/metrics.jsonl")])
"""

from deqjax._src.training.actions.action import Action
from deqjax._src.training.actions.default_actions import default_actions
from deqjax._src.training.actions.evaluate import Evaluate
from deqjax._src.training.actions.guard_nonfinite import GuardNonFinite
from deqjax._src.training.actions.log_metrics import LogMetrics
from deqjax._src.training.actions.profile_steps import ProfileSteps
from deqjax._src.training.actions.report_progress import ReportProgress
from deqjax._src.training.actions.run_diagnostics import RunDiagnostics
from deqjax._src.training.actions.save_checkpoints import SaveCheckpoints
from deqjax._src.training.actions.stop_on_sigterm import StopOnSigterm
from deqjax._src.training.checkpoint import Checkpointer
from deqjax._src.training.checkpoint_contents import CheckpointError, RestoreError
from deqjax._src.training.checkpoints import Checkpoints
from deqjax._src.training.data_parallel import (
    PER_DEVICE,
    REPLICATED,
    SHARDED,
    STATE_KINDS,
    DataParallel,
    data_parallel,
)
from deqjax._src.training.distributed import DistributedConfig, initialize_distributed
from deqjax._src.training.fit import FitResult, fit
from deqjax._src.training.loop_context import LoopContext
from deqjax._src.training.metrics import read_jsonl
from deqjax._src.training.nonfinite import NonFiniteError, skip_nonfinite
from deqjax._src.training.optimizer import make_optimizer, make_schedule
from deqjax._src.training.resident_batches import ResidentBatches, resident_if_fits
from deqjax._src.training.run_policy import RunPolicy
from deqjax._src.training.schedule import Schedule
from deqjax._src.training.step_metrics import StepMetrics
from deqjax._src.training.train_loop import LoopResult, train_loop
from deqjax._src.training.train_state import TrainState, replicate, shard, unreplicate
from deqjax._src.training.train_step import TrainStep, reduce_metrics, train_step
from deqjax._src.training.writers.event_file import read_tensorboard
from deqjax._src.training.writers.jsonl_writer import JsonlWriter
from deqjax._src.training.writers.metric_writer import MetricWriter
from deqjax._src.training.writers.tensorboard_writer import TensorBoardWriter
from deqjax._src.training.writers.wandb_writer import WandbWriter
from deqjax._src.training.xla_memory import compile_with_memory

__all__ = [
    "Action",
    "CheckpointError",
    "Checkpointer",
    "Checkpoints",
    "DataParallel",
    "DistributedConfig",
    "Evaluate",
    "FitResult",
    "GuardNonFinite",
    "JsonlWriter",
    "LogMetrics",
    "LoopContext",
    "LoopResult",
    "MetricWriter",
    "NonFiniteError",
    "PER_DEVICE",
    "ProfileSteps",
    "REPLICATED",
    "ReportProgress",
    "ResidentBatches",
    "RestoreError",
    "RunDiagnostics",
    "RunPolicy",
    "SHARDED",
    "STATE_KINDS",
    "SaveCheckpoints",
    "Schedule",
    "StepMetrics",
    "StopOnSigterm",
    "TensorBoardWriter",
    "TrainState",
    "TrainStep",
    "WandbWriter",
    "compile_with_memory",
    "data_parallel",
    "default_actions",
    "fit",
    "initialize_distributed",
    "make_optimizer",
    "make_schedule",
    "read_jsonl",
    "read_tensorboard",
    "reduce_metrics",
    "replicate",
    "resident_if_fits",
    "shard",
    "skip_nonfinite",
    "train_loop",
    "train_step",
    "unreplicate",
]
