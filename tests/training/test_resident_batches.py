"""Batches gathered on the devices from a data set placed once: the host batches exactly (order,
values, layout, across epochs and from a restored position), a fit run's history bit for bit,
the evaluation set placed once, and nothing compiled again at an epoch boundary."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from deqjax import data, training
from deqjax._src.training import resident_batches
from deqjax._src.training.actions import evaluate as evaluate_action
from deqjax._src.training.resident_batches import ResidentBatches, fits_on_devices


def _arrays(n=103):
    rng = np.random.default_rng(0)
    return {
        "id": np.arange(n, dtype=np.int32),
        "x": rng.normal(size=(n, 5)).astype(np.float32),
        "y": rng.normal(size=(n,)).astype(np.float32),
    }


def _assert_same(parallel, placed, host_batch):
    """``placed`` holds ``host_batch``'s values, laid out as ``parallel.put`` lays them out."""
    want = parallel.put(host_batch, training.SHARDED)
    for k in host_batch:
        assert placed[k].sharding == want[k].sharding and placed[k].shape == want[k].shape
        assert placed[k].dtype == want[k].dtype
    got = parallel.get(placed, training.SHARDED)
    for k in host_batch:
        np.testing.assert_array_equal(got[k], host_batch[k])


@pytest.mark.parametrize("mode", ["sharded", "pmap"])
def test_resident_batches_are_the_host_batches_across_epochs_and_from_a_restored_position(mode):
    parallel = training.data_parallel(mode)
    host = data.ShuffledBatches(_arrays(), batch_size=8, seed=3)  # 12 steps per epoch
    resident = ResidentBatches(data.ShuffledBatches(_arrays(), batch_size=8, seed=3), parallel)
    for _ in range(30):  # crosses two epoch boundaries
        _assert_same(parallel, next(resident), next(host))
        assert resident.data.state == host.state
    # Moved back (a checkpoint's position, as JSON gives it back), then into another epoch.
    for position in ({"epoch": 1, "index": 5}, {"epoch": 0, "index": 12}, (4, 0)):
        host.restore(position)
        resident.data.restore(position)
        for _ in range(3):
            _assert_same(parallel, next(resident), next(host))
    # A fresh iterator started at a position (a resumed run's) gives the same batches too.
    fresh = data.ShuffledBatches(_arrays(), batch_size=8, seed=3, state=data.IteratorState(2, 11))
    host.restore((2, 11))
    resident = ResidentBatches(fresh, parallel)
    for _ in range(3):
        _assert_same(parallel, next(resident), next(host))


def test_another_order_gives_other_batches():
    """The comparison above fails for batches in a wrong order (another seed's)."""
    parallel = training.data_parallel("sharded")
    other = ResidentBatches(data.ShuffledBatches(_arrays(), batch_size=8, seed=4), parallel)
    host = data.ShuffledBatches(_arrays(), batch_size=8, seed=3)
    with pytest.raises(AssertionError):
        _assert_same(parallel, next(other), next(host))


def test_a_shard_of_another_process_is_refused():
    parallel = training.data_parallel("sharded")
    shard = data.ShuffledBatches(_arrays(), batch_size=8, seed=3, process_index=1, process_count=2)
    with pytest.raises(ValueError, match="this process's shard"):
        ResidentBatches(shard, parallel)


def test_resident_batches_are_batches_whose_position_is_the_host_iterators():
    parallel = training.data_parallel("sharded")
    host = data.ShuffledBatches(_arrays(), batch_size=8, seed=3)
    resident = ResidentBatches(host, parallel)
    assert isinstance(resident, data.Batches) and resident.placed
    assert (resident.batch_size, resident.local_batch_size) == (8, 8)
    assert resident.steps_per_epoch == host.steps_per_epoch == 12
    next(resident)
    assert resident.state == host.state == data.IteratorState(0, 1)
    resident.restore({"epoch": 3, "index": 4})
    assert host.state == data.IteratorState(3, 4)
    _assert_same(
        parallel,
        next(resident),
        next(data.ShuffledBatches(_arrays(), batch_size=8, seed=3, state=data.IteratorState(3, 4))),
    )


