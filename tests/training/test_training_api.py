"""The training API's extension points: any BatchIterator, a carried recurrent state, the
optax-style train-step pair, config serialisation, and the experiment runner."""

from __future__ import annotations

import dataclasses
import functools
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from deqjax import data, training

B = 4


class CountingBatches:
    """An endless, non-epoch BatchIterator: batch ``i`` is ``{"x": i + arange(B) / B}``."""

    def __init__(self):
        self.i = 0

    @property
    def state(self):
        return {"i": self.i}

    def restore(self, state):
        self.i = int(state["i"])

    def __next__(self):
        x = (self.i + np.arange(B) / B).astype(np.float32)
        self.i += 1
        return {"x": x}


def carry_loss(params, batch, key, reg_state, step, carry):
    """A loss that reads the carry; the next carry is a decayed running mean of the batches."""
    target = jnp.mean(batch["x"]) + 0.1 * carry
    loss = jnp.sum((params["w"] - target) ** 2)
    return loss, {"carry": carry}, 0.5 * carry + jnp.mean(batch["x"])


def _fit(tmp_path, num_steps, *, resume=False, checkpoint_every=None, name="run"):
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
    full = _fit(tmp_path, 6, name="full")
    # the carry follows the data: c_{k+1} = c_k / 2 + mean(batch k), one copy per device
    c = 0.0
    for i in range(6):
        assert full.history[i]["carry"] == pytest.approx(c, rel=1e-6)
        c = 0.5 * c + i + (B - 1) / (2 * B)
    assert np.asarray(full.state.carry).shape == (1,)
    np.testing.assert_allclose(full.state.carry, [c], rtol=1e-6)
    assert full.data_state == {"i": 6} and "epoch" not in full.history[0]
    # stop after 4 steps, resume to 6: the same state, carry included, bit for bit
    _fit(tmp_path, 4, checkpoint_every=2, name="part")
    resumed = _fit(tmp_path, 6, resume=True, name="part")
    assert resumed.restored_step == 4
    assert training.tree_digest(resumed.state) == training.tree_digest(full.state)


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


def test_train_step_pair_under_jit_matches_the_pmapped_step():
    def loss_fn(params, batch, key, reg_state, step):
        return jnp.mean((batch["x"] @ params["w"] - 1.0) ** 2), {"w_max": jnp.max(params["w"])}

    opt = optax.sgd(0.1, momentum=0.9)
    pair = training.train_step(loss_fn, opt, axis_name=None)
    state = pair.init({"w": jnp.ones((3,), jnp.float32)}, jax.random.PRNGKey(1))
    batch = {"x": np.arange(12, dtype=np.float32).reshape(4, 3)}
    new, metrics = jax.jit(pair.update)(state, batch)
    step = training.make_train_step(loss_fn, opt, donate=False)
    state_r = training.replicate(state)
    new_r, metrics_r = step(state_r, training.shard(batch))
    np.testing.assert_allclose(new.params["w"], training.unreplicate(new_r).params["w"], rtol=1e-6)
    assert int(new.step) == 1 and set(metrics) == {"loss", "w_max", "grad_norm"}
    assert float(metrics["loss"]) == pytest.approx(float(training.unreplicate(metrics_r)["loss"]))


@dataclasses.dataclass(frozen=True)
class _Solver:
    max_steps: int = 20
    tol: float = 1e-3


def _f(x, *, a):
    return x


def test_to_python_writes_configuration_objects_field_by_field():
    out = training.to_python(
        {"solver": _Solver(), "partial": functools.partial(_f, a=2), "fn": _f, "arr": np.ones(2)}
    )
    assert out == {
        "solver": {"type": "_Solver", "max_steps": 20, "tol": 1e-3},
        "partial": {"function": "_f", "a": 2},
        "fn": "_f",
        "arr": [1.0, 1.0],
    }
    json.dumps(out)


# --- the runner --------------------------------------------------------------------------------


def _add_flags(p):
    p.add_argument("--steps", type=training.positive_int, default=10)
    p.add_argument("--sweep", action="store_true")


