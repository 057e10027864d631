"""The evaluation and diagnostics programs compile in the background while the train step
does, and their first call finds them compiled."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax

from deqjax import data, training
from deqjax._src.training import warm_up


def test_a_program_compiled_in_the_background_is_not_compiled_again(compiles):
    step = jax.pmap(lambda p, b: jnp.sum(jnp.tanh(b @ p)) + 0.25, axis_name="batch")
    p, b = jnp.ones((1, 9, 9), jnp.float32), jnp.ones((1, 3, 9), jnp.float32)
    compiles.clear()  # making p and b compiled their own small programs
    warm_up.Background(step, (p, b)).wait()
    assert len(compiles) == 1
    np.testing.assert_allclose(step(p, b), np.sum(np.tanh(np.ones((3, 9)) * 9)) + 0.25, rtol=1e-6)
    assert len(compiles) == 1  # the call ran the background's program


def _fit(eval_every=4, traces=None):
    rng = np.random.default_rng(0)
    arrays = {"x": rng.normal(size=(64, 5)).astype(np.float32), "y": rng.normal(size=(64,))}
    arrays["y"] = arrays["y"].astype(np.float32)

    def loss_fn(params, batch, key, reg_state, step):
        err = batch["x"] @ params["w"] - batch["y"]
        return jnp.mean(err**2), {}

    def eval_fn(params, batch):
        return {"sq_err": (batch["x"] @ params["w"] - batch["y"]) ** 2}

    def diagnostics_fn(params, batch, key, reg_state):
        if traces is not None:
            traces.append(1)
        return {"w_norm": jnp.sqrt(jnp.sum(params["w"] ** 2))}

    pair = training.train_step(loss_fn, training.skip_nonfinite(optax.sgd(0.05)))
    return training.fit(
        pair,
        pair.init({"w": jnp.zeros((5,), jnp.float32)}, jax.random.PRNGKey(0)),
        data.ShuffledBatches(arrays, batch_size=16, seed=0),
        num_steps=8,
        parallel=training.data_parallel("sharded"),
        actions=[
            training.LogMetrics(every_steps=4),
            training.RunDiagnostics(diagnostics_fn, every_steps=4),
            training.Evaluate(eval_fn, arrays, every_steps=eval_every),
        ],
        say=None,
    ).history


def test_fit_compiles_evaluation_and_diagnostics_once_and_trains_alike(compiles, monkeypatch):
    _fit()  # the small programs every run shares (placing arrays, zeros) compile once per process
    jobs = []
    real = warm_up.compile_in_background
    monkeypatch.setattr(warm_up, "compile_in_background", lambda js: jobs.extend(js) or real(js))
    compiles.clear()
    warm = _fit()
    with_warm_up = len(compiles)
    assert len(jobs) == 2  # the evaluation and the diagnostics steps, before the first step
    # The same run with nothing compiled in the background: every program on first use.
    monkeypatch.setattr(warm_up, "compile_in_background", lambda jobs: [lambda: None] * len(jobs))
    compiles.clear()
    cold = _fit()
    assert len(compiles) == with_warm_up  # no program compiled twice
    untimed = lambda records: [
        {k: v for k, v in r.items() if k != "examples_per_sec"} for r in records
    ]  # noqa: E731
    assert untimed(warm) == untimed(cold)
    assert [r["split"] for r in warm].count("eval") == 2
    assert [r["split"] for r in warm].count("diagnostics") == 2


def test_a_setting_local_to_the_calling_thread_reaches_the_background():
    """The suite pins strict dtype promotion; a run under ``jax.numpy_dtype_promotion("standard")``
    traces its diagnostics once (in the background, with the caller's setting), not twice."""
    traces = []
    with jax.numpy_dtype_promotion("standard"):
        _fit(traces=traces)
    assert len(traces) == 1


def test_the_background_compilations_have_ended_when_fit_returns(monkeypatch):
    """An interpreter that exits while XLA compiles on another thread aborts: each action waits
    for its compilation in ``close``, also when the run never used the program."""
    started = []
    real = warm_up.Background.__init__

    def spy(self, fn, args):
        real(self, fn, args)
        started.append(self._thread)

    monkeypatch.setattr(warm_up.Background, "__init__", spy)
    _fit(eval_every=100)  # the evaluation only at the end; diagnostics at 4 and 8
    assert len(started) == 2 and not any(thread.is_alive() for thread in started)
    assert all(thread.name == warm_up.THREAD_NAME for thread in started)
