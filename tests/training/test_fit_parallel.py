"""fit over 4 devices (fake CPU devices, in a subprocess): ``parallel="sharded"`` (jit + shard_map)
and ``parallel="pmap"`` log the losses, evaluations and diagnostics of one device; a sharded run
stopped and resumed is bit-identical to the uninterrupted one; so is each mode's run with its data
on the devices (``ResidentBatches``); each device's carry is the same in both modes."""

import json
import subprocess
import sys

import numpy as np
import pytest

from tests.helpers import train_worker as toy

_FOUR_DEVICES = r"""
import json, os, tempfile
import jax, jax.numpy as jnp, numpy as np, optax
from deqjax import data, training
from deqjax._src.training.checkpoint import tree_digest
from tests.helpers import train_worker as toy

train, test = data.load_digits(split="train"), data.load_digits(split="test")
work = tempfile.mkdtemp()

def diagnostics(params, batch, key, reg_state):
    return {"w_norm": optax.tree.norm(params), "image_total": jnp.sum(batch["image"])}

def fit(parallel, num_steps=8, devices=None, device_resident=False, workdir=None, resume=False):
    opt, schedule = toy.make_optimizer(total_steps=8)
    parallel = training.data_parallel(parallel, devices)
    batches = data.ShuffledBatches(train, batch_size=64, seed=3)
    if device_resident:
        batches = training.ResidentBatches(batches, parallel)
    actions = [
        training.LogMetrics(every_steps=1),
        training.RunDiagnostics(diagnostics, every_steps=4),
        training.Evaluate(toy.eval_fn, test, every_steps=4, resident=device_resident),
    ]
    result = toy.toy_fit(
        batches, num_steps, loss=toy.noiseless_loss, optimizer=opt, learning_rate_fn=schedule,
        per_device_rng=False, reg_state=toy.init_reg_state(), update_reg_state=toy.count_steps,
        actions=actions, parallel=parallel, workdir=workdir, checkpoint_every=5, resume=resume)
    return {
        "losses": [r["loss"] for r in result.history if r["split"] == "train"],
        "loss_max": [r["loss_max"] for r in result.history if r["split"] == "train"],
        "eval": [r for r in result.history if r["split"] == "eval"],
        "diagnostics": [r for r in result.history if r["split"] == "diagnostics"],
        "reg_count": int(result.state.reg_state["count"]),
        "digest": tree_digest(result.state),
    }

out = {"n": jax.device_count()}
out["one"] = fit("sharded", devices=jax.devices()[:1])
out["sharded"] = fit("sharded")
out["pmap"] = fit("pmap")
fit("sharded", num_steps=5, workdir=work)
resumed = fit("sharded", workdir=work, resume=True)
out["resumed_digest"] = resumed["digest"]
metrics = os.path.join(work, "metrics.jsonl")
out["resumed_losses"] = [r["loss"] for r in training.read_jsonl(metrics) if r["split"] == "train"]
# The training and test sets on the devices: the same runs, and a resident run resumed.
out["resident"] = {mode: fit(mode, device_resident=True) for mode in ("sharded", "pmap")}
resident_dir = os.path.join(work, "resident")
fit("pmap", num_steps=5, workdir=resident_dir, device_resident=True)
out["resident_resumed"] = fit("pmap", workdir=resident_dir, resume=True, device_resident=True)

def carry_fit(parallel):
    result = toy.toy_fit(
        toy.CountingBatches(), 5, loss=toy.carry_loss, params={"w": jnp.zeros((2,), jnp.float32)},
        carry=jnp.zeros((), jnp.float32), skip=False, parallel=parallel,
        actions=[training.LogMetrics(every_steps=1)])
    return np.asarray(result.state.carry).tolist(), tree_digest(result.state)

out["carry"] = {mode: carry_fit(mode) for mode in ("sharded", "pmap")}
print(json.dumps(out))
"""


@pytest.mark.slow  # a fresh JAX process with four CPU devices (~1 min)
def test_sharded_and_pmap_on_four_devices_match_one_device_and_resume_exactly():
    proc = subprocess.run(
        [sys.executable, "-c", _FOUR_DEVICES],
        cwd=toy.REPO_ROOT,
        env=toy.worker_env(4),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["n"] == 4
    one, sharded, pmap = out["one"], out["sharded"], out["pmap"]
    assert len(one["losses"]) == 8 and one["reg_count"] == sharded["reg_count"] == 8
    for run in (sharded, pmap):  # the same numbers as one device, to rounding
        np.testing.assert_allclose(run["losses"], one["losses"], rtol=2e-5)
        np.testing.assert_allclose(run["loss_max"], one["loss_max"], rtol=2e-5)
        assert [e["step"] for e in run["eval"]] == [4, 8]
        for got, want in zip(run["eval"], one["eval"]):
            assert got["count"] == want["count"] == 449
            np.testing.assert_allclose(got["loss"], want["loss"], rtol=2e-5)
            assert got["accuracy"] == pytest.approx(want["accuracy"], abs=1.5 / 449)
        for got, want in zip(run["diagnostics"], one["diagnostics"], strict=True):
            np.testing.assert_allclose(got["w_norm"], want["w_norm"], rtol=2e-5)
    np.testing.assert_allclose(pmap["losses"], sharded["losses"], rtol=1e-6)
    # the per-device diagnostics are averaged over the devices: a quarter of the batch each
    np.testing.assert_allclose(
        [d["image_total"] for d in sharded["diagnostics"]],
        [d["image_total"] / 4 for d in one["diagnostics"]],
        rtol=1e-6,
    )
    # stopped at step 5 and resumed: the uninterrupted sharded run, bit for bit
    assert out["resumed_digest"] == sharded["digest"]
    assert out["resumed_losses"] == sharded["losses"]
    # data on the devices: each mode's run bit for bit, also when stopped and resumed
    for mode, run in (("sharded", sharded), ("pmap", pmap)):
        assert out["resident"][mode] == run
    assert out["resident_resumed"]["digest"] == pmap["digest"]
    # each device keeps its own carry (its quarter of every batch), alike in both modes
    (carry_s, digest_s), (carry_p, digest_p) = out["carry"]["sharded"], out["carry"]["pmap"]
    assert len(carry_s) == 4 and len(set(carry_s)) == 4
    assert carry_s == carry_p and digest_s == digest_p
