"""The fit loop end to end: learning, evaluation and diagnostics on digits; any Batches with a
carried state; kill and resume bit for bit; a finished run resumed; non-finite updates; an
earlier run's files; what fit refuses.

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
from tests.helpers.train_worker import (
    WORKER,
    CountingBatches,
    carry_loss,
    run_worker,
    toy_fit,
    worker_env,
)


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

        result = toy_fit(
            data.ShuffledBatches(train, batch_size=64, seed=0),
            60,
            optimizer=opt,
            actions=[
                training.LogMetrics(every_steps=10),
                training.GuardNonFinite(every_steps=10),
                training.RunDiagnostics(diagnostics, every_steps=20),
                training.Evaluate(toy.eval_fn, data.load_digits(split="test"), batch_size=128),
            ],
            workdir=tmp_path,
            reg_state=toy.init_reg_state(),
            update_reg_state=toy.count_steps,
            learning_rate_fn=schedule,
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


# --- any Batches, a carried state ---------------------------------------------------------------


def _carry_fit(tmp_path, num_steps, *, resume=False, checkpoint_every=None, name="run"):
    return toy_fit(
        CountingBatches(),
        num_steps,
        loss=carry_loss,
        params={"w": jnp.zeros((2,), jnp.float32)},
        carry=jnp.zeros((), jnp.float32),
        skip=False,
        actions=[training.LogMetrics(every_steps=1)],
        workdir=tmp_path / name,
        checkpoint_every=checkpoint_every,
        resume=resume,
    )


def test_any_batches_with_a_carry_trains_and_resumes_exactly(tmp_path):
    assert isinstance(CountingBatches(), data.Batches)
    shuffled = data.ShuffledBatches({"x": np.zeros(8)}, batch_size=2, seed=0)
    assert isinstance(shuffled, data.Batches)
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


def test_fit_refuses_arguments_of_the_wrong_kind_before_touching_any_file(tmp_path):
    pair = training.train_step(carry_loss, optax.sgd(0.1), with_carry=True)
    state = pair.init({"w": jnp.zeros(2)}, jax.random.PRNGKey(0), carry=jnp.zeros(()))
    parallel = training.data_parallel("sharded")

    def fit(**kwargs):
        args = dict(num_steps=2, parallel=parallel)
        data_ = kwargs.pop("data", CountingBatches())
        return training.fit(kwargs.pop("pair", pair), state, data_, **(args | kwargs))

    class NoSizes:  # an iterator that does not declare what the loop reads
        state = {}

        def restore(self, state):
            pass

        def __next__(self):
            return {"x": np.zeros(4)}

    with pytest.raises(ValueError, match="data must be a Batches"):
        fit(data=NoSizes())
    with pytest.raises(ValueError, match="train_step must be a TrainStep"):
        fit(pair=carry_loss)
    with pytest.raises(ValueError, match="parallel must be a DataParallel"):
        fit(parallel="sharded")
    with pytest.raises(ValueError, match="num_steps"):
        fit(num_steps=2.5)
    with pytest.raises(ValueError, match=r"actions\[0\]"):
        fit(actions=[print])
    with pytest.raises(ValueError, match="contradict"):
        fit(policy=training.RunPolicy(resume=True, overwrite=True))
    with pytest.raises(ValueError, match="needs checkpoints"):
        fit(policy=training.RunPolicy(resume=True))
    checkpoints = training.Checkpoints(tmp_path / "ckpt")
    with pytest.raises(ValueError, match=r"actions\[0\]"):  # refused before any file is claimed
        fit(actions=[print], checkpoints=checkpoints)
    checkpoints.close()
    assert os.listdir(tmp_path / "ckpt") == []
    with pytest.raises(ValueError, match="Evaluate needs every_steps"):  # an endless stream
        fit(actions=[training.Evaluate(lambda p, b: {}, {"x": np.zeros(4)})])


_TWO_DEVICES = r"""
import json, os, sys, tempfile
import jax, jax.numpy as jnp, numpy as np, optax
from deqjax import training
from deqjax._src.training.checkpoint import tree_digest
from tests.helpers.train_worker import CountingBatches, carry_loss, toy_fit

d = tempfile.mkdtemp()
def fit(n, **kw):
    return toy_fit(CountingBatches(), n, loss=carry_loss, params={"w": jnp.zeros(2, jnp.float32)},
                   carry=jnp.zeros((), jnp.float32), skip=False, **kw)
