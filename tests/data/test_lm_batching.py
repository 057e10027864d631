"""Language-model batching: contiguous streams, segments with memory, resumable."""

from __future__ import annotations

import numpy as np
import pytest

from deqjax import data
from deqjax._src.data.lm_batching import lm_segments, num_lm_segments, stream_layout


def test_stream_layout_is_contiguous():
    data = stream_layout(np.arange(23), num_streams=4)
    assert data.shape == (4, 5)
    np.testing.assert_array_equal(data[2], [10, 11, 12, 13, 14])  # last 3 tokens dropped
    with pytest.raises(ValueError, match="num_streams"):
        stream_layout(np.arange(10), num_streams=0)
    with pytest.raises(ValueError, match="too few"):
        stream_layout(np.arange(3), num_streams=4)


def test_segments_shapes_targets_and_memory():
    b, t, n = 3, 4, 3 * 19  # streams of L = 19 tokens: (19 - 1) // 4 = 4 full segments
    tokens = np.arange(n, dtype=np.int32)
    segments = list(lm_segments(tokens, num_streams=b, segment_length=t, pad_id=-1))
    assert len(segments) == num_lm_segments(n, num_streams=b, segment_length=t) == 4
    for s, seg in enumerate(segments):
        assert seg.index == s
        assert seg.inputs.shape == seg.targets.shape == seg.memory.shape == (b, t)
        assert seg.inputs.dtype == np.int32 and seg.memory_valid.shape == (t,)
        # Token value = position in the stream; stream b starts at b * 19.
        expected = np.arange(b)[:, None] * 19 + s * t + np.arange(t)[None, :]
        np.testing.assert_array_equal(seg.inputs, expected)
        np.testing.assert_array_equal(seg.targets, expected + 1)
        if s == 0:
            assert not seg.memory_valid.any() and (seg.memory == -1).all()
        else:  # memory is exactly the previous segment's inputs
            assert seg.memory_valid.all()
            np.testing.assert_array_equal(seg.memory, segments[s - 1].inputs)
    # Segments tile each stream without gaps; the targets never leave it.
    tiled = np.concatenate([seg.inputs for seg in segments], axis=1)
    np.testing.assert_array_equal(tiled, stream_layout(tokens, num_streams=b)[:, : 4 * t])
    assert segments[-1].targets.max() == 2 * 19 + 16 < 3 * 19


def test_segments_longer_memory_none_and_resume():
    tokens = np.arange(2 * 30, dtype=np.int32)
    segs = list(lm_segments(tokens, num_streams=2, segment_length=5, memory_length=7))
    # Segment 1 starts at position 5: the 7 memory positions are -2..4, the first two padding.
    np.testing.assert_array_equal(segs[1].memory_valid, [False, False] + [True] * 5)
    np.testing.assert_array_equal(segs[1].memory[0], [0, 0, 0, 1, 2, 3, 4])
    np.testing.assert_array_equal(segs[2].memory[1], np.arange(30 + 3, 30 + 10))
    no_mem = next(lm_segments(tokens, num_streams=2, segment_length=5, memory_length=0))
    assert no_mem.memory.shape == (2, 0) and no_mem.memory_valid.shape == (0,)
    resumed = list(lm_segments(tokens, num_streams=2, segment_length=5, memory_length=7, start=3))
    assert len(segs) == 5 and [s.index for s in resumed] == [3, 4]
    for a, b in zip(resumed, segs[3:]):
        np.testing.assert_array_equal(a.inputs, b.inputs)
        np.testing.assert_array_equal(a.memory, b.memory)
    with pytest.raises(ValueError, match="start"):
        lm_segments(tokens, num_streams=2, segment_length=5, start=7)
    with pytest.raises(ValueError, match="memory_length"):
        lm_segments(tokens, num_streams=2, segment_length=5, memory_length=-1)
    with pytest.raises(ValueError, match="no full segment"):
        lm_segments(tokens, num_streams=2, segment_length=30)


def test_epoch_iterators_share_one_position_type():
    tokens = np.asarray([3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3])
    lm = data.LMBatches(tokens, num_streams=2, segment_length=3, process_index=0, process_count=1)
    shuffled = data.ShuffledBatches({"x": np.arange(8)}, batch_size=2, seed=0)
    next(lm), next(shuffled)
    assert type(lm.state) is type(shuffled.state) is data.IteratorState
    assert lm.state == shuffled.state == data.IteratorState(epoch=0, index=1)
