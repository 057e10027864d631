"""Training: the fit loop and the parts it composes (a short loop, periodic actions, data
parallelism), the optax-style train step, checkpoints, metrics, multi-host start-up.

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

from deqjax._src.training.actions.action import Action
from deqjax._src.training.actions.evaluate import Evaluate
from deqjax._src.training.actions.guard_nonfinite import GuardNonFinite
from deqjax._src.training.actions.log_metrics import LogMetrics
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
from deqjax._src.training.metrics import MetricsWriter, read_jsonl
from deqjax._src.training.nonfinite import NonFiniteError, skip_nonfinite
from deqjax._src.training.optimizer import make_optimizer, make_schedule
from deqjax._src.training.resident_batches import ResidentBatches
from deqjax._src.training.train_loop import LoopResult, StepMetrics, train_loop
from deqjax._src.training.train_state import TrainState, replicate, shard, unreplicate
from deqjax._src.training.train_step import TrainStep, reduce_metrics, train_step
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
    "LogMetrics",
    "LoopResult",
    "MetricsWriter",
    "NonFiniteError",
    "PER_DEVICE",
    "REPLICATED",
    "ReportProgress",
    "ResidentBatches",
    "RestoreError",
    "RunDiagnostics",
    "SHARDED",
    "STATE_KINDS",
    "SaveCheckpoints",
    "StepMetrics",
    "StopOnSigterm",
    "TrainState",
    "TrainStep",
    "compile_with_memory",
    "data_parallel",
    "fit",
    "initialize_distributed",
    "make_optimizer",
    "make_schedule",
    "read_jsonl",
    "reduce_metrics",
    "replicate",
    "shard",
    "skip_nonfinite",
    "train_loop",
    "train_step",
    "unreplicate",
]
