"""Training: optimizer/schedules, metrics files, distributed config, and end-to-end runs.

Checks that need their own JAX process (a fake device count, two processes joined by
jax.distributed, runs killed and resumed) run ``tests/helpers/train_worker.py`` in a subprocess.
"""

import json
import os
import random
import signal
import socket
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from deqjax import data, training
from experiments import plot_metrics
from tests.helpers import train_worker as toy

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(os.path.dirname(HERE), "helpers", "train_worker.py")


def _env(num_devices: int = 1) -> dict:
    env = dict(os.environ)
    env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={num_devices}"
    env.pop("JAX_ENABLE_X64", None)
    return env


def _worker(args, *, num_devices=1, timeout=240, check=True):
    proc = subprocess.run(
        [sys.executable, WORKER, *map(str, args)],
        env=_env(num_devices),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"worker {args} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return proc


# --- optimizer and schedules -------------------------------------------------------------------


def test_schedules():
    cosine = training.make_schedule(
        learning_rate=1.0, schedule="cosine", warmup_steps=10, total_steps=110, end_factor=0.1
    )
    np.testing.assert_allclose(
        [cosine(0), cosine(5), cosine(10), cosine(60), cosine(110)],
        [0.0, 0.5, 1.0, 0.55, 0.1],
        rtol=1e-6,
        atol=1e-7,
    )
    linear = training.make_schedule(learning_rate=2.0, schedule="linear", total_steps=100)
    np.testing.assert_allclose([linear(0), linear(50), linear(100)], [2.0, 1.0, 0.0], atol=1e-6)
    constant = training.make_schedule(learning_rate=0.3, warmup_steps=3)
    np.testing.assert_allclose([constant(0), constant(3), constant(1000)], [0.0, 0.3, 0.3])
    for kwargs, name in [
        ({"learning_rate": 0.0}, "learning_rate"),
        ({"learning_rate": 1.0, "schedule": "step"}, "schedule"),
        ({"learning_rate": 1.0, "schedule": "cosine"}, "total_steps"),
        ({"learning_rate": 1.0, "warmup_steps": -1}, "warmup_steps"),
        ({"learning_rate": 1.0, "end_factor": 2.0}, "end_factor"),
    ]:
        with pytest.raises(ValueError, match=name):
            training.make_schedule(**kwargs)


def test_optimizer_clipping_and_errors():
    opt = training.make_optimizer(learning_rate=1.0, optimizer="sgd", momentum=0.0, clip_norm=2.0)
    params = {"a": jnp.zeros(3, jnp.float32), "b": jnp.zeros(4, jnp.float32)}
    grads = {"a": jnp.full(3, 100.0, jnp.float32), "b": jnp.full(4, -50.0, jnp.float32)}
    updates, _ = opt.update(grads, opt.init(params), params)
    np.testing.assert_allclose(optax.tree.norm(updates), 2.0, rtol=1e-6)
    for kwargs, name in [
        ({"optimizer": "lamb"}, "optimizer"),
        ({"clip_norm": 0.0}, "clip_norm"),
        ({"weight_decay": 0.1}, "weight_decay"),
        ({"optimizer": "sgd", "momentum": 1.0}, "momentum"),
    ]:
        with pytest.raises(ValueError, match=name):
            training.make_optimizer(learning_rate=0.1, **kwargs)


# --- metrics files, distributed config ---------------------------------------------------------


def test_metrics_writer_is_append_only_across_resumes(tmp_path):
    path = tmp_path / "run" / "metrics.jsonl"
    with training.MetricsWriter(path) as w:
        for step in range(1, 6):
            w.write({"step": step, "loss": np.float32(1.0 / step), "bad": float("nan")})
    with open(path, "a") as f:
        f.write('{"step": 6, "lo')  # a line torn by a kill
    records = training.read_jsonl(path)
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5]
    assert np.isnan(records[0]["bad"]) and records[1]["loss"] == pytest.approx(0.5)
    before = path.read_bytes()
    with training.MetricsWriter(path, keep_until_step=3) as w:  # resumed from step 3
        w.write({"step": 4, "loss": 9.0})
    assert path.read_bytes().startswith(before)  # nothing rewritten
    assert [(r["step"], r["loss"]) for r in training.read_jsonl(path)][2:] == [
        (3, float(np.float32(1 / 3))),
        (4, 9.0),
    ]
    assert [r["step"] for r in training.read_jsonl(path, raw=True)] == [1, 2, 3, 4, 5, 3, 4]
    with pytest.raises(FileExistsError, match="earlier run"):
        training.MetricsWriter(path)  # a fresh run never silently deletes another's metrics
    with training.MetricsWriter(path, overwrite=True):
        pass
    assert training.read_jsonl(path) == []


def test_format_value_prints_nonfinite_and_strings():
    fmt = training.format_value
    assert fmt(float("nan"), ".2e") == "nan" and fmt("nan", ".4f") == "nan"
    assert fmt("inf", ".2e") == "inf" and fmt(np.float32(0.5), ".2f") == "0.50"
    assert fmt(None) == "None" and fmt("n/a") == "n/a"


