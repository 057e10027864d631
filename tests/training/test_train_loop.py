"""The training loop and its periodic actions: the hooks' order, stopping, the lazy metric fetch,
and the loop built by hand from fit's parts giving fit's history."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from deqjax import data, training
from deqjax._src.training.checkpoint import tree_digest


def _arrays():
    rng = np.random.default_rng(0)
    arrays = {"x": rng.normal(size=(64, 5)).astype(np.float32), "y": rng.normal(size=(64,))}
    arrays["y"] = arrays["y"].astype(np.float32)
    return arrays


def _loss_fn(params, batch, key, reg_state, step):
    err = batch["x"] @ params["w"] - batch["y"]
    return jnp.mean(err**2), {"err_max": jnp.max(jnp.abs(err))}


def _eval_fn(params, batch):
    return {"sq_err": (batch["x"] @ params["w"] - batch["y"]) ** 2}


def _diagnostics_fn(params, batch, key, reg_state):
    return {"w_norm": jnp.sqrt(jnp.sum(params["w"] ** 2))}


class _Trace(training.Action):
    """Records every hook call; asks to stop after step ``stop_at``."""

    def __init__(self, calls, stop_at=None):
        self.calls, self.stop_at, self.step = calls, stop_at, None

    def start(self, step, state):
        self.calls.append(("start", step))

    def __call__(self, step, state, metrics, batch):
        self.calls.append(("call", step))
        self.step = step
        return {"split": "trace", "step": step, "value": np.float32(step) / 2}

    def stop_requested(self):
        return self.step == self.stop_at

    def end(self, step, state, stopped):
        self.calls.append(("end", step, stopped))
        return None


def _plain_step():
    pair = training.train_step(_loss_fn, optax.sgd(0.05), axis_name=None)
    state = pair.init({"w": jnp.zeros((5,), jnp.float32)}, jax.random.PRNGKey(0))
    return jax.jit(pair.update), state


def test_loop_calls_hooks_in_order_keeps_records_and_stops_when_asked():
    step_fn, state = _plain_step()
    batches = data.ShuffledBatches(_arrays(), batch_size=16, seed=0)
    calls, plain, written = [], [], []

    def plain_action(step, state, metrics, batch):  # any callable is an action
        plain.append(step)

    result = training.train_loop(
        step_fn,
        state,
        batches,
        num_steps=10,
        start_step=2,
        actions=[_Trace(calls, stop_at=5), plain_action],
        on_record=written.append,
    )
    assert calls == [("start", 2), ("call", 3), ("call", 4), ("call", 5), ("end", 5, True)]
    assert plain == [3, 4, 5]
    assert result.step == 5 and result.stopped
    assert result.history == written
    assert [r["step"] for r in result.history] == [3, 4, 5]
    assert type(result.history[0]["value"]) is float  # records hold Python scalars
    assert int(result.state.step) == 3  # the state took the 3 steps of this call


def test_metrics_are_fetched_once_and_only_on_logging_steps():
    step_fn, state = _plain_step()
    batches = data.ShuffledBatches(_arrays(), batch_size=16, seed=0)
    reads = []

    def read(metrics):
        reads.append(1)
        return jax.device_get(metrics)

    actions = [
        training.LogMetrics(every_steps=3, num_steps=7, data=batches),
        training.GuardNonFinite(None, every_steps=3, num_steps=7),
        training.ReportProgress(num_steps=7, every_steps=3, enabled=False),
    ]
    result = training.train_loop(
        step_fn, state, batches, num_steps=7, actions=actions, read_metrics=read
    )
    assert [r["step"] for r in result.history] == [3, 6, 7]
    assert len(reads) == 3  # three actions read the metrics on each of those steps: one fetch
    assert {"loss", "err_max", "grad_norm", "epoch", "examples_per_sec"} <= set(result.history[0])


def _fit(**kwargs):
    """fit on the regression toy; ``kwargs`` add to or replace the defaults."""
    arrays = _arrays()
    defaults = dict(
        params={"w": jnp.zeros((5,), jnp.float32)},
        loss_fn=_loss_fn,
        optimizer=optax.sgd(0.05),
        train_data=data.ShuffledBatches(arrays, batch_size=16, seed=0),
        rng=jax.random.PRNGKey(0),
        eval_fn=_eval_fn,
        eval_data=arrays,
        diagnostics_fn=_diagnostics_fn,
        progress=False,
        print_fn=None,
    )
    return training.fit(**(defaults | kwargs))


def _untimed(records):
    return [{k: v for k, v in r.items() if k != "examples_per_sec"} for r in records]


def test_the_loop_built_by_hand_from_fits_parts_gives_fits_history(tmp_path):
    arrays = _arrays()
    params, rng = {"w": jnp.zeros((5,), jnp.float32)}, jax.random.PRNGKey(3)
    fitted = _fit(
        num_steps=10,
        rng=rng,
        log_every=2,
        checkpoint_every=4,
        diagnostics_every=5,
        checkpoint_dir=tmp_path / "fit" / "ckpt",
        metrics_path=tmp_path / "fit" / "metrics.jsonl",
    )

    # The same run, composed by hand from the public parts.
    parallel = training.data_parallel("sharded")
    train_data = data.ShuffledBatches(arrays, batch_size=16, seed=0)
    pair = training.train_step(_loss_fn, training.skip_nonfinite(optax.sgd(0.05)))
    state = pair.init(params, rng)
    kinds = training.STATE_KINDS
    update = parallel.map(
        pair.update, (kinds, training.SHARDED), (kinds, training.REPLICATED), donate_argnums=(0,)
    )
    with (
        training.Checkpointer(tmp_path / "hand" / "ckpt") as checkpointer,
        training.MetricsWriter(tmp_path / "hand" / "metrics.jsonl") as writer,
        training.StopOnSigterm() as stop,
    ):
        save = training.SaveCheckpoints(
            checkpointer, parallel=parallel, train_data=train_data, every_steps=4
        )
        actions = [
            training.LogMetrics(every_steps=2, num_steps=10, data=train_data),
            training.GuardNonFinite(
                10, every_steps=2, num_steps=10, last_checkpoint=save.last_checkpoint
            ),
            training.RunDiagnostics(_diagnostics_fn, every_steps=5, parallel=parallel),
            training.Evaluate(_eval_fn, arrays, parallel=parallel, train_data=train_data),
            save,
            stop,
        ]
        result = training.train_loop(
            update,
            parallel.put(state, kinds),
            (parallel.put(next(train_data), training.SHARDED) for _ in itertools.count()),
            num_steps=10,
            actions=actions,
            read_metrics=lambda m: parallel.get(m, training.REPLICATED),
            on_record=writer.write,
        )
    assert not result.stopped and result.step == 10
    assert _untimed(result.history) == _untimed(fitted.history)
    splits = [(r["split"], r["step"]) for r in result.history]
    assert ("diagnostics", 5) in splits and ("eval", 4) in splits and ("eval", 10) in splits
    hand_file = training.read_jsonl(tmp_path / "hand" / "metrics.jsonl")
    assert _untimed(hand_file) == _untimed(training.read_jsonl(tmp_path / "fit" / "metrics.jsonl"))
    host = parallel.get(result.state, kinds)
    assert tree_digest(host) == tree_digest(fitted.state)
    assert checkpointer.all_steps() == [4, 8, 10]


def test_fit_in_pmap_mode_gives_the_sharded_history():
    def run(parallel, **kwargs):
        schedules = dict(eval_every=3, diagnostics_every=3, log_every=1)
        return _fit(num_steps=6, parallel=parallel, **(schedules | kwargs))

    sharded, pmapped = run("sharded"), run(training.data_parallel("pmap"))
    assert _untimed(sharded.history) == _untimed(pmapped.history)
    assert tree_digest(sharded.state) == tree_digest(pmapped.state)
    with pytest.raises(ValueError, match="parallel must be one of"):
        run("vmap")
    with pytest.raises(ValueError, match="devices"):
        run(training.data_parallel("pmap"), devices=jax.devices())
