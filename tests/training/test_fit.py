"""The fit loop end to end: learning, evaluation and diagnostics on digits; any BatchIterator
with a carried state; kill and resume bit for bit; non-finite updates; an earlier run's files.

Checks that need their own JAX process (a fake device count, runs killed and resumed) run
``tests/helpers/train_worker.py`` in a subprocess.
"""

import json
import os
import random
import signal
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from deqjax import data, harness, training
from deqjax._src.training.checkpoint import all_finite, tree_digest
from deqjax._src.training.train_state import create_train_state
from experiments import plot_metrics
from tests.helpers import train_worker as toy
from tests.helpers.train_worker import WORKER, CountingBatches, carry_loss, run_worker, worker_env


@pytest.mark.slow
def test_fit_learns_digits(tmp_path):
    # Haiku's initializers mix Python floats with float32 arrays: standard promotion for the toy.
    with jax.numpy_dtype_promotion("standard"):
        train = data.load_digits(split="train")
        opt, schedule = toy.make_optimizer(total_steps=60)
        diag_calls = []

        def diagnostics(params, batch, key, reg_state):
            diag_calls.append(1)  # traced once
            return {"w_norm_max": optax.tree.norm(params)}

        result = training.fit(
            params=toy.init_params(),
            loss_fn=toy.loss_fn,
            optimizer=opt,
            train_data=data.ShuffledBatches(train, batch_size=64, seed=0),
            num_steps=60,
            rng=jax.random.PRNGKey(0),
            reg_state=toy.init_reg_state(),
            update_reg_state=toy.count_steps,
            learning_rate_fn=schedule,
            eval_fn=toy.eval_fn,
            eval_data=data.load_digits(split="test"),
            eval_batch_size=128,
            diagnostics_fn=diagnostics,
            diagnostics_every=20,
            log_every=10,
            metrics_path=tmp_path / "metrics.jsonl",
            progress=False,
            print_fn=None,
        )
    records = training.read_jsonl(tmp_path / "metrics.jsonl")
    assert records == result.history
    train_records = [r for r in records if r["split"] == "train"]
    assert [r["step"] for r in train_records] == [10, 20, 30, 40, 50, 60]
    assert {"loss", "accuracy", "loss_max", "grad_norm", "learning_rate"} <= set(train_records[0])
    assert train_records[-1]["loss"] < 0.5 * train_records[0]["loss"]
    assert [r["step"] for r in records if r["split"] == "diagnostics"] == [20, 40, 60]
    assert len(diag_calls) == 1
    evals = [r for r in records if r["split"] == "eval"]
    assert [r["step"] for r in evals] == [21, 42, 60]  # each epoch end (21 steps) and the end
    assert evals[-1]["count"] == 449
    assert evals[-1]["accuracy"] > 0.8  # chance is 0.1
    assert int(result.state.step) == 60 and int(result.state.reg_state["count"]) == 60
    assert result.data_state == data.IteratorState(epoch=2, index=18)
    assert not result.interrupted and result.restored_step is None

    # The plot command line turns the JSONL into a PNG with one panel per metric.
    png = tmp_path / "curves.png"
    plot_metrics.main([str(tmp_path / "metrics.jsonl"), "--out", str(png)])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    names = harness.plot_metrics(records, str(png), metrics=["loss", "accuracy", "nope"])
    assert names == ["loss", "accuracy"]


# --- any BatchIterator, a carried state --------------------------------------------------------


def _carry_fit(tmp_path, num_steps, *, resume=False, checkpoint_every=None, name="run"):
    return training.fit(
        params={"w": jnp.zeros((2,), jnp.float32)},
        loss_fn=carry_loss,
        optimizer=optax.sgd(0.1),
        train_data=CountingBatches(),
        num_steps=num_steps,
        rng=jax.random.PRNGKey(0),
        carry=jnp.zeros((), jnp.float32),
        log_every=1,
        checkpoint_dir=tmp_path / name / "ckpt",
        checkpoint_every=checkpoint_every,
        resume=resume,
        progress=False,
        print_fn=None,
    )


