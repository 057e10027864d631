"""Checkpoints: round trip of a TrainState, keep-last-K, corrupt and partial checkpoints skipped."""

import os
import subprocess
import sys
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from deqjax import training
from deqjax._src.training.train_state import create_train_state


def _state(seed: int) -> training.TrainState:
    rng = np.random.default_rng(seed)
    params = {
        "w": jnp.asarray(rng.normal(size=(5, 3)), jnp.float32),
        "b": jnp.asarray(rng.normal(size=(3,)), jnp.float64),
    }
    opt = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(1e-3))
    state = create_train_state(
        params,
        opt,
        jax.random.PRNGKey(seed),
        reg_state={
            "gamma": jnp.asarray(1.5 + seed, jnp.float32),
            "n": jnp.asarray(seed, jnp.int32),
        },
    )
    return state._replace(step=jnp.asarray(seed, jnp.int32))


def _assert_equal(a, b):
    assert jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b)
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        assert np.asarray(x).dtype == np.asarray(y).dtype
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_round_trip_and_keep_last(tmp_path):
    with training.Checkpointer(tmp_path, max_to_keep=2) as ckpt:
        assert ckpt.restore(template=_state(0)) is None  # nothing saved yet
        for step in (1, 2, 3):
            ckpt.save(step, _state(step), {"data": {"epoch": step, "index": 4}})
        assert ckpt.all_steps() == [2, 3]
        restored = ckpt.restore(template=_state(0))
        assert restored.step == 3
        assert restored.meta == {"data": {"epoch": 3, "index": 4}}
        assert isinstance(restored.state, training.TrainState)
        _assert_equal(restored.state, jax.device_get(_state(3)))
        _assert_equal(ckpt.restore(template=_state(0), step=2).state, jax.device_get(_state(2)))


def _truncate_state_files(step_dir):
    count = 0
    for root, _, files in os.walk(os.path.join(step_dir, "state")):
        for name in files:
            path = os.path.join(root, name)
            if os.sep + "d" + os.sep in path + os.sep and os.path.getsize(path) > 8:
                with open(path, "r+b") as f:
                    f.truncate(os.path.getsize(path) // 2)
                count += 1
    assert count > 0, "found no data files to truncate"


def test_truncated_latest_is_skipped_with_warning(tmp_path, capfd):
    ckpt = training.Checkpointer(tmp_path, max_to_keep=3)
    ckpt.save(4, _state(4), {"data": {"epoch": 0, "index": 4}})
    ckpt.save(8, _state(8), {"data": {"epoch": 0, "index": 8}})
    _truncate_state_files(ckpt.path(8))
    with pytest.warns(UserWarning, match=f"skipping corrupt checkpoint {ckpt.path(8)}: file"):
        restored = ckpt.restore(template=_state(0))
    assert restored.step == 4
    _assert_equal(restored.state, jax.device_get(_state(4)))
    # The bad checkpoint is moved aside, so step 8 can be saved again and read back.
    assert os.path.isdir(ckpt.path(8) + ".corrupt") and ckpt.all_steps() == [4]
    ckpt.save(8, _state(8), {"data": {"epoch": 0, "index": 8}})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert ckpt.restore(template=_state(0)).step == 8
    ckpt.close()
    # the manifest caught the truncation before orbax read a byte: no asyncio tracebacks
    assert "Event loop is closed" not in capfd.readouterr().err


def test_nothing_restorable_raises_and_renames_nothing(tmp_path, capfd):
    ckpt = training.Checkpointer(tmp_path)
    ckpt.save(1, _state(1))
    ckpt.save(2, _state(2))
    for step in (1, 2):
        _truncate_state_files(ckpt.path(step))
    with pytest.raises(training.RestoreError, match="(?s)2: corrupt: file.*1: corrupt: file"):
        ckpt.restore(template=_state(0))
    assert sorted(os.listdir(tmp_path)) == ["1", "2"]  # nothing renamed or deleted
    assert "Event loop is closed" not in capfd.readouterr().err
    ckpt.close()


def test_silently_corrupted_values_fail_the_digest(tmp_path):
    ckpt = training.Checkpointer(tmp_path)
    ckpt.save(1, _state(1))
    ckpt.save(2, _state(2))
    ckpt.close()
    # Rewrite step 2's metadata digest and drop its manifest: simulates bytes that changed
    # without breaking the format, in a checkpoint written before manifests existed.
    meta_path = os.path.join(tmp_path, "2", "meta", "metadata")
    text = open(meta_path).read()
    open(meta_path, "w").write(text.replace('"__digest__": "', '"__digest__": "0'))
    os.remove(os.path.join(tmp_path, "2", "deqjax_manifest.json"))
    ckpt = training.Checkpointer(tmp_path)
    with pytest.warns(UserWarning, match="digest mismatch"):
        assert ckpt.restore(template=_state(0)).step == 1


def test_partial_and_incompatible_checkpoints(tmp_path):
    ckpt = training.Checkpointer(tmp_path)
    ckpt.save(3, _state(3))
    ckpt.close()
    # A save killed half-way leaves only orbax's temporary folder: it is never listed.
    os.makedirs(os.path.join(tmp_path, "9.orbax-checkpoint-tmp-123", "state"))
    ckpt = training.Checkpointer(tmp_path)
    assert ckpt.all_steps() == [3]
    # A template of another model: an error naming the mismatch; the valid checkpoint stays.
    other = _state(0)._replace(params={"w": jnp.zeros((2, 2), jnp.float32)})
    other = other._replace(opt_state=optax.adam(1e-3).init(other.params))
    with pytest.raises(training.RestoreError, match="3: incompatible: its tree structure"):
        ckpt.restore(template=other)
    wider = _state(0)._replace(params={"w": jnp.zeros((5, 4), jnp.float32), "b": jnp.zeros(3)})
    wider = wider._replace(opt_state=_state(0).opt_state)
    with pytest.raises(training.RestoreError, match=r"incompatible: leaf \d+ is <f4\[5, 3\]"):
        ckpt.restore(template=wider)
    assert os.path.isdir(ckpt.path(3)) and ckpt.all_steps() == [3]
    assert ckpt.restore(template=_state(0)).step == 3
    with pytest.raises(ValueError, match="max_to_keep"):
        training.Checkpointer(tmp_path / "x", max_to_keep=0)


_FULL_DISK = """
import resource, signal, sys
import numpy as np
from deqjax import training
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past the limit fail with EFBIG instead
ckpt = training.Checkpointer(sys.argv[1])
ckpt.save(1, {"w": np.ones(4, np.float32)})
resource.setrlimit(resource.RLIMIT_FSIZE, (20000, 20000))  # a disk that fills up mid-save
try:
    ckpt.save(2, {"w": np.random.default_rng(0).normal(size=100000).astype(np.float32)})
except training.CheckpointError as e:
    print("CheckpointError:", e)
"""


def test_failed_save_leaves_no_temporary_folder(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-c", _FULL_DISK, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, JAX_PLATFORMS="cpu"),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"could not write checkpoint {tmp_path / '2'}" in proc.stdout, proc.stdout
    assert sorted(os.listdir(tmp_path)) == ["1"]  # no 2.orbax-checkpoint-tmp* left behind
