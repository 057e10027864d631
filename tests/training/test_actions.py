"""The library's actions on their own schedules: evaluation at epoch ends and at the end (also
of a run stopped early, when asked), SIGTERM without a ``with``, the non-finite guard's reports,
checkpoints saved on a preemption."""

from __future__ import annotations

import os
import signal

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from deqjax import data, training


def _arrays(n=40):
    rng = np.random.default_rng(0)
    return {"x": rng.normal(size=(n, 3)).astype(np.float32), "y": np.ones(n, np.float32)}


def _loss_fn(params, batch, key, reg_state, step):
    return jnp.mean((batch["x"] @ params["w"] - batch["y"]) ** 2), {}


def _eval_fn(params, batch):
    return {"sq_err": (batch["x"] @ params["w"] - batch["y"]) ** 2}


def _loop(actions, *, num_steps, batches=None, optimizer=None, checkpoints=None, say=None):
    pair = training.train_step(_loss_fn, optimizer or optax.sgd(0.1))
    parallel = training.data_parallel("sharded")
    batches = batches or data.ShuffledBatches(_arrays(), batch_size=8, seed=0)  # 5 per epoch
    state = pair.init({"w": jnp.zeros(3, jnp.float32)}, jax.random.PRNGKey(0))
    if checkpoints is not None:
        state, _ = checkpoints.restore_or_claim(state, batches, training.RunPolicy(), parallel)
    return training.train_loop(
        parallel.map_update(pair.update),
        parallel.put(state, training.STATE_KINDS),
        (parallel.put(next(batches), training.SHARDED) for _ in range(10**6)),
        num_steps=num_steps,
        actions=actions,
        context=training.LoopContext(parallel, batches, checkpoints=checkpoints, say=say),
        read_metrics=lambda m: parallel.get(m, training.REPLICATED),
    )


class _StopAt(training.Action):
    """Asks the loop to stop after step ``step``."""

    def __init__(self, step):
        super().__init__(at_steps=(step,))
        self._stop = False

    def run(self, step, state, metrics, batch):
        self._stop = True

    def stop_requested(self):
        return self._stop


def _saved_steps(folder):
    """The steps of the checkpoints in ``folder`` (their folders are named by step)."""
    return sorted(int(name) for name in os.listdir(folder) if name.isdigit())


def _eval_steps(result):
    return [r["step"] for r in result.history if r["split"] == "eval"]


def test_evaluate_at_each_epoch_end_and_at_the_end_unless_stopped_early_or_asked():
    evaluate = training.Evaluate(_eval_fn, _arrays())
    assert _eval_steps(_loop([evaluate], num_steps=12)) == [5, 10, 12]
    assert _eval_steps(_loop([evaluate], num_steps=10)) == [5, 10]  # the end just evaluated
    assert _eval_steps(_loop([evaluate, _StopAt(7)], num_steps=12)) == [5]  # stopped: no end
    always = training.Evaluate(_eval_fn, _arrays(), every_steps=100, even_if_stopped=True)
    stopped = _loop([_StopAt(7), always], num_steps=12)
    assert _eval_steps(stopped) == [7] and stopped.stopped  # the run as it stands, stopped
    only_at = training.Evaluate(_eval_fn, _arrays(), at_steps=(2,), at_end=False)
    assert _eval_steps(_loop([only_at], num_steps=6)) == [2]
    only_end = training.Evaluate(_eval_fn, _arrays(), each_epoch=False, even_if_stopped=True)
    assert _eval_steps(_loop([only_end], num_steps=12)) == [12]
    assert _eval_steps(_loop([_StopAt(3), only_end], num_steps=12)) == [3]  # short_runs' rule


class _Endless:
    """The batches of a ShuffledBatches as an endless stream: no epochs."""

    batch_size = local_batch_size = 8
    steps_per_epoch = None

    def __init__(self):
        self._batches = data.ShuffledBatches(_arrays(), batch_size=8, seed=0)

    @property
    def state(self):
        return self._batches.state

    def restore(self, state):
        self._batches.restore(state)

    def __next__(self):
        return next(self._batches)