def test_distributed_config_from_flags_and_env():
    assert training.distributed_config(environ={}) is None
    env = {
        "DEQJAX_COORDINATOR_ADDRESS": "10.0.0.1:1234",
        "DEQJAX_NUM_PROCESSES": "4",
        "DEQJAX_PROCESS_ID": "2",
    }
    assert training.distributed_config(environ=env) == ("10.0.0.1:1234", 4, 2)
    assert training.distributed_config(process_id=3, environ=env).process_id == 3  # flag wins
    assert training.distributed_config("h:1", 1, 0, environ={}) is None  # one process
    with pytest.raises(ValueError, match="process_id"):
        training.distributed_config("h:1", 2, 2, environ={})
    with pytest.raises(ValueError, match="coordinator_address"):
        training.distributed_config(None, 2, 0, environ={})
    with pytest.raises(ValueError, match="host:port"):
        training.distributed_config("h", 2, 0, environ={})
    assert training.initialize_distributed(environ={}) is None  # single process: no-op


# --- end to end in this process (one device) ---------------------------------------------------


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
    names = training.plot_metrics(records, str(png), metrics=["loss", "accuracy", "nope"])
    assert names == ["loss", "accuracy"]


# --- subprocess checks -------------------------------------------------------------------------


def test_four_devices_match_one_device(tmp_path):
    out = tmp_path / "dp.json"
    _worker(["dp", out, "--num_steps", 8, "--batch_size", 64], num_devices=4)
    res = json.loads(out.read_text())
    one, four = res["one"], res["all"]
    assert one["num_devices"] == 1 and four["num_devices"] == 4
    np.testing.assert_allclose(four["losses"], one["losses"], rtol=1e-5)
    # loss_max is reduced with pmax: the max over the global batch, whatever the sharding.
    np.testing.assert_allclose(four["loss_max"], one["loss_max"], rtol=1e-5)
    np.testing.assert_allclose(four["params"], one["params"], rtol=1e-4, atol=1e-5)
    assert one["losses"][-1] < one["losses"][0]
    assert four["reg_state"]["count"] == 8
    np.testing.assert_allclose(four["reg_state"]["loss_sum"], sum(one["losses"]), rtol=1e-5)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_processes_agree(tmp_path):
    port = _free_port()
    procs = [
        subprocess.Popen(
            [sys.executable, WORKER, "dist", tmp_path / f"p{i}.json", "--workdir", tmp_path]
            + ["--port", str(port), "--process_id", str(i), "--num_processes", "2"]
            + ["--num_steps", "6", "--batch_size", "64"],
            env=_env(1),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    try:
        for p in procs:
            _, err = p.communicate(timeout=240)
            assert p.returncode == 0, err[-4000:]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    r0, r1 = (json.loads((tmp_path / f"p{i}.json").read_text()) for i in range(2))
    assert (r0["process_count"], r0["device_count"], r0["local_batch_size"]) == (2, 2, 32)
    assert (r0["process_index"], r1["process_index"]) == (0, 1)
    assert r0["losses"] == r1["losses"] and r0["digest"] == r1["digest"]
    # Same global batches on one process alone give the same parameters.
    np.testing.assert_allclose(r0["params"], r0["ref_params"], rtol=1e-4, atol=1e-5)
    assert r0["eval"][-1]["count"] == 449 and r0["eval"] == r1["eval"]
    assert os.listdir(tmp_path / "ckpt") == ["6"]  # both processes wrote one checkpoint


@pytest.mark.slow
def test_sigterm_and_sigkill_then_resume_reproduce_the_run(tmp_path):
    work, ref = tmp_path / "run", tmp_path / "ref"
    common = ["--workdir", work, "--num_steps", 12, "--batch_size", 64, "--checkpoint_every", 3]
    # 1) SIGTERM mid-run: a checkpoint is saved at the current step, exit status 143.
    proc = subprocess.Popen(
        [sys.executable, WORKER, "fit", tmp_path / "a.json", *map(str, common)]
        + ["--step_delay_s", "0.5"],
        env=_env(),
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
    proc = _worker(
        ["fit", tmp_path / "b.json", *common, "--resume", "--kill_at_step", kill_at], check=False
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    # 3) Resume to the end, then a fresh uninterrupted reference run in the same process.
    _worker(["fit", tmp_path / "c.json", *common, "--resume", "--reference_dir", ref])
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
    assert all(training.all_finite(ckpt.restore(template=result.state).state) for _ in [0])
    ckpt.close()


def test_nonfinite_streak_stops_the_run_with_finite_checkpoints(tmp_path):
    with pytest.raises(training.NonFiniteError, match="non-finite for the last 3 steps"):
        _toy_fit(tmp_path, _nan_at(list(range(3, 100))), max_nonfinite_steps=3, num_steps=20)
    ckpt = training.Checkpointer(tmp_path / "ckpt")
    assert ckpt.all_steps() == [4, 5]  # the streak reached 3 at step 6: stopped before saving it
    restored = ckpt.restore(template=_toy_state())
    assert training.all_finite(restored.state)
    ckpt.close()


def _toy_state():
    opt = training.skip_nonfinite(optax.sgd(0.1))
    return training.create_train_state({"w": jnp.zeros(3, jnp.float32)}, opt, jax.random.PRNGKey(0))


def test_overflowing_update_is_never_checkpointed(tmp_path):
    def loss_fn(params, batch, key, reg_state, step):  # loss 0, gradient -3e38: w overflows
        w = params["w"]
        return -3e38 * jnp.sum(w - jax.lax.stop_gradient(w)), {}

    with pytest.raises(training.NonFiniteError, match="not checkpointed"):
        _toy_fit(tmp_path, loss_fn, optimizer=optax.sgd(1.0))
    ckpt = training.Checkpointer(tmp_path / "ckpt")
    assert ckpt.all_steps() == [1]  # rotation kept the last finite checkpoint
    assert training.all_finite(ckpt.restore(template=_toy_state()).state)
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
