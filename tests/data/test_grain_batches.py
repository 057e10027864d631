"""grain input: a grain iterator as training batches (its state saved, JSON round-tripped and
restored to the same next batch), and in-memory arrays through grain giving, bit for bit,
ShuffledBatches' batches for the same seed (across epochs, processes and a restore)."""

from __future__ import annotations

import json
import os

import grain  # the test extra installs it: a missing install fails here, never skips
import numpy as np
import pytest

from deqjax import data

FASHION_MNIST = "/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz"


def _arrays(n=103):
    rng = np.random.default_rng(0)
    return {
        "image": rng.normal(size=(n, 28, 28, 1)).astype(np.float32),
        "label": rng.integers(0, 10, n).astype(np.int32),
    }


def _same(a, b):
    assert set(a) == set(b)
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape
        np.testing.assert_array_equal(a[k], b[k])


def _roundtrip(state):
    return json.loads(json.dumps(state))


def _take(it, k):
    return [next(it) for _ in range(k)]


def test_a_grain_iterator_restores_to_the_same_next_batch():
    ds = grain.MapDataset.source(np.arange(40)).shuffle(seed=1).repeat().batch(4)
    ds = ds.map(lambda x: {"x": x})
    it = data.GrainBatches(iter(ds.to_iter_dataset()), batch_size=8, process_count=2)
    assert isinstance(it, data.Batches)
    assert (it.batch_size, it.local_batch_size, it.steps_per_epoch) == (8, 4, None)
    _take(it, 3)
    state = _roundtrip(it.state)
    assert state == {"grain": {"next_index": 3}}
    after = _take(it, 5)
    it.restore(state)
    for a, b in zip(_take(it, 5), after):
        _same(a, b)
    with pytest.raises(ValueError, match="GrainBatches.state"):
        it.restore({"epoch": 0, "index": 3})


def test_a_grain_data_loader_state_is_json_text():
    loader = grain.DataLoader(
        data_source=np.arange(30),
        sampler=grain.samplers.IndexSampler(
            num_records=30,
            shuffle=True,
            seed=0,
            num_epochs=None,
            shard_options=grain.sharding.NoSharding(),
        ),
        operations=[grain.transforms.Batch(3, drop_remainder=True)],
        worker_count=0,
    )
    it = data.GrainBatches(loader, batch_size=3, steps_per_epoch=10, process_count=1)
    _take(it, 4)
    state = _roundtrip(it.state)
    assert set(state) == {"grain_json"}
    after = _take(it, 3)
    it.restore(state)
    np.testing.assert_array_equal(_take(it, 3), after)


def test_grain_batches_refuses_what_it_cannot_use():
    with pytest.raises(ValueError, match="get_state"):
        data.GrainBatches(iter([1, 2]), batch_size=2)
    ds = grain.MapDataset.range(10).repeat().batch(3)
    with pytest.raises(ValueError, match="divisible by process_count"):
        data.GrainBatches(iter(ds), batch_size=3, process_count=2)
    with pytest.raises(ValueError, match="batch_size"):
        data.GrainBatches(iter(ds), batch_size=0, process_count=1)
    it = data.GrainBatches(iter(ds), batch_size=4, process_count=1)  # batched by 3, not 4
    with pytest.raises(ValueError, match="local_batch_size"):
        next(it)


@pytest.mark.parametrize("process_count", [1, 2])
def test_grain_input_gives_shuffled_batches_bit_for_bit(process_count):
    arrays, batch_size = _arrays(), 12  # 8 batches an epoch, 7 examples dropped each epoch
    for p in range(process_count):
        kwargs = dict(batch_size=batch_size, seed=5, process_index=p, process_count=process_count)
        ours = data.grain_shuffled_batches(arrays, **kwargs)
        theirs = data.ShuffledBatches(arrays, **kwargs)
        assert ours.steps_per_epoch == theirs.steps_per_epoch == 8
        assert ours.local_batch_size == theirs.local_batch_size == batch_size // process_count
        for a, b in zip(_take(ours, 20), _take(theirs, 20)):  # 2.5 epochs
            _same(a, b)
        # a restore to a position inside epoch 1, from the JSON of a saved state
        state = {"grain": {"next_index": 11}}
        ours.restore(_roundtrip(state))
        theirs.restore({"epoch": 1, "index": 3})
        for a, b in zip(_take(ours, 7), _take(theirs, 7)):
            _same(a, b)