def test_any_batch_iterator_with_a_carry_trains_and_resumes_exactly(tmp_path):
    assert isinstance(CountingBatches(), data.BatchIterator)
    shuffled = data.ShuffledBatches({"x": np.zeros(8)}, batch_size=2, seed=0)
    assert isinstance(shuffled, data.BatchIterator)
    full = _carry_fit(tmp_path, 6, name="full")
    # the carry follows the data: c_{k+1} = c_k / 2 + mean(batch k), one copy per device
    c = 0.0
    for i in range(6):
        assert full.history[i]["carry"] == pytest.approx(c, rel=1e-6)
        c = 0.5 * c + i + (toy.COUNTING_BATCH - 1) / (2 * toy.COUNTING_BATCH)
    assert np.asarray(full.state.carry).shape == (1,)
    np.testing.assert_allclose(full.state.carry, [c], rtol=1e-6)
    assert full.data_state == {"i": 6} and "epoch" not in full.history[0]
    # stop after 4 steps, resume to 6: the same state, carry included, bit for bit
    _carry_fit(tmp_path, 4, checkpoint_every=2, name="part")
    resumed = _carry_fit(tmp_path, 6, resume=True, name="part")
    assert resumed.restored_step == 4
    assert tree_digest(resumed.state) == tree_digest(full.state)


def test_fit_rejects_a_non_iterator_and_mixed_step_arguments(tmp_path):
    kwargs = dict(params={"w": jnp.zeros(2)}, num_steps=2, rng=jax.random.PRNGKey(0))
    with pytest.raises(ValueError, match="BatchIterator"):
        training.fit(loss_fn=carry_loss, optimizer=optax.sgd(0.1), train_data=[1, 2], **kwargs)
    pair = training.train_step(carry_loss, optax.sgd(0.1), with_carry=True)
    with pytest.raises(ValueError, match="either loss_fn and optimizer, or train_step"):
        training.fit(loss_fn=carry_loss, train_step=pair, train_data=CountingBatches(), **kwargs)
    with pytest.raises(ValueError, match="eval_every"):
        training.fit(
            train_step=pair,
            train_data=CountingBatches(),
            eval_fn=lambda p, b: {},
            eval_data={"x": np.zeros(4)},
            **kwargs,
        )


_TWO_DEVICES = r"""
import json, os, sys, tempfile
import jax, jax.numpy as jnp, numpy as np, optax
from deqjax import training
from deqjax._src.training.checkpoint import tree_digest
from tests.helpers.train_worker import CountingBatches, carry_loss

d = tempfile.mkdtemp()
def fit(n, **kw):
    return training.fit(params={"w": jnp.zeros((2,), jnp.float32)}, loss_fn=carry_loss,
                        optimizer=optax.sgd(0.1), train_data=CountingBatches(), num_steps=n,
                        rng=jax.random.PRNGKey(0), carry=jnp.zeros((), jnp.float32),
                        progress=False, print_fn=None, **kw)
full = fit(6)
fit(4, checkpoint_dir=os.path.join(d, "ck"), checkpoint_every=2)
resumed = fit(6, checkpoint_dir=os.path.join(d, "ck"), resume=True)
same = tree_digest(resumed.state) == tree_digest(full.state)
print(json.dumps({"n": jax.device_count(), "carry": np.asarray(full.state.carry).tolist(),
                  "same": same}))
"""