def test_resident_if_fits_chooses_the_resident_path_where_the_data_fit(monkeypatch):
    parallel = training.data_parallel("sharded")
    said = []
    host = data.ShuffledBatches(_arrays(), batch_size=8, seed=3)
    assert isinstance(training.resident_if_fits(host, parallel, said.append), ResidentBatches)
    assert "placed once" in said[-1]
    monkeypatch.setattr(resident_batches, "fits_on_devices", lambda *args: False)
    fallback = training.resident_if_fits(host, parallel, said.append)
    assert fallback is host and "does not fit" in said[-1]


def test_fits_on_devices_reads_the_free_memory():
    class Device:
        def __init__(self, stats):
            self.stats = stats

        def memory_stats(self):
            return self.stats

    roomy = Device({"bytes_limit": 1000, "bytes_in_use": 200})
    assert fits_on_devices(400, [roomy, Device(None)])  # at most half the free 800 bytes
    assert not fits_on_devices(401, [Device(None), roomy])
    assert fits_on_devices(10**15, [Device(None)])  # a CPU: no statistics
    assert fits_on_devices(1, jax.local_devices())


def _fit(train_data, *, num_steps, eval_every=None):
    test = {k: v[:37] for k, v in _arrays().items()}  # 37 examples: a padded last batch

    def loss_fn(params, batch, key, reg_state, step):
        err = batch["x"] @ params["w"] - batch["y"]
        loss = jnp.mean(err**2) + 1e-3 * jnp.mean(batch["id"].astype(jnp.float32))
        return loss, {"id_sum": jnp.sum(batch["id"]).astype(jnp.float32)}

    def eval_fn(params, batch):
        return {"sq_err": (batch["x"] @ params["w"] - batch["y"]) ** 2}

    pair = training.train_step(loss_fn, training.skip_nonfinite(optax.sgd(0.05)))
    parallel = training.data_parallel("sharded")
    resident = isinstance(train_data, ResidentBatches)
    evaluate = training.Evaluate(
        eval_fn, test, batch_size=16, every_steps=eval_every, resident=resident
    )
    return training.fit(
        pair,
        pair.init({"w": jnp.zeros((5,), jnp.float32)}, jax.random.PRNGKey(0)),
        train_data,
        num_steps=num_steps,
        parallel=parallel,
        actions=[training.LogMetrics(every_steps=1), evaluate],
        say=None,
    )


def _untimed(history):
    return [{k: v for k, v in r.items() if k != "examples_per_sec"} for r in history]


def test_fit_with_resident_data_gives_the_host_runs_history_and_places_the_eval_set_once(
    monkeypatch,
):
    calls = []
    real = evaluate_action.eval_batches
    monkeypatch.setattr(
        evaluate_action, "eval_batches", lambda *a, **k: calls.append(1) or real(*a, **k)
    )

    def run(resident):
        calls.clear()
        batches = data.ShuffledBatches(_arrays(), batch_size=16, seed=2)
        if resident:
            batches = ResidentBatches(batches, training.data_parallel("sharded"))
        result = _fit(batches, num_steps=15)  # 6 steps per epoch: evaluations at 6, 12 and 15
        return result, len(calls)

    (host, host_reads), (resident, resident_reads) = run(False), run(True)
    assert _untimed(resident.history) == _untimed(host.history)
    assert [r["step"] for r in host.history if r["split"] == "eval"] == [6, 12, 15]
    jax.tree_util.tree_map(np.testing.assert_array_equal, resident.state, host.state)
    assert resident.data_state == host.data_state == data.IteratorState(2, 3)
    assert host_reads == 4 and resident_reads == 1  # warm-up + 3 evaluations, or once


def test_nothing_compiles_again_at_an_epoch_boundary_or_an_evaluation(compiles):
    def run(num_steps):
        batches = data.ShuffledBatches(_arrays(), batch_size=16, seed=2)
        batches = ResidentBatches(batches, training.data_parallel("sharded"))
        _fit(batches, num_steps=num_steps, eval_every=2)

    run(2)  # the small programs every run shares (placing arrays, zeros) compile once
    compiles.clear()
    run(2)  # one step's programs (fit's step, evaluation and gather are each run's own)
    per_run = len(compiles)
    compiles.clear()
    run(20)  # three epoch boundaries, ten evaluations
    assert len(compiles) == per_run
