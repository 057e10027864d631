"""What a run is handed: the files and resume policy of its named trainings, their summaries."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import optax

from deqjax import data, harness, training


def _ctx(tmp_path, resume=False):
    return harness.RunContext(str(tmp_path), {"seed": 0}, resume, False, False)


def test_trainings_are_named_and_resume_only_what_started(tmp_path):
    ctx = _ctx(tmp_path, resume=True)
    assert ctx.checkpoint_dir() == str((tmp_path / "ckpt").resolve()) and ctx.policy().resume
    assert ctx.metrics_path() == str(tmp_path / "metrics.jsonl")
    assert ctx.checkpoint_dir("gamma0").endswith("ckpt_gamma0")
    assert ctx.metrics_path("gamma0") == str(tmp_path / "metrics_gamma0.jsonl")
    assert not ctx.policy("gamma0").resume  # never started
    (tmp_path / "ckpt_gamma0" / "3").mkdir(parents=True)
    assert ctx.policy("gamma0") == training.RunPolicy(resume=True, overwrite=False)
    assert not _ctx(tmp_path).policy("gamma0").resume
    assert ctx.policy("seed0", checkpoint_dir=str(tmp_path / "ckpt/seed0")).resume is False
    (tmp_path / "ckpt_gamma1").mkdir()
    assert not ctx.policy("gamma1").resume  # an empty folder holds nothing
    over = harness.RunContext(str(tmp_path), {}, False, True, False)
    assert over.policy("gamma0") == training.RunPolicy(resume=False, overwrite=True)


def test_write_text_json_and_train_records(tmp_path):
    ctx = _ctx(tmp_path)
    assert open(ctx.write_text("t.md", "hi\n")).read() == "hi\n"
    assert json.load(open(ctx.write_json("r.json", {"a": 1}))) == {"a": 1}
    lines = [{"split": "train", "step": 1, "nll": 2.0}, {"split": "eval", "step": 1}]
    lines += [{"split": "train", "step": 2, "nll": 1.0}]
    (tmp_path / "metrics_m.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    assert [r["step"] for r in ctx.train_records("m")] == [1, 2]
    assert ctx.train_history("m", ("nll",)) == {"nll": [2.0, 1.0]}


def test_a_named_training_through_fit_is_summarised(tmp_path):
    def loss_fn(params, batch, key, reg_state, step):
        loss = jnp.mean((batch["x"] * params["w"] - 1.0) ** 2)
        return loss, {"mse": loss}

    ctx = _ctx(tmp_path)
    run = harness.ResumableRunConfig(progress=False)
    pair = training.train_step(loss_fn, optax.sgd(0.1))
    result = training.fit(
        pair,
        pair.init({"w": jnp.zeros((), jnp.float32)}, jax.random.PRNGKey(0)),
        data.ShuffledBatches({"x": np.ones((8,), np.float32)}, batch_size=4, seed=0),
        num_steps=20,
        parallel=training.data_parallel("sharded"),
        actions=run.actions(log_every=1),
        checkpoints=training.Checkpoints(ctx.checkpoint_dir("toy")),
        policy=ctx.policy("toy"),
        writers=run.writers(ctx, "toy"),
        say=None,
    )
    trained = ctx.trained("toy", result, history=("mse",), batch_size=4, seconds=1.5)
    assert trained.result is result and trained.seconds == 1.5
    assert len(trained.history["mse"]) == 20 and trained.num_params == 1
    assert trained.tail("mse") == np.mean(trained.history["mse"][-2:])  # the last tenth
    assert trained.history["mse"][-1] < 0.1 * trained.history["mse"][0]
    assert trained.step_seconds > 0
    assert (tmp_path / "metrics_toy.jsonl").exists() and (tmp_path / "ckpt_toy").is_dir()
    assert training.read_tensorboard(tmp_path / "tensorboard" / "toy")["train/mse"][-1][0] == 20


def test_run_until_interrupted_stops_after_a_sigterm():
    seen = []

    def train(item):
        seen.append(item)
        return {"interrupted": item == 2}

    assert harness.run_until_interrupted([1, 2, 3], train) == [
        {"interrupted": False},
        {"interrupted": True},
    ]
    assert seen == [1, 2]