@pytest.mark.slow  # a fresh JAX process with two CPU devices (~30 s)
def test_each_device_keeps_its_own_carry_and_resumes_it():
    proc = subprocess.run(
        [sys.executable, "-c", _TWO_DEVICES],
        cwd=toy.REPO_ROOT,
        env=worker_env(2),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["n"] == 2 and out["same"]
    # device k sees the k-th half of every batch: its running mean differs from the other's
    c0 = c1 = 0.0
    for i in range(6):
        c0, c1 = 0.5 * c0 + i + 0.125, 0.5 * c1 + i + 0.625
    np.testing.assert_allclose(out["carry"], [c0, c1], rtol=1e-6)


# --- killed and resumed ---------------------------------------------------------------------


@pytest.mark.slow
def test_sigterm_and_sigkill_then_resume_reproduce_the_run(tmp_path):
    work, ref = tmp_path / "run", tmp_path / "ref"
    common = ["--workdir", work, "--num_steps", 12, "--batch_size", 64, "--checkpoint_every", 3]
    # 1) SIGTERM mid-run: a checkpoint is saved at the current step, exit status 143.
    proc = subprocess.Popen(
        [sys.executable, WORKER, "fit", tmp_path / "a.json", *map(str, common)]
        + ["--step_delay_s", "0.5"],
        env=worker_env(),
        stderr=subprocess.PIPE,
        text=True,
    )
    metrics = work / "metrics.jsonl"
    deadline = time.time() + 180
    while time.time() < deadline and proc.poll() is None:
        if metrics.exists() and len(training.read_jsonl(metrics)) >= 2:
            proc.send_signal(signal.SIGTERM)
            break
        time.sleep(0.05)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err[-3000:]
    a = json.loads((tmp_path / "a.json").read_text())
    assert a["interrupted"] and 2 <= a["step"] < 12
    assert str(a["step"]) in os.listdir(work / "ckpt")
    # 2) Resume, then SIGKILL at a random later step (no chance to save anything).
    kill_at = random.Random(1234).randrange(a["step"] + 1, 12)
    proc = run_worker(
        ["fit", tmp_path / "b.json", *common, "--resume", "--kill_at_step", kill_at], check=False
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    # 3) Resume to the end, then a fresh uninterrupted reference run in the same process.
    run_worker(["fit", tmp_path / "c.json", *common, "--resume", "--reference_dir", ref])
    c = json.loads((tmp_path / "c.json").read_text())
    assert c["restored_step"] == max(a["step"], 3 * (kill_at // 3))
    assert c["step"] == 12 and c["digest"] == c["reference_digest"]  # bit-identical state
    resumed = [(r["step"], r["loss"]) for r in training.read_jsonl(metrics)]
    reference = [(r["step"], r["loss"]) for r in training.read_jsonl(ref / "metrics.jsonl")]
    assert resumed == reference and len(reference) == 12  # exact float equality


# --- non-finite updates, existing runs, append-only metrics --------------------------------------


def _toy_fit(tmp_path, loss_fn, *, optimizer=None, num_steps=8, **kwargs):
    with jax.numpy_dtype_promotion("standard"):
        return training.fit(
            params={"w": jnp.zeros(3, jnp.float32)},
            loss_fn=loss_fn,
            optimizer=optimizer or optax.sgd(0.1),
            train_data=data.ShuffledBatches(data.load_digits(split="train"), batch_size=8, seed=0),
            num_steps=num_steps,
            rng=jax.random.PRNGKey(0),
            log_every=1,
            checkpoint_dir=tmp_path / "ckpt",
            checkpoint_every=1,
            keep_checkpoints=2,
            metrics_path=tmp_path / "metrics.jsonl",
            progress=False,
            print_fn=None,
            **kwargs,
        )


def _nan_at(steps):
    def loss_fn(params, batch, key, reg_state, step):
        bad = jnp.isin(step, jnp.asarray(steps, jnp.int32))
        loss = jnp.sum((params["w"] - 1.0) ** 2)
        return jnp.where(bad, jnp.nan, loss), {}

    return loss_fn


def test_nonfinite_loss_skips_the_update_and_is_counted(tmp_path):
    result = _toy_fit(tmp_path, _nan_at([2, 3]), max_nonfinite_steps=3)
    train = [r for r in result.history if r["split"] == "train"]
    assert [r["skipped_updates"] for r in train] == [0, 0, 1, 2, 2, 2, 2, 2]
    assert [r["nonfinite_streak"] for r in train] == [0, 0, 1, 2, 0, 0, 0, 0]
    assert np.isnan(train[2]["loss"])  # history keeps floats: formattable
    assert f"{train[2]['loss']:.2e}" == "nan"
    # a skipped step leaves the parameters where they were: 6 of 8 updates applied
    w = float(np.asarray(result.state.params["w"])[0])
    assert w == pytest.approx(1.0 - 0.8**6, rel=1e-5)
    ckpt = training.Checkpointer(tmp_path / "ckpt")
    assert all(all_finite(ckpt.restore(template=result.state).state) for _ in [0])
    ckpt.close()


def test_nonfinite_streak_stops_the_run_with_finite_checkpoints(tmp_path):
    with pytest.raises(training.NonFiniteError, match="non-finite for the last 3 steps"):
        _toy_fit(tmp_path, _nan_at(list(range(3, 100))), max_nonfinite_steps=3, num_steps=20)
    ckpt = training.Checkpointer(tmp_path / "ckpt")
    assert ckpt.all_steps() == [4, 5]  # the streak reached 3 at step 6: stopped before saving it
    restored = ckpt.restore(template=_toy_state())
    assert all_finite(restored.state)
    ckpt.close()


def _toy_state():
    opt = training.skip_nonfinite(optax.sgd(0.1))
    return create_train_state({"w": jnp.zeros(3, jnp.float32)}, opt, jax.random.PRNGKey(0))


def test_overflowing_update_is_never_checkpointed(tmp_path):
    def loss_fn(params, batch, key, reg_state, step):  # loss 0, gradient -3e38: w overflows
        w = params["w"]
        return -3e38 * jnp.sum(w - jax.lax.stop_gradient(w)), {}

    with pytest.raises(training.NonFiniteError, match="not checkpointed"):
        _toy_fit(tmp_path, loss_fn, optimizer=optax.sgd(1.0))
    ckpt = training.Checkpointer(tmp_path / "ckpt")
    assert ckpt.all_steps() == [1]  # rotation kept the last finite checkpoint
    assert all_finite(ckpt.restore(template=_toy_state()).state)
    ckpt.close()


def test_fresh_fit_refuses_an_earlier_runs_files_and_resume_needs_a_checkpoint(tmp_path):
    loss_fn = _nan_at([])
    with pytest.raises(training.RestoreError, match="no checkpoint"):
        _toy_fit(tmp_path, loss_fn, resume=True)
    assert not (tmp_path / "metrics.jsonl").exists()
    _toy_fit(tmp_path, loss_fn, num_steps=4)
    before = (tmp_path / "metrics.jsonl").read_bytes()
    with pytest.raises(FileExistsError, match="overwrite"):
        _toy_fit(tmp_path, loss_fn, num_steps=4)
    assert (tmp_path / "metrics.jsonl").read_bytes() == before
    # resuming appends (the file is never rewritten); overwrite starts afresh
    _toy_fit(tmp_path, loss_fn, num_steps=6, resume=True)
    after = (tmp_path / "metrics.jsonl").read_bytes()
    assert after.startswith(before)
    raw = training.read_jsonl(tmp_path / "metrics.jsonl", raw=True)
    assert {"split": "resume", "step": 4} == {k: raw[4][k] for k in ("split", "step")}
    assert [r["step"] for r in training.read_jsonl(tmp_path / "metrics.jsonl")] == list(range(1, 7))
    _toy_fit(tmp_path, loss_fn, num_steps=2, overwrite=True)
    assert [r["step"] for r in training.read_jsonl(tmp_path / "metrics.jsonl")] == [1, 2]
    ckpt = training.Checkpointer(tmp_path / "ckpt")
    assert ckpt.all_steps() == [1, 2]
    ckpt.close()
