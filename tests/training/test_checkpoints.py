"""Checkpoints: asynchronous saves by policy, keep-K, the data position as an item, corrupt and
partial checkpoints skipped on resume, kills mid-save, the run policy, sharded and pmap layouts
and two processes."""

import json
import os
import signal
import subprocess
import sys
import threading
import time
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from deqjax import training
from deqjax._src.training import checkpoints as checkpoints_module
from deqjax._src.training.checkpoint_contents import tree_digest, tree_layout
from deqjax._src.training.checkpoint_policies import SavePolicy
from deqjax._src.training.run_policy import RunPolicy
from deqjax._src.training.train_state import create_train_state
from tests.helpers.checkpoint_worker import Position
from tests.helpers.processes import free_port, run_together
from tests.helpers.train_worker import REPO_ROOT, worker_env


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


def _save(ckpt, step, *, index=None):
    """Saves ``_state(step)`` at ``step`` with the position ``{"i": index or step}``, committed."""
    assert ckpt.save(step, _state(step), Position(step if index is None else index), force=True)
    ckpt.wait()


def test_round_trip_keep_last_and_the_data_position(tmp_path):
    with training.Checkpoints(tmp_path, keep=2, config={"lr": 0.1, "opt": ("adam",)}) as ckpt:
        assert ckpt.restore(template=_state(0)) is None  # nothing saved yet
        assert ckpt.last_checkpoint() == "none"
        for step in (1, 2, 3):
            _save(ckpt, step, index=4 * step)
        assert ckpt.all_steps() == [2, 3] and ckpt.last_checkpoint() == ckpt.path(3)
        restored = ckpt.restore(template=_state(0))
        assert restored.step == 3
        assert restored.data == {"i": 12} and restored.config == {"lr": 0.1, "opt": ["adam"]}
        assert isinstance(restored.state, training.TrainState)
        _assert_equal(restored.state, jax.device_get(_state(3)))
        _assert_equal(ckpt.restore(template=_state(0), step=2).state, jax.device_get(_state(2)))
        assert ckpt.save(3, _state(3), Position(), force=True) is False  # already saved
    assert sorted(os.listdir(tmp_path / "3")) == [
        "_CHECKPOINT_METADATA",
        "commit_success.txt",
        "data",
        "deqjax_manifest.json",
        "meta",
        "state",
    ]


def _data_files(step_dir):
    found = []
    for root, _, files in os.walk(os.path.join(step_dir, "state")):
        for name in files:
            path = os.path.join(root, name)
            if os.sep + "d" + os.sep in path + os.sep and os.path.getsize(path) > 8:
                found.append(path)
    assert found, "found no data files"
    return found


