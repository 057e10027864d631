"""Shuffled, resumable, per-process batches, the Batches protocol, and padded evaluation
batches."""

import numpy as np
import pytest

from deqjax import data
from deqjax._src.data.batching import eval_batches


def _ids(n):
    return {"id": np.arange(n), "x": np.arange(n) * 10.0}


def test_batches_cover_each_epoch_once_and_are_deterministic():
    it = data.ShuffledBatches(_ids(103), batch_size=10, seed=5)
    assert it.steps_per_epoch == 10
    epoch0 = np.concatenate([next(it)["id"] for _ in range(10)])
    assert len(set(epoch0.tolist())) == 100  # no repeats; 3 left out this epoch
    assert it.state == data.IteratorState(0, 10)
    epoch1 = np.concatenate([next(it)["id"] for _ in range(10)])
    assert it.state == data.IteratorState(1, 10)
    assert not np.array_equal(epoch0, epoch1)  # reshuffled
    again = data.ShuffledBatches(_ids(103), batch_size=10, seed=5)
    np.testing.assert_array_equal(np.concatenate([next(again)["id"] for _ in range(10)]), epoch0)
    other = data.ShuffledBatches(_ids(103), batch_size=10, seed=6)
    assert not np.array_equal(next(other)["id"], epoch0[:10])
    batch = next(data.ShuffledBatches(_ids(103), batch_size=10, seed=5))
    np.testing.assert_array_equal(batch["x"], batch["id"] * 10.0)  # arrays stay aligned


def test_batches_resume_from_state():
    it = data.ShuffledBatches(_ids(50), batch_size=8, seed=1)
    for _ in range(9):
        next(it)
    saved = it.state
    expected = [next(it)["id"] for _ in range(7)]
    resumed = data.ShuffledBatches(_ids(50), batch_size=8, seed=1)
    resumed.restore(saved._asdict())  # as stored in checkpoint JSON
    for want in expected:
        np.testing.assert_array_equal(next(resumed)["id"], want)


def test_next_position_and_order_name_the_batch_next_yields():
    arrays = _ids(50)
    it = data.ShuffledBatches(arrays, batch_size=8, seed=1, process_index=1, process_count=2)
    skipper = data.ShuffledBatches(arrays, batch_size=8, seed=1, process_index=1, process_count=2)
    assert it.arrays.keys() == {"id", "x"}
    for _ in range(14):  # crosses two epoch boundaries (6 steps per epoch)
        epoch, index = skipper.next_position()  # where the batch is, not where the next one is
        assert skipper.state == (epoch, index + 1)
        start = index * 8 + 4  # process 1's half of the global batch
        np.testing.assert_array_equal(next(it)["id"], skipper.order(epoch)[start : start + 4])
        assert skipper.state == it.state
    np.testing.assert_array_equal(
        it.order(3), data.ShuffledBatches(arrays, batch_size=8, seed=1).order(3)
    )


def test_batches_shard_over_processes():
    arrays = _ids(64)
    whole = data.ShuffledBatches(arrays, batch_size=12, seed=2, process_index=0, process_count=1)
    parts = [
        data.ShuffledBatches(arrays, batch_size=12, seed=2, process_index=p, process_count=3)
        for p in range(3)
    ]
    assert parts[0].local_batch_size == 4
    for _ in range(7):  # crosses an epoch boundary (5 steps per epoch)
        want = next(whole)["id"]
        got = np.concatenate([next(p)["id"] for p in parts])
        np.testing.assert_array_equal(got, want)
    with pytest.raises(ValueError, match="divisible by process_count"):
        data.ShuffledBatches(arrays, batch_size=10, seed=0, process_index=0, process_count=3)
    with pytest.raises(ValueError, match="batch_size"):
        data.ShuffledBatches(arrays, batch_size=65, seed=0, process_index=0, process_count=1)


def test_eval_batches_pad_and_mask():
    arrays = _ids(23)
    seen = []
    counts = []
    for p in range(2):
        batches = list(eval_batches(arrays, batch_size=10, process_index=p, process_count=2))
        counts.append(len(batches))
        for batch, mask in batches:
            assert batch["id"].shape == (5,) and mask.dtype == np.float32
            seen.extend(batch["id"][mask > 0].tolist())
    assert counts == [3, 3]
    assert sorted(seen) == list(range(23))


def test_the_library_iterators_declare_what_the_loop_reads():
    """Batches sizes, epochs, a position: each iterator declares them (an endless stream's
    ``steps_per_epoch`` is None); an iterator without them is not a Batches."""
    shuffled = data.ShuffledBatches(
        _ids(50), batch_size=8, seed=1, process_index=1, process_count=2
    )
    lm = data.LMBatches(np.arange(400), num_streams=4, segment_length=8)
    copy = data.CopyMemoryBatches(seed=0, batch_size=4, seq_len=5)
    for it, sizes, epoch in ((shuffled, (8, 4), 6), (lm, (4, 4), 12), (copy, (4, 4), None)):
        assert isinstance(it, data.Batches)
        assert (it.batch_size, it.local_batch_size) == sizes and it.steps_per_epoch == epoch

    class Unsized:
        state = {}

        def restore(self, state):
            pass

        def __next__(self):
            return {}

    assert not isinstance(Unsized(), data.Batches)