def test_grain_shuffled_examples_follow_the_stored_order_unshuffled():
    arrays = _arrays(10)
    kwargs = dict(batch_size=4, seed=0, process_index=1, process_count=2)
    examples = data.grain_shuffled_examples(data.ShuffledBatches(arrays, shuffle=False, **kwargs))
    first_pixel = arrays["image"][:, 0, 0, 0]  # distinct normals: the example's fingerprint
    order = [int(np.flatnonzero(first_pixel == examples[j]["image"][0, 0, 0])[0]) for j in range(8)]
    assert order == [2, 3, 6, 7] * 2  # process 1's half of 2 batches of 4 an epoch, 8-9 dropped
    with pytest.raises(ValueError, match="batch_size"):
        data.grain_shuffled_batches(arrays, batch_size=11, seed=0, process_index=0, process_count=1)


@pytest.mark.skipif(not os.path.exists(FASHION_MNIST), reason="dataset-fashion-mnist not installed")
def test_fashion_mnist_through_grain_matches_shuffled_batches():
    train, _, _ = data.load_classification("fashion_mnist")
    ours = data.grain_shuffled_batches(train, batch_size=128, seed=0)
    theirs = data.ShuffledBatches(train, batch_size=128, seed=0)
    assert ours.steps_per_epoch == theirs.steps_per_epoch == 468
    for a, b in zip(_take(ours, 2), _take(theirs, 2)):
        _same(a, b)
    ours.restore({"grain": {"next_index": 468}})  # the first batches of epoch 1
    theirs.restore({"epoch": 1, "index": 0})
    for a, b in zip(_take(ours, 2), _take(theirs, 2)):
        _same(a, b)


def _grain_fit(tmp_path, num_steps, *, resume=False, name="run", source="grain"):
    import jax.numpy as jnp

    from deqjax import training
    from tests.helpers.train_worker import toy_fit

    arrays = {"x": np.arange(40, dtype=np.float32)}  # 5 batches of 8 an epoch
    make = data.grain_shuffled_batches if source == "grain" else data.ShuffledBatches
    batches = make(arrays, batch_size=8, seed=3, process_index=0, process_count=1)

    def loss_fn(params, batch, key, reg_state, step):
        return jnp.sum((params["w"] - jnp.mean(batch["x"])) ** 2), {}

    return toy_fit(
        batches,
        num_steps,
        loss=loss_fn,
        params={"w": jnp.zeros((2,), jnp.float32)},
        actions=training.default_actions(log_every=1, progress=False),
        workdir=str(tmp_path / name),
        checkpoint_every=4 if name == "part" else None,
        resume=resume,
        rng=0,
    )


def test_fit_trains_from_grain_and_resumes_at_the_same_next_batch(tmp_path):
    from deqjax._src.training.checkpoint import tree_digest

    full = _grain_fit(tmp_path, 7, name="full")
    same = _grain_fit(tmp_path, 7, name="shuffled", source="shuffled")  # the same batches
    assert [r["loss"] for r in full.history] == [r["loss"] for r in same.history]
    assert full.data_state == {"grain": {"next_index": 7}}
    _grain_fit(tmp_path, 4, name="part")  # stopped at step 4 (its checkpoint holds the position)
    resumed = _grain_fit(tmp_path, 7, resume=True, name="part")
    assert resumed.restored_step == 4 and resumed.data_state == full.data_state
    assert tree_digest(resumed.state) == tree_digest(full.state)
