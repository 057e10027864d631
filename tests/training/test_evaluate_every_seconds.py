"""A new periodic action is one file and its test: an evaluation every T seconds of wall time.

The action below is all of it: the base class owns the schedule (``every_seconds``, ``at_end``)
and the loop asks it; the action says what it does and reads the run from ``self.ctx``.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax

from deqjax import data, training
from deqjax._src.training import train_loop as loop_module


class EvaluateEverySeconds(training.Action):
    """``eval_fn``'s means over ``eval_data`` every ``seconds`` of wall time and at the end: the
    record ``{"split": "eval", "step", name: mean}``.

    Args:
      eval_fn: ``(params, batch) -> {name: per-example values}`` (jitted here).
      eval_data: ``{name: array[N, ...]}``, evaluated as one batch.
      seconds: wall time between evaluations.
    """

    def __init__(self, eval_fn, eval_data, *, seconds: float):
        super().__init__(every_seconds=seconds, at_end=True)
        self._fn, self._data = jax.jit(eval_fn), eval_data

    def run(self, step, state, metrics, batch):
        means = {k: float(jnp.mean(v)) for k, v in self._fn(state.params, self._data).items()}
        self.ctx.tell(f"step {step} eval: {means}")
        return {"split": "eval", "step": step, **means}


class _Clock:
    """A wall clock that moves one second per read after each step (the loop's only clock)."""

    def __init__(self):
        self.now = 0.0

    def monotonic(self):
        return self.now


def test_an_evaluation_every_three_seconds_and_at_the_end(monkeypatch):
    rng = np.random.default_rng(0)
    arrays = {"x": rng.normal(size=(64, 5)).astype(np.float32)}
    arrays["y"] = arrays["x"] @ np.arange(5, dtype=np.float32)

    def loss_fn(params, batch, key, reg_state, step):
        return jnp.mean((batch["x"] @ params["w"] - batch["y"]) ** 2), {}

    def eval_fn(params, batch):
        return {"sq_err": (batch["x"] @ params["w"] - batch["y"]) ** 2}

    clock = _Clock()
    monkeypatch.setattr(loop_module, "time", clock)
    pair = training.train_step(loss_fn, optax.sgd(0.02))
    parallel = training.data_parallel("sharded")
    update = parallel.map_update(pair.update)

    def step_fn(state, batch):  # each step takes one second of the fake clock
        clock.now += 1.0
        return update(state, batch)

    lines = []
    result = training.train_loop(
        step_fn,
        parallel.put(
            pair.init({"w": jnp.zeros(5, jnp.float32)}, jax.random.PRNGKey(0)), training.STATE_KINDS
        ),
        (
            parallel.put(b, training.SHARDED)
            for b in data.ShuffledBatches(arrays, batch_size=16, seed=0)
        ),
        num_steps=10,
        actions=[EvaluateEverySeconds(eval_fn, arrays, seconds=3.0)],
        context=training.LoopContext(parallel, say=lines.append),
    )
    evals = [r for r in result.history if r["split"] == "eval"]
    assert [r["step"] for r in evals] == [3, 6, 9, 10]  # every 3 s of steps, and the end
    assert evals[-1]["sq_err"] < evals[0]["sq_err"]
    assert lines[0].startswith("[train] step 3 eval: {'sq_err': ")