def test_evaluate_of_an_endless_stream_needs_a_schedule():
    endless = _Endless()
    with pytest.raises(ValueError, match="Evaluate needs every_steps"):
        _loop([training.Evaluate(_eval_fn, _arrays())], num_steps=3, batches=endless)
    every_2 = training.Evaluate(_eval_fn, _arrays(), every_steps=2)
    result = _loop([every_2], num_steps=3, batches=endless)
    assert _eval_steps(result) == [2, 3]
    at_end = training.Evaluate(_eval_fn, _arrays(), each_epoch=False)
    assert _eval_steps(_loop([at_end], num_steps=3, batches=_Endless())) == [3]
    with pytest.raises(ValueError, match="eval_fn"):
        training.Evaluate("not a function", _arrays())
    with pytest.raises(ValueError, match="every_steps"):
        training.Evaluate(_eval_fn, _arrays(), every_steps=0)


def test_stop_on_sigterm_installs_its_handler_without_a_with_and_puts_the_old_one_back():
    class Signal(training.Action):
        def __init__(self):
            super().__init__(at_steps=(3,))

        def run(self, step, state, metrics, batch):
            os.kill(os.getpid(), signal.SIGTERM)

    seen = []
    previous = signal.signal(signal.SIGTERM, lambda *args: seen.append(args))
    try:
        lines = []
        result = _loop([Signal(), training.StopOnSigterm()], num_steps=8, say=lines.append)
        assert result.stopped and result.step == 3 and seen == []
        assert lines == ["[train] SIGTERM: stopping at step 3"]
        assert signal.getsignal(signal.SIGTERM) is not None
        os.kill(os.getpid(), signal.SIGTERM)  # the handler before the loop is back
        assert len(seen) == 1
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_guard_reports_skipped_updates_and_stops_a_streak():
    def nan_at(*steps):
        class Batches(data.ShuffledBatches):
            def __next__(self):
                batch = super().__next__()
                i = self.state.epoch * self.steps_per_epoch + self.state.index
                return {**batch, "y": batch["y"] * (np.nan if i in steps else 1.0)}

        return Batches(_arrays(), batch_size=8, seed=0)

    lines = []
    skip = training.skip_nonfinite(optax.sgd(0.1))
    guard = training.GuardNonFinite(3, every_steps=2)
    _loop([guard], num_steps=8, batches=nan_at(2, 3), optimizer=skip, say=lines.append)
    assert [line.split(" (")[0] for line in lines] == [
        "[train] step 2: 1 update(s) skipped so far",
        "[train] step 4: 2 update(s) skipped so far",
    ]
    assert lines[0].endswith("loss nan)") and "loss nan" not in lines[1]
    with pytest.raises(training.NonFiniteError, match="last 4 steps .* skipped"):
        _loop([guard], num_steps=20, batches=nan_at(*range(5, 30)), optimizer=skip)
    with pytest.raises(training.NonFiniteError, match="last 3 steps .* were applied"):
        _loop([guard], num_steps=20, batches=nan_at(*range(5, 30)))  # without the wrapper


def test_save_checkpoints_saves_by_policy_and_at_a_preemption_then_stops(tmp_path):
    checkpoints = training.Checkpoints(tmp_path / "ckpt", every_steps=3)

    class Preempt(training.Action):
        def __init__(self):
            super().__init__(at_steps=(5,))

        def run(self, step, state, metrics, batch):
            checkpoints.preemption_requested = True

    lines = []
    actions = [Preempt(), training.SaveCheckpoints()]
    result = _loop(actions, num_steps=10, checkpoints=checkpoints, say=lines.append)
    assert result.stopped and result.step == 5
    assert _saved_steps(tmp_path / "ckpt") == [3, 5]
    assert lines == ["[train] saved checkpoint at step 5, stopping"]
    checkpoints.close()
    with pytest.raises(ValueError, match="needs the run's checkpoints"):
        _loop([training.SaveCheckpoints()], num_steps=2)