def _truncate_state_files(step_dir):
    for path in _data_files(step_dir):
        with open(path, "r+b") as f:
            f.truncate(os.path.getsize(path) // 2)


def test_truncated_latest_is_skipped_with_warning(tmp_path, capfd):
    ckpt = training.Checkpoints(tmp_path, keep=3)
    _save(ckpt, 4)
    _save(ckpt, 8)
    _truncate_state_files(ckpt.path(8))
    with pytest.warns(UserWarning, match=f"skipping corrupt checkpoint {ckpt.path(8)}: file"):
        restored = ckpt.restore(template=_state(0))
    assert restored.step == 4 and restored.data == {"i": 4}
    _assert_equal(restored.state, jax.device_get(_state(4)))
    # The bad checkpoint is moved aside, so step 8 can be saved again and read back.
    assert os.path.isdir(ckpt.path(8) + ".corrupt") and ckpt.all_steps() == [4]
    _save(ckpt, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert ckpt.restore(template=_state(0)).step == 8
    ckpt.close()
    # the manifest caught the truncation before orbax read a byte: no asyncio tracebacks
    assert "Event loop is closed" not in capfd.readouterr().err


def test_nothing_restorable_raises_and_renames_nothing(tmp_path, capfd):
    ckpt = training.Checkpoints(tmp_path)
    _save(ckpt, 1)
    _save(ckpt, 2)
    for step in (1, 2):
        _truncate_state_files(ckpt.path(step))
    with pytest.raises(training.RestoreError, match="(?s)2: corrupt: file.*1: corrupt: file"):
        ckpt.restore(template=_state(0))
    assert sorted(os.listdir(tmp_path)) == ["1", "2"]  # nothing renamed or deleted
    assert "Event loop is closed" not in capfd.readouterr().err
    ckpt.close()


def test_silently_changed_bytes_and_a_missing_manifest_are_corrupt(tmp_path):
    ckpt = training.Checkpoints(tmp_path, keep=3)
    for step in (1, 2, 3):
        _save(ckpt, step)
    # Step 3: bytes changed in place, the file as long as before (the format still reads).
    path = _data_files(ckpt.path(3))[0]
    raw = bytearray(open(path, "rb").read())
    raw[-1] ^= 0xFF
    open(path, "wb").write(bytes(raw))
    # Step 2: its manifest gone (a committed checkpoint always has one).
    os.remove(os.path.join(ckpt.path(2), "deqjax_manifest.json"))
    with pytest.warns(UserWarning) as record:
        assert ckpt.restore(template=_state(0)).step == 1
    messages = " ".join(str(w.message) for w in record)
    assert "checksum mismatch" in messages and "manifest" in messages and "is missing" in messages
    ckpt.close()


def test_partial_and_incompatible_checkpoints(tmp_path):
    ckpt = training.Checkpoints(tmp_path)
    _save(ckpt, 3)
    ckpt.close()
    # A save killed half-way leaves only orbax's temporary folder: it is never listed.
    os.makedirs(os.path.join(tmp_path, "9.orbax-checkpoint-tmp-123", "state"))
    ckpt = training.Checkpoints(tmp_path)
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
    ckpt.close()


def test_bad_arguments_are_refused_naming_them(tmp_path):
    for kwargs, name in [
        ({"keep": 0}, "keep"),
        ({"keep": True}, "keep"),
        ({"every_steps": 0}, "every_steps"),
        ({"every_steps": 2.5}, "every_steps"),
        ({"every_minutes": -1.0}, "every_minutes"),
        ({"every_minutes": "5"}, "every_minutes"),
        ({"on_preemption": 1}, "on_preemption"),
        ({"asynchronous": "yes"}, "asynchronous"),
    ]:
        with pytest.raises(ValueError, match=name):
            training.Checkpoints(tmp_path / "x", **kwargs)
    with training.Checkpoints(tmp_path / "y") as ckpt:
        unjsonable = Position()
        unjsonable.i = object()
        with pytest.raises(ValueError, match="data.state must be JSON-able"):
            ckpt.save(1, _state(1), unjsonable, force=True)


_FULL_DISK = """
import resource, signal, sys
import numpy as np
from deqjax import training
from tests.helpers.checkpoint_worker import Position
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past the limit fail with EFBIG instead
ckpt = training.Checkpoints(sys.argv[1], asynchronous=sys.argv[2] == "async")
ckpt.save(1, {"w": np.ones(4, np.float32)}, Position(1), force=True)
ckpt.wait()
resource.setrlimit(resource.RLIMIT_FSIZE, (20000, 20000))  # a disk that fills up mid-save
try:
    big = np.random.default_rng(0).normal(size=100000).astype(np.float32)
    ckpt.save(2, {"w": big}, Position(2), force=True)
    ckpt.wait()  # an asynchronous save's failure surfaces here (or at the next save)
except training.CheckpointError as e:
    print("CheckpointError:", e)
ckpt.close()
"""


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_failed_save_leaves_no_temporary_folder(tmp_path, mode):
    proc = subprocess.run(
        [sys.executable, "-c", _FULL_DISK, str(tmp_path), mode],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO_ROOT,
        env=worker_env(1),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"could not write checkpoint {tmp_path / '2'}" in proc.stdout, proc.stdout
    assert sorted(os.listdir(tmp_path)) == ["1"]  # no 2.orbax-checkpoint-tmp* left behind


# --- asynchronous --------------------------------------------------------------------------------


@pytest.fixture
def held_commit(monkeypatch):
    """Holds each save just before its commit until the test sets the returned event."""
    release, reached = threading.Event(), threading.Event()
    real = checkpoints_module.write_manifest

    def held(root, items):
        reached.set()
        assert release.wait(60), "the test never released the save"
        real(root, items)

    monkeypatch.setattr(checkpoints_module, "write_manifest", held)
    yield release, reached
    release.set()


def test_save_returns_while_the_write_goes_on_and_the_state_may_be_donated(tmp_path, held_commit):
    release, reached = held_commit
    ckpt = training.Checkpoints(tmp_path)
    state = jax.device_put(_state(2))
    assert ckpt.save(2, state, Position(2), force=True)
    assert reached.wait(60)  # every file written, the commit held: save had returned
    assert ckpt.all_steps() == [] and ckpt.last_checkpoint() == "none"
    assert not os.path.exists(ckpt.path(2))
    for leaf in jax.tree_util.tree_leaves(state):
        leaf.delete()  # what the next donating step does to the buffers
    release.set()
    ckpt.wait()
    assert ckpt.all_steps() == [2]
    _assert_equal(ckpt.restore(template=_state(0)).state, jax.device_get(_state(2)))
    ckpt.close()


def test_a_save_finishes_before_the_next_starts(tmp_path, held_commit):
    release, reached = held_commit
    ckpt = training.Checkpoints(tmp_path)
    ckpt.save(1, _state(1), Position(1), force=True)
    assert reached.wait(60)
    second = threading.Thread(target=ckpt.save, args=(2, _state(2), Position(2)), daemon=True)
    second.start()  # force=False and no policy due: returns at once, saving nothing
    second.join(10)
    assert not second.is_alive() and ckpt.all_steps() == []
    waiter = threading.Thread(
        target=ckpt.save, args=(3, _state(3), Position(3)), kwargs={"force": True}
    )
    waiter.start()
    time.sleep(0.5)
    assert waiter.is_alive() and not os.path.exists(ckpt.path(3))  # waits for step 1
    release.set()
    waiter.join(60)
    ckpt.wait()
    assert ckpt.all_steps() == [1, 3]
    ckpt.close()


def test_synchronous_save_returns_committed(tmp_path):
    with training.Checkpoints(tmp_path, asynchronous=False) as ckpt:
        ckpt.save(5, _state(5), Position(5), force=True)
        assert os.path.exists(os.path.join(ckpt.path(5), "deqjax_manifest.json"))
        assert ckpt.all_steps() == [5]


def _worker(*args, timeout=180):
    return subprocess.run(
        [sys.executable, "-m", "tests.helpers.checkpoint_worker", *map(str, args)],
        cwd=REPO_ROOT,
        env=worker_env(1),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.parametrize("at", ["after_save", "before_commit"])
def test_a_kill_during_an_asynchronous_save_loses_nothing_committed(tmp_path, at):
    proc = _worker("kill", tmp_path, "--at", at)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    names = sorted(os.listdir(tmp_path))
    assert "1" in names and "2" not in names, names
    if at == "before_commit":  # all of step 2 written, never committed
        assert any(n.startswith("2.orbax-checkpoint-tmp") for n in names), names
    ckpt = training.Checkpoints(tmp_path)
    data = Position()
    state, step = ckpt.restore_or_claim(
        _worker_state(1), data, RunPolicy(resume=True), training.data_parallel("pmap")
    )
    assert step == 1 and data.i == 1
    _assert_equal(state, _worker_state(1))
    ckpt.close()
    assert sorted(os.listdir(tmp_path)) == ["1"]  # the partial save was cleaned up


def _worker_state(seed):
    from tests.helpers.checkpoint_worker import host_state

    return host_state(seed)


# Known defect on Python >= 3.12 (no thread may start at interpreter shutdown, and orbax's commit
# starts one): a save left in flight by a process that exits without close() is lost there. fit
# always closes its checkpoints; a loop of one's own must call close(). strict: passes again ->
# this mark must go.
@pytest.mark.xfail(
    sys.version_info >= (3, 12),
    reason="Python >= 3.12 starts no thread at shutdown; orbax's commit needs one",
    strict=True,
)
def test_exit_without_close_finishes_the_save(tmp_path):
    proc = _worker("exit", tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "exiting with a save in flight: []" in proc.stdout
    with training.Checkpoints(tmp_path) as ckpt:
        restored = ckpt.restore(template=_worker_state(0))
    assert restored.step == 3 and restored.data == {"i": 3}
    _assert_equal(restored.state, _worker_state(3))


# --- policies ------------------------------------------------------------------------------------


def test_save_policies_steps_minutes_and_their_decision():
    now = [0.0]
    policy = SavePolicy(every_steps=3, every_minutes=2.0, on_preemption=False, clock=lambda: now[0])
    assert [s for s in range(1, 10) if policy.due(s)] == [3, 6, 9]
    now[0] = 120.0  # two minutes since the start
    assert policy.due(10)
    assert policy.due(10)  # the same answer for the same step
    policy.saved()
    now[0] = 200.0
    assert not policy.due(11)
    now[0] = 240.0
    assert policy.due(12)
    assert not SavePolicy(on_preemption=False).due(1)  # no rule: never


def test_every_steps_and_every_minutes_through_save(tmp_path):
    with training.Checkpoints(tmp_path, every_steps=2, keep=10) as ckpt:
        saved = [s for s in range(1, 6) if ckpt.save(s, _state(s), Position(s))]
        assert saved == [2, 4]
    # The clock rule on the wall clock (its arithmetic: the test above, on a fake clock).
    with training.Checkpoints(tmp_path / "t", every_minutes=1 / 60, keep=10) as ckpt:
        assert not ckpt.should_save(1)
        time.sleep(1.1)
        assert ckpt.save(2, _state(2), Position(2))
        ckpt.wait()
        assert ckpt.all_steps() == [2]


def test_sigterm_asks_for_a_save_and_a_stop(tmp_path):
    calls = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: calls.append(signum))
    try:
        ckpt = training.Checkpoints(tmp_path, every_steps=100)
        assert not ckpt.preemption_requested and not ckpt.should_save(1)
        os.kill(os.getpid(), signal.SIGTERM)
        assert ckpt.preemption_requested and calls == [signal.SIGTERM]  # chained
        assert ckpt.save(2, _state(2), Position(2))
        ckpt.close()
        assert ckpt.all_steps() == [2]
        installed = signal.getsignal(signal.SIGTERM)
        assert installed is not None and installed.__name__ == "<lambda>"  # put back
        ignored = training.Checkpoints(tmp_path / "off", on_preemption=False)
        assert signal.getsignal(signal.SIGTERM) is installed
        ignored.preemption_requested = True  # another notice than a SIGTERM
        assert ignored.preemption_requested and ignored.should_save(3)
        ignored.preemption_requested = False
        assert not ignored.preemption_requested and not ignored.should_save(4)
        ignored.close()
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_a_nonfinite_state_is_never_saved(tmp_path):
    with training.Checkpoints(tmp_path) as ckpt:
        _save(ckpt, 1)
        bad = _state(2)._replace(params={"w": _state(2).params["w"].at[0, 0].set(jnp.nan)})
        bad = bad._replace(params={**bad.params, "b": _state(2).params["b"]})
        with pytest.raises(training.NonFiniteError, match=f"not checkpointed.*{ckpt.path(1)}"):
            ckpt.save(2, bad, Position(2), force=True)
        assert ckpt.all_steps() == [1]


# --- the run policy ------------------------------------------------------------------------------


def test_restore_or_claim_by_the_run_policy(tmp_path):
    pmap = training.data_parallel("pmap")
    fresh = jax.device_get(_state(0))
    with training.Checkpoints(tmp_path) as ckpt:
        with pytest.raises(training.RestoreError, match="no checkpoint to resume"):
            ckpt.restore_or_claim(fresh, Position(), RunPolicy(True), pmap)
    assert os.listdir(tmp_path) == []  # nothing written or renamed
    with training.Checkpoints(tmp_path) as ckpt:
        state, step = ckpt.restore_or_claim(fresh, Position(), RunPolicy(), pmap)
        assert step is None and state is fresh
        placed = pmap.put(jax.device_get(_state(4)), training.STATE_KINDS)
        ckpt.save(4, placed, Position(9), force=True)  # the placed (pmap) state: saveable
    with training.Checkpoints(tmp_path) as ckpt:
        with pytest.raises(FileExistsError, match=r"earlier run \(steps \[4\]\)"):
            ckpt.restore_or_claim(fresh, Position(), RunPolicy(), pmap)
    assert os.listdir(tmp_path) == ["4"]
    said, data = [], Position()
    with training.Checkpoints(tmp_path) as ckpt:
        state, step = ckpt.restore_or_claim(fresh, data, RunPolicy(resume=True), pmap, said.append)
    assert step == 4 and data.i == 9 and said == [f"resumed from {tmp_path / '4'} (step 4)"]
    _assert_equal(state, jax.device_get(_state(4)))
    with training.Checkpoints(tmp_path) as ckpt:
        assert ckpt.restore_or_claim(fresh, data, RunPolicy(overwrite=True), pmap)[1] is None
        assert ckpt.all_steps() == []
    with training.Checkpoints(tmp_path) as ckpt:
        with pytest.raises(ValueError, match="contradict"):
            ckpt.restore_or_claim(fresh, data, RunPolicy(True, True), pmap)


def test_a_checkpoint_of_the_synchronous_checkpointer_still_resumes(tmp_path):
    """deqjax 0.2's two items (state; meta with the position, layout and digest) read back; a
    digest that does not match the bytes read is corruption."""
    import orbax.checkpoint as ocp

    options = ocp.CheckpointManagerOptions(enable_async_checkpointing=False)
    with ocp.CheckpointManager(tmp_path, options=options, item_names=("state", "meta")) as m:
        for step in (6, 7):
            host = jax.device_get(_state(step))
            meta = {"data": {"epoch": 1, "index": step}, "config": {"lr": 1}}
            digest = tree_digest(host) if step == 6 else "0" * 64  # 7: changed bytes
            meta |= {"__digest__": digest, "__layout__": tree_layout(host)}
            state = ocp.args.StandardSave(host)
            m.save(step, args=ocp.args.Composite(state=state, meta=ocp.args.JsonSave(meta)))
    with training.Checkpoints(tmp_path) as ckpt:
        with pytest.warns(UserWarning, match="7: content digest mismatch"):
            restored = ckpt.restore(template=_state(0))
    assert restored.step == 6 and restored.data == {"epoch": 1, "index": 6}
    assert restored.config == {"lr": 1}
    _assert_equal(restored.state, jax.device_get(_state(6)))


# --- layouts and processes -----------------------------------------------------------------------


def _layout(tmp_path, parallel, devices, *, save):
    out = tmp_path / f"{parallel}{devices}{'save' if save else ''}.json"
    proc = subprocess.run(
        [sys.executable, "-m", "tests.helpers.checkpoint_worker", "layout", tmp_path / parallel]
        + [out, "--parallel", parallel]
        + (["--save"] if save else []),
        cwd=REPO_ROOT,
        env=worker_env(devices),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text())


def test_a_sharded_checkpoint_restores_onto_another_device_count(tmp_path):
    saved = _layout(tmp_path, "sharded", 4, save=True)
    assert saved["restored_step"] is None
    two = _layout(tmp_path, "sharded", 2, save=False)
    assert two["restored_step"] == 5 and two["position"] == 5 and two["devices"] == 2
    assert two["params_digest"] == two["expected_digest"]
    assert two["placed_on"] == 2 and saved["placed_on"] == 4


def test_a_pmap_checkpoint_keeps_each_devices_carry(tmp_path):
    _layout(tmp_path, "pmap", 2, save=True)
    again = _layout(tmp_path, "pmap", 2, save=False)
    assert again["restored_step"] == 5 and again["position"] == 5
    assert again["params_digest"] == again["expected_digest"]
    assert again["carry"] == [[5.0] * 3, [6.0] * 3]  # device d's carry: seed + d


@pytest.mark.slow
def test_two_processes_save_asynchronously_agree_on_sigterm_and_restore(tmp_path):
    port = free_port()
    worker = [sys.executable, "-m", "tests.helpers.checkpoint_worker", "dist", tmp_path / "ckpt"]
    run_together(
        [worker + [tmp_path / f"p{i}.json", "--port", port, "--process_id", i] for i in range(2)],
        env=worker_env(1),
        cwd=REPO_ROOT,
    )
    r0, r1 = (json.loads((tmp_path / f"p{i}.json").read_text()) for i in range(2))
    assert (r0["process_index"], r1["process_index"]) == (0, 1)
    for r in (r0, r1):  # process 1 got the SIGTERM at step 6; both saved there and stopped
        assert r["saved_at"] == [4, 6] and r["stopped_at"] == 6
        assert r["restored_step"] == 6 and r["position"] == 6
        assert r["params_digest"] == r["expected_digest"]
    assert r0["steps"] == ["4", "6"]