full = fit(6)
fit(4, workdir=os.path.join(d, "ck"), checkpoint_every=2)
resumed = fit(6, workdir=os.path.join(d, "ck"), resume=True)
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
    # Saves are asynchronous: the kill may land while the newest one is still being written, which
    # is then lost (never half-read). The resume restores the newest committed step, at most one
    # checkpoint interval behind the kill.
    with training.Checkpoints(work / "ckpt") as checkpoints:
        committed = checkpoints.all_steps()
    newest_due = max(a["step"], 3 * (kill_at // 3))
    assert committed and max(committed) in {newest_due, max(a["step"], newest_due - 3)}, committed
    # 3) Resume to the end, then a fresh uninterrupted reference run in the same process.
    run_worker(["fit", tmp_path / "c.json", *common, "--resume", "--reference_dir", ref])
    c = json.loads((tmp_path / "c.json").read_text())
    assert c["restored_step"] == max(committed)
    assert c["step"] == 12 and c["digest"] == c["reference_digest"]  # bit-identical state
    resumed = [(r["step"], r["loss"]) for r in training.read_jsonl(metrics)]
    reference = [(r["step"], r["loss"]) for r in training.read_jsonl(ref / "metrics.jsonl")]
    assert resumed == reference and len(reference) == 12  # exact float equality


# --- non-finite updates, existing runs, append-only metrics --------------------------------------


def _toy_fit(tmp_path, loss_fn, *, max_nonfinite_steps=10, num_steps=8, skip=True, **kwargs):
    with jax.numpy_dtype_promotion("standard"):
        return toy_fit(
            data.ShuffledBatches(data.load_digits(split="train"), batch_size=8, seed=0),
            num_steps,
            loss=loss_fn,
            actions=[
                training.LogMetrics(every_steps=1),
                training.GuardNonFinite(max_nonfinite_steps, every_steps=1),
            ],
            workdir=tmp_path,
            checkpoint_every=1,
            keep=2,
            skip=skip,
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
    ckpt = training.Checkpoints(tmp_path / "ckpt")
    assert all(all_finite(ckpt.restore(template=result.state).state) for _ in [0])
    ckpt.close()


def test_nonfinite_streak_stops_the_run_with_finite_checkpoints(tmp_path):
    with pytest.raises(training.NonFiniteError, match="non-finite for the last 3 steps"):
        _toy_fit(tmp_path, _nan_at(list(range(3, 100))), max_nonfinite_steps=3, num_steps=20)
    ckpt = training.Checkpoints(tmp_path / "ckpt")
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
    ckpt = training.Checkpoints(tmp_path / "ckpt")
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
    ckpt = training.Checkpoints(tmp_path / "ckpt")
    assert ckpt.all_steps() == [1, 2]
    ckpt.close()


def test_an_all_nan_run_stops_without_skip_nonfinite(tmp_path):
    """The guard reads the loss itself when the optimizer does not count skipped updates."""
    with pytest.raises(training.NonFiniteError, match="non-finite for the last 3 steps"):
        _toy_fit(tmp_path, _nan_at(list(range(100))), max_nonfinite_steps=3, skip=False)
    ckpt = training.Checkpoints(tmp_path / "ckpt")
    assert ckpt.all_steps() == [1, 2]  # the streak reached 3 at step 3: stopped before saving
    ckpt.close()


# --- a finished run resumed ----------------------------------------------------------------------


def test_a_finished_run_resumed_does_nothing_and_compiles_nothing(tmp_path, monkeypatch):
    from deqjax._src.training import warm_up

    def run(**kwargs):
        test = data.load_digits(split="test")
        actions = [
            training.LogMetrics(every_steps=1),
            training.RunDiagnostics(lambda p, b, k, r: {"n": optax.tree.norm(p)}, every_steps=1),
            training.Evaluate(toy.eval_fn, test, every_steps=1),
        ]
        batches = data.ShuffledBatches(data.load_digits(split="train"), batch_size=64, seed=0)
        with jax.numpy_dtype_promotion("standard"):  # Haiku's initializers mix dtypes
            return toy_fit(batches, 2, actions=actions, workdir=tmp_path, **kwargs)

    first = run()
    jobs = []
    real = warm_up.compile_in_background
    monkeypatch.setattr(warm_up, "compile_in_background", lambda js: jobs.extend(js) or real(js))
    lines = []
    again = run(resume=True, say=lines.append)
    assert jobs == [] and again.history == [] and again.restored_step == 2
    assert lines[-1] == "[train] step 2 of 2: nothing left to do"
    assert tree_digest(again.state) == tree_digest(first.state)
    records = training.read_jsonl(tmp_path / "metrics.jsonl", raw=True)
    assert [r["step"] for r in records] == [1, 1, 1, 2, 2, 2]  # nothing written again


_RESUME_FINISHED = r"""
import sys
import jax.numpy as jnp
from deqjax import data, training
from tests.helpers import train_worker as toy

def slow_to_compile(params, batch, key, reg_state):  # a long program: compiles for seconds
    x = jnp.asarray(batch["image"], jnp.float32).reshape(batch["image"].shape[0], -1)
    for i in range(400):
        x = jnp.tanh(x * 1.01 + jnp.sin(x) * (i % 7))
    return {"n": jnp.mean(x)}

actions = [training.RunDiagnostics(slow_to_compile, every_steps=1),
           training.Evaluate(toy.eval_fn, data.load_digits(split="test"), every_steps=1)]
batches = data.ShuffledBatches(data.load_digits(split="train"), batch_size=64, seed=0)
result = toy.toy_fit(batches, 2, actions=actions, workdir=sys.argv[1], resume=sys.argv[2] == "1")
print("steps", len(result.history))
"""


@pytest.mark.slow  # two fresh JAX processes (~30 s)
def test_a_finished_run_resumed_in_a_process_of_its_own_exits_cleanly(tmp_path):
    """A scheduler relaunching a finished job: the process exits 0 (it used to abort, exit 134,
    while background compilations were still inside XLA at the interpreter's exit)."""
    runs = []
    for resume in ("0", "1"):
        runs.append(
            subprocess.run(
                [sys.executable, "-c", _RESUME_FINISHED, str(tmp_path), resume],
                cwd=toy.REPO_ROOT,
                env=worker_env(),
                capture_output=True,
                text=True,
                timeout=300,
            )
        )
        assert runs[-1].returncode == 0, runs[-1].stderr[-3000:]
    assert runs[0].stdout.split()[-1] == "4" and runs[1].stdout.split()[-1] == "0"
