"""The training loop and its periodic actions: the hooks' order, stopping, the lazy metric fetch,
misuse refused, and the loop built by hand from fit's parts giving fit's history."""

from __future__ import annotations

import itertools
import os

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

    def __init__(self, calls, stop_at=None, **schedule):
        super().__init__(**schedule)
        self.calls, self.stop_at, self.step = calls, stop_at, None

    def start(self, ctx):
        self.calls.append(("start", ctx.start_step, ctx.num_steps))

    def run(self, step, state, metrics, batch):
        self.calls.append(("run", step))
        self.step = step
        return {"split": "trace", "step": step, "value": np.float32(step) / 2}

    def stop_requested(self):
        return self.stop_at is not None and self.step == self.stop_at

    def end(self, step, state, stopped):
        self.calls.append(("end", step, stopped))

    def close(self):
        self.calls.append(("close",))


def _plain_step():
    pair = training.train_step(_loss_fn, optax.sgd(0.05), axis_name=None)
    state = pair.init({"w": jnp.zeros((5,), jnp.float32)}, jax.random.PRNGKey(0))
    return jax.jit(pair.update), state


def _batches():
    return data.ShuffledBatches(_arrays(), batch_size=16, seed=0)


def test_loop_runs_hooks_in_order_by_their_schedules_and_stops_when_asked():
    step_fn, state = _plain_step()
    calls, sparse, written = [], [], []
    result = training.train_loop(
        step_fn,
        state,
        _batches(),
        num_steps=10,
        start_step=2,
        actions=[
            _Trace(calls, stop_at=5, every_steps=1, at_end=True),
            _Trace(sparse, every_steps=2),  # no end: not at_end
        ],
        on_record=written.append,
    )
    assert calls == [
        ("start", 2, 10),
        ("run", 3),
        ("run", 4),
        ("run", 5),
        ("end", 5, True),
        ("close",),
    ]
    assert sparse == [("start", 2, 10), ("run", 4), ("close",)]
    assert result.step == 5 and result.stopped
    assert result.history == written
    assert [r["step"] for r in result.history] == [3, 4, 4, 5]
    assert type(result.history[0]["value"]) is float  # records hold Python scalars
    assert int(result.state.step) == 3  # the state took the 3 steps of this call


def test_every_action_is_closed_in_reverse_order_after_an_error():
    step_fn, state = _plain_step()
    calls = []

    class Failing(training.Action):
        def __init__(self):
            super().__init__(every_steps=2)

        def run(self, step, state, metrics, batch):
            raise RuntimeError("boom")

        def close(self):
            calls.append(("close failing",))

    with pytest.raises(RuntimeError, match="boom"):
        training.train_loop(
            step_fn,
            state,
            _batches(),
            num_steps=5,
            actions=[_Trace(calls, every_steps=1, at_end=True), Failing()],
        )
    assert calls == [("start", 0, 5), ("run", 1), ("run", 2), ("close failing",), ("close",)]


def test_loop_refuses_misuse_and_says_when_the_batches_ran_out():
    step_fn, state = _plain_step()

    def loop(**kwargs):
        args = dict(num_steps=4, start_step=0, actions=())
        return training.train_loop(step_fn, state, _batches(), **(args | kwargs))

    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="num_steps"):
            loop(num_steps=bad)
    for bad in (-1, 5, 1.0):
        with pytest.raises(ValueError, match="start_step"):
            loop(start_step=bad)
    with pytest.raises(ValueError, match=r"actions\[1\] must be a deqjax.training.Action"):
        loop(actions=[training.LogMetrics(), lambda *args: None])
    short = iter([next(_batches()) for _ in range(3)])
    with pytest.raises(ValueError, match="ran out before step 4 of 4"):
        training.train_loop(step_fn, state, short, num_steps=4)
    calls = []  # nothing to do: no hook runs
    done = loop(start_step=4, actions=[_Trace(calls, every_steps=1, at_end=True)])
    assert calls == [] and done.step == 4 and done.history == [] and not done.stopped


def test_metrics_are_fetched_once_and_only_on_logging_steps():
    step_fn, state = _plain_step()
    reads = []

    def read(metrics):
        reads.append(1)
        return jax.device_get(metrics)

    actions = [
        training.LogMetrics(every_steps=3),
        training.GuardNonFinite(None, every_steps=3),
        training.ReportProgress(),
    ]
    result = training.train_loop(
        step_fn, state, _batches(), num_steps=7, actions=actions, read_metrics=read
    )
    assert [r["step"] for r in result.history] == [3, 6, 7]  # the run's last step too
    assert len(reads) == 3  # three actions read the metrics on each of those steps: one fetch
    assert {"loss", "err_max", "grad_norm", "epoch", "examples_per_sec"} <= set(result.history[0])


