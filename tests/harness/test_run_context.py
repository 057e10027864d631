"""What a run is handed: paths, ``fit`` keywords of named trainings, their summaries."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import optax

from deqjax import data, harness


def _ctx(tmp_path, resume=False):
    return harness.RunContext(str(tmp_path), {"seed": 0}, resume, False, False)


def test_fit_kwargs_name_their_training_and_resume_only_what_started(tmp_path):
    ctx = _ctx(tmp_path, resume=True)
    kw = ctx.fit_kwargs()
    assert kw["checkpoint_dir"] == str((tmp_path / "ckpt").resolve()) and kw["resume"]
    assert kw["metrics_path"] == str(tmp_path / "metrics.jsonl") and kw["config"] == {"seed": 0}
    kw = ctx.fit_kwargs("gamma0")
    assert kw["checkpoint_dir"].endswith("ckpt_gamma0") and not kw["resume"]  # never started
    (tmp_path / "ckpt_gamma0" / "3").mkdir(parents=True)
    assert ctx.fit_kwargs("gamma0")["resume"]
    assert not _ctx(tmp_path).fit_kwargs("gamma0")["resume"]
    assert ctx.fit_kwargs("seed0", checkpoint_dir=str(tmp_path / "ckpt/seed0"))["resume"] is False
    assert ctx.fit_kwargs("x", resume=True)["resume"]  # an explicit keyword wins


def test_write_text_json_and_train_records(tmp_path):
    ctx = _ctx(tmp_path)
    assert open(ctx.write_text("t.md", "hi\n")).read() == "hi\n"
    assert json.load(open(ctx.write_json("r.json", {"a": 1}))) == {"a": 1}
    lines = [{"split": "train", "step": 1, "nll": 2.0}, {"split": "eval", "step": 1}]
    lines += [{"split": "train", "step": 2, "nll": 1.0}]
    (tmp_path / "metrics_m.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    assert [r["step"] for r in ctx.train_records("m")] == [1, 2]
    assert ctx.train_history("m", ("nll",)) == {"nll": [2.0, 1.0]}


def test_fit_summarises_a_named_training(tmp_path):
    def loss_fn(params, batch, key, reg_state, step):
        loss = jnp.mean((batch["x"] * params["w"] - 1.0) ** 2)
        return loss, {"mse": loss}

    ctx = _ctx(tmp_path)
    trained = ctx.fit(
        "toy",
        history=("mse",),
        batch_size=4,
        params={"w": jnp.zeros((), jnp.float32)},
        loss_fn=loss_fn,
        optimizer=optax.sgd(0.1),
        train_data=data.ShuffledBatches({"x": np.ones((8,), np.float32)}, batch_size=4, seed=0),
        num_steps=20,
        rng=jax.random.PRNGKey(0),
        log_every=1,
    )
    assert len(trained.history["mse"]) == 20 and trained.num_params == 1
    assert trained.tail("mse") == np.mean(trained.history["mse"][-2:])  # the last tenth
    assert trained.history["mse"][-1] < 0.1 * trained.history["mse"][0]
    assert trained.step_seconds > 0 and trained.seconds > 0
    assert (tmp_path / "metrics_toy.jsonl").exists() and (tmp_path / "ckpt_toy").is_dir()


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
