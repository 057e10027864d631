"""The main job's short runs: one compiled step for every run, a diverged run stopped and still
evaluated, the rows against a loop written out by hand."""

from __future__ import annotations

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from deqjax import data, training
from experiments.parts.short_runs import StopWhenNonFinite, short_runs

NUM_STEPS, LOG_EVERY = 5, 2
RUNS = [{"scale": 0.1, "seed": 0}, {"scale": 1e20, "seed": 1}]  # the second one's loss is inf


def _data(n: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 4)).astype(np.float32)
    return {"x": x, "y": (x[:, 0] > 0).astype(np.int32) + (x[:, 1] > 0).astype(np.int32)}


TRAIN, TEST = _data(64, 0), _data(24, 1)


def init(scale: float, seed: int) -> dict[str, jax.Array]:
    w = jax.random.normal(jax.random.PRNGKey(seed), (4, 3), jnp.float32)
    return {"w": jnp.float32(scale) * w}


def _losses(params, batch):
    logits = batch["x"] @ params["w"]
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"])
    return ce + jnp.sum(params["w"] ** 2) * 1e-3, logits  # the penalty overflows at scale 1e20


class Traced:
    """The loss and eval functions, counting their traces (one each: one compiled step)."""

    def __init__(self):
        self.loss_traces = self.eval_traces = 0

    def loss_fn(self, params, batch, key, reg_state, step):
        self.loss_traces += 1
        loss, _ = _losses(params, batch)
        return jnp.mean(loss), {"nfe": jnp.float32(3.0)}

    def eval_fn(self, params, batch):
        self.eval_traces += 1
        loss, logits = _losses(params, batch)
        hit = jnp.argmax(logits, -1).astype(jnp.int32) == batch["y"]
        return {"accuracy": hit, "loss": loss}


def _short_runs(fns: Traced, parallel: str = "sharded", **kw) -> list[dict]:
    return short_runs(
        RUNS,
        init=init,
        loss_fn=fns.loss_fn,
        optimizer=optax.sgd(0.1),
        eval_fn=fns.eval_fn,
        train=TRAIN,
        test=TEST,
        batch_size=16,
        eval_batch_size=8,
        num_steps=NUM_STEPS,
        log_every=LOG_EVERY,
        parallel=training.data_parallel(parallel),
        **kw,
    )


def _by_hand(run: dict, num_steps: int) -> dict[str, float]:
    """The run trained and evaluated without the loop: its last loss, test error and loss."""
    fns = Traced()
    pair = training.train_step(fns.loss_fn, optax.sgd(0.1), axis_name=None)
    state = pair.init(init(**run), jax.random.PRNGKey(run["seed"]))
    batches = data.ShuffledBatches(TRAIN, batch_size=16, seed=run["seed"])
    for _ in range(num_steps):
        state, metrics = jax.jit(pair.update)(state, next(batches))
    ev = fns.eval_fn(state.params, TEST)
    return {
        "train_loss_last": float(metrics["loss"]),
        "test_error": 1.0 - float(jnp.mean(ev["accuracy"])),
        "test_loss": float(jnp.mean(ev["loss"])),
    }


def test_rows_match_a_loop_by_hand_and_a_diverged_run_stops_and_is_evaluated():
    fns, lines = Traced(), []
    rows = _short_runs(fns, progress=False, print_fn=lines.append)
    assert (fns.loss_traces, fns.eval_traces) == (1, 1)  # one compiled step for both runs
    keys = ["scale", "seed", "test_error", "test_loss", "train_loss_last", "train_nfe_last"]
    assert [list(r) for r in rows] == [[*keys, "diverged", "steps_run", "seconds"]] * 2
    fine, diverged = rows
    assert fine["diverged"] is False and fine["steps_run"] == NUM_STEPS
    assert diverged["diverged"] is True and diverged["steps_run"] == LOG_EVERY
    assert math.isinf(diverged["train_loss_last"]) and diverged["train_nfe_last"] == 3.0
    for row, run in zip(rows, RUNS):
        expected = _by_hand(run, row["steps_run"])
        assert {k: row[k] for k in expected} == pytest.approx(expected, rel=1e-5)
        assert row["seconds"] > 0
    assert lines == [
        f"scale 0.1 seed 0: test error {fine['test_error']:.4f}",
        f"scale 1e+20 seed 1: test error {diverged['test_error']:.4f} DIVERGED",
    ]


def test_pmap_gives_the_sharded_rows():
    sharded = _short_runs(Traced(), progress=False, print_fn=None)
    pmapped = _short_runs(Traced(), progress=False, print_fn=None, parallel="pmap")
    for p, s in zip(pmapped, sharded, strict=True):
        del p["seconds"], s["seconds"]
        assert p == pytest.approx(s, rel=1e-6)


def test_batches_on_the_devices_give_the_rows_of_batches_from_the_host(monkeypatch):
    made = []

    class Spy(training.ResidentBatches):
        def __init__(self, *args):
            made.append(args)
            super().__init__(*args)

    monkeypatch.setattr(training, "ResidentBatches", Spy)
    host = _short_runs(Traced(), progress=False, print_fn=None)
    assert not made
    resident = _short_runs(Traced(), progress=False, print_fn=None, device_resident=True)
    assert len(made) == len(RUNS)  # each run's batches came from the devices
    for r, h in zip(resident, host, strict=True):
        del r["seconds"], h["seconds"]
        assert r == h  # the same batches: the same numbers, bit for bit


NAN = math.nan


@pytest.mark.parametrize(
    "losses, every, stop",
    [
        ([1.0, 2.0, NAN, NAN, NAN, NAN], 1, 3),
        ([1.0, 2.0, NAN, NAN, NAN, NAN], 2, 4),  # read on steps 2 and 4
        ([1.0, 2.0, NAN, NAN, NAN, NAN], 10, 6),  # read on the last step only
        ([1.0, 2.0, NAN, 4.0, 5.0, 6.0], 2, 6),  # step 3 is never read
    ],
)
def test_stop_when_non_finite_reads_on_its_schedule(losses, every, stop):
    def step_fn(state, batch):
        return state + 1, {"loss": np.float32(losses[state])}

    check = StopWhenNonFinite(every_steps=every)
    result = training.train_loop(
        step_fn, 0, itertools.repeat(None), num_steps=len(losses), actions=[check]
    )
    assert result.step == stop
    assert check.last["loss"] == pytest.approx(losses[stop - 1], nan_ok=True)
    assert result.stopped == check.diverged == math.isnan(losses[stop - 1])
    check.start(training.LoopContext(num_steps=len(losses)))  # a new run forgets the last one
    assert (check.diverged, check.last) == (False, {})


def test_stop_when_non_finite_refuses_a_period_below_one():
    with pytest.raises(ValueError, match="every_steps"):
        StopWhenNonFinite(every_steps=0)