def test_log_metrics_records_the_last_step_of_the_run_it_is_in():
    """One LogMetrics in runs of two lengths: each run's last step is recorded (the run's
    length comes from the loop, not from the constructor)."""
    step_fn, state = _plain_step()
    log = training.LogMetrics(every_steps=4)
    for num_steps, want in ((6, [4, 6]), (9, [4, 8, 9])):
        result = training.train_loop(step_fn, state, _batches(), num_steps=num_steps, actions=[log])
        assert [r["step"] for r in result.history] == want


def _fit(actions, **kwargs):
    """fit on the regression toy with these actions; ``kwargs`` add to or replace the rest."""
    pair = training.train_step(_loss_fn, training.skip_nonfinite(optax.sgd(0.05)))
    state = pair.init({"w": jnp.zeros((5,), jnp.float32)}, kwargs.pop("rng", jax.random.PRNGKey(0)))
    defaults = dict(num_steps=10, parallel=training.data_parallel("sharded"), say=None)
    return training.fit(pair, state, _batches(), actions=actions, **(defaults | kwargs))


def _actions(log_every=2, diagnostics_every=5, eval_every=None):
    return [
        training.LogMetrics(every_steps=log_every),
        training.GuardNonFinite(10, every_steps=log_every),
        training.RunDiagnostics(_diagnostics_fn, every_steps=diagnostics_every),
        training.Evaluate(_eval_fn, _arrays(), every_steps=eval_every),
        training.StopOnSigterm(),
    ]


def _untimed(records):
    return [{k: v for k, v in r.items() if k != "examples_per_sec"} for r in records]


def test_the_loop_built_by_hand_from_fits_parts_gives_fits_history(tmp_path):
    params, rng = {"w": jnp.zeros((5,), jnp.float32)}, jax.random.PRNGKey(3)
    fitted = _fit(
        _actions(),
        rng=rng,
        checkpoints=training.Checkpoints(tmp_path / "fit" / "ckpt", every_steps=4),
        writers=[training.JsonlWriter(tmp_path / "fit" / "metrics.jsonl")],
    )

    # The same run, composed by hand from the public parts.
    parallel = training.data_parallel("sharded")
    train_data = _batches()
    pair = training.train_step(_loss_fn, training.skip_nonfinite(optax.sgd(0.05)))
    state = pair.init(params, rng)
    checkpoints = training.Checkpoints(tmp_path / "hand" / "ckpt", every_steps=4)
    state, _ = checkpoints.restore_or_claim(state, train_data, training.RunPolicy(), parallel)
    writer = training.JsonlWriter(tmp_path / "hand" / "metrics.jsonl")
    writer.open(None, False)
    kinds = training.STATE_KINDS
    update = parallel.map(
        pair.update, (kinds, training.SHARDED), (kinds, training.REPLICATED), donate_argnums=(0,)
    )
    result = training.train_loop(
        update,
        parallel.put(state, kinds),
        (parallel.put(next(train_data), training.SHARDED) for _ in itertools.count()),
        num_steps=10,
        actions=[*_actions(), training.SaveCheckpoints()],
        context=training.LoopContext(parallel, train_data, checkpoints=checkpoints),
        read_metrics=lambda m: parallel.get(m, training.REPLICATED),
        on_record=writer.write,
    )
    writer.close()
    assert not result.stopped and result.step == 10
    assert _untimed(result.history) == _untimed(fitted.history)
    splits = [(r["split"], r["step"]) for r in result.history]
    assert ("diagnostics", 5) in splits and ("eval", 4) in splits and ("eval", 10) in splits
    hand_file = training.read_jsonl(tmp_path / "hand" / "metrics.jsonl")
    assert _untimed(hand_file) == _untimed(training.read_jsonl(tmp_path / "fit" / "metrics.jsonl"))
    host = parallel.get(result.state, kinds)
    assert tree_digest(host) == tree_digest(fitted.state)
    checkpoints.close()  # an asynchronous save in flight is finished here
    saved = os.listdir(tmp_path / "hand" / "ckpt")
    assert sorted(int(name) for name in saved if name.isdigit()) == [4, 8, 10]


def test_fit_in_pmap_mode_gives_the_sharded_history():
    def run(parallel):
        return _fit(_actions(1, 3, 3), num_steps=6, parallel=parallel)

    sharded = run(training.data_parallel("sharded"))
    pmapped = run(training.data_parallel("pmap"))
    assert _untimed(sharded.history) == _untimed(pmapped.history)
    assert tree_digest(sharded.state) == tree_digest(pmapped.state)