def _setup(args):
    if args.steps == 7:
        raise training.UsageError("--steps: 7 is unlucky")
    return {"n": args.steps}, {"solver": _Solver(tol=0.5)}


def _run_task(args, inputs, ctx):
    if args.steps == 13:
        raise training.NonFiniteError("diverged")
    return {"n": inputs["n"], "mode": ctx.mode, "out": ctx.out_dir, "interrupted": args.steps == 9}


TOY = training.Experiment(
    name="toy",
    doc="A toy experiment.",
    add_flags=_add_flags,
    setup=_setup,
    run=_run_task,
    smoke={"steps": 2},
    modes={"sweep": {"steps": 3}},
    safe_on_resume=("steps",),
)


def _exit(argv):
    with pytest.raises(SystemExit) as e:
        training.run(TOY, argv)
    return e.value.code


def test_runner_flags_config_results_and_exit_codes(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = training.run(TOY, ["--smoke"])  # smoke default out_dir and steps
    assert res["n"] == 2 and res["out"] == "runs/toy_smoke"
    config = json.load(open("runs/toy_smoke/config.json"))
    assert config["solver"] == {"type": "_Solver", "max_steps": 20, "tol": 0.5}
    assert config["seed"] == 0 and config["smoke"] is True
    assert json.load(open("runs/toy_smoke/results.json"))["n"] == 2
    res = training.run(TOY, ["--sweep", "--smoke", "--steps", "5"])  # explicit flags win
    assert res["n"] == 5 and res["mode"] == "sweep"
    assert os.path.exists("runs/toy_sweep_smoke/sweep_config.json")
    assert os.path.exists("runs/toy_sweep_smoke/sweep.json")
    assert _exit(["--smoke"]) == 2  # the folder holds a run
    assert "holds an earlier run" in capsys.readouterr().err
    assert _exit(["--smoke", "--resume", "--steps", "4"]) == 2  # a safe change needs --force
    assert training.run(TOY, ["--smoke", "--resume", "--force", "--steps", "4"])["n"] == 4
    assert _exit(["--steps", "7", "--out_dir", "a"]) == 2
    assert "unlucky" in capsys.readouterr().err and not os.path.exists("a")
    assert _exit(["--steps", "13", "--out_dir", "b"]) == 3
    assert _exit(["--steps", "9", "--out_dir", "c"]) == 143
    assert _exit(["--steps", "0"]) == 2
    assert "--steps" in capsys.readouterr().err


_TWO_DEVICES = r"""
import json, os, sys, tempfile
import jax, jax.numpy as jnp, numpy as np, optax
from deqjax import training
from test_training_api import CountingBatches, carry_loss

d = tempfile.mkdtemp()
def fit(n, **kw):
    return training.fit(params={"w": jnp.zeros((2,), jnp.float32)}, loss_fn=carry_loss,
                        optimizer=optax.sgd(0.1), train_data=CountingBatches(), num_steps=n,
                        rng=jax.random.PRNGKey(0), carry=jnp.zeros((), jnp.float32),
                        progress=False, print_fn=None, **kw)
full = fit(6)
fit(4, checkpoint_dir=os.path.join(d, "ck"), checkpoint_every=2)
resumed = fit(6, checkpoint_dir=os.path.join(d, "ck"), resume=True)
same = training.tree_digest(resumed.state) == training.tree_digest(full.state)
print(json.dumps({"n": jax.device_count(), "carry": np.asarray(full.state.carry).tolist(),
                  "same": same}))
"""


@pytest.mark.slow  # a fresh JAX process with two CPU devices (~30 s)
def test_each_device_keeps_its_own_carry_and_resumes_it():
    import subprocess
    import sys

    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2")
    env.pop("JAX_ENABLE_X64", None)
    here = os.path.dirname(os.path.abspath(__file__))
    proc = subprocess.run(
        [sys.executable, "-c", _TWO_DEVICES],
        cwd=here,
        env=env,
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
