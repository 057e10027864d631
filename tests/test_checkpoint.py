"""Checkpoints: round trip of a TrainState, keep-last-K, corrupt and partial checkpoints skipped."""

import os
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from deqjax import training


def _state(seed: int) -> training.TrainState:
    rng = np.random.default_rng(seed)
    params = {
        "w": jnp.asarray(rng.normal(size=(5, 3)), jnp.float32),
        "b": jnp.asarray(rng.normal(size=(3,)), jnp.float64),
    }
    opt = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(1e-3))
    state = training.create_train_state(
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


# orbax leaves an asyncio callback behind after a failed tensorstore read; it fires after the
# event loop closed ("Event loop is closed"), harmless and outside our code.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_truncated_latest_is_skipped_with_warning(tmp_path):
    ckpt = training.Checkpointer(tmp_path, max_to_keep=3)
    ckpt.save(4, _state(4), {"data": {"epoch": 0, "index": 4}})
    ckpt.save(8, _state(8), {"data": {"epoch": 0, "index": 8}})
    _truncate_state_files(ckpt.path(8))
    with pytest.warns(UserWarning, match=f"skipping unreadable checkpoint {ckpt.path(8)}"):
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


def test_silently_corrupted_values_fail_the_digest(tmp_path):
    ckpt = training.Checkpointer(tmp_path)
    ckpt.save(1, _state(1))
    ckpt.save(2, _state(2))
    ckpt.close()
    # Rewrite step 2's metadata digest: simulates bytes that changed without breaking the format.
    meta_path = os.path.join(tmp_path, "2", "meta", "metadata")
    text = open(meta_path).read()
    open(meta_path, "w").write(text.replace('"__digest__": "', '"__digest__": "0'))
    ckpt = training.Checkpointer(tmp_path)
    with pytest.warns(UserWarning, match="digest mismatch"):
        assert ckpt.restore(template=_state(0)).step == 1


def test_partial_and_mismatched_checkpoints(tmp_path):
    ckpt = training.Checkpointer(tmp_path)
    ckpt.save(3, _state(3))
    ckpt.close()
    # A save killed half-way leaves only orbax's temporary folder: it is never listed.
    os.makedirs(os.path.join(tmp_path, "9.orbax-checkpoint-tmp-123", "state"))
    ckpt = training.Checkpointer(tmp_path)
    assert ckpt.all_steps() == [3]
    # A template of another model does not match: skipped with a warning, nothing restored.
    other = _state(0)._replace(params={"w": jnp.zeros((2, 2), jnp.float32)})
    other = other._replace(opt_state=optax.adam(1e-3).init(other.params))
    with pytest.warns(UserWarning, match="skipping unreadable checkpoint"):
        assert ckpt.restore(template=other) is None
    with pytest.raises(ValueError, match="max_to_keep"):
        training.Checkpointer(tmp_path / "x", max_to_keep=0)
