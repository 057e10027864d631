"""A profiler window: steps ``first`` to ``last`` traced into the run folder, each step named."""

import gzip
import json

import jax
import jax.numpy as jnp
import optax
import pytest

from deqjax import data, training


def _loop(actions, *, num_steps, start_step=0, run_dir=None):
    def loss_fn(params, batch, key, reg_state, step):
        return jnp.mean((batch["x"] @ params["w"]) ** 2), {}

    pair = training.train_step(loss_fn, optax.sgd(0.1))
    parallel = training.data_parallel("sharded")
    batches = data.ShuffledBatches({"x": jnp.ones((32, 4), jnp.float32)}, batch_size=8, seed=0)
    state = pair.init({"w": jnp.ones(4, jnp.float32)}, jax.random.PRNGKey(0))
    return training.train_loop(
        parallel.map_update(pair.update),
        parallel.put(state, training.STATE_KINDS),
        (parallel.put(b, training.SHARDED) for b in batches),
        num_steps=num_steps,
        start_step=start_step,
        actions=actions,
        context=training.LoopContext(parallel, batches, run_dir=run_dir),
    )


def _traced_steps(run_dir):
    """The step numbers of the step annotations in each trace written under ``run_dir``."""
    traces = sorted((run_dir / "profile").glob("plugins/profile/*/perfetto_trace.json.gz"))
    out = []
    for path in traces:
        events = json.load(gzip.open(path))
        events = events["traceEvents"] if isinstance(events, dict) else events
        out.append(sorted({int(e["args"]["step_num"]) for e in events if e.get("name") == "train"}))
    return out


def test_the_trace_holds_the_window_of_steps(tmp_path):
    _loop([training.ProfileSteps(3, 5, perfetto=True)], num_steps=8, run_dir=tmp_path)
    assert list((tmp_path / "profile").glob("plugins/profile/*/*.xplane.pb"))
    assert _traced_steps(tmp_path) == [[3, 4, 5]]


def test_a_run_that_starts_or_stops_inside_the_window_is_traced_for_its_part(tmp_path):
    _loop([training.ProfileSteps(1, 3, perfetto=True)], num_steps=2, run_dir=tmp_path / "a")
    assert _traced_steps(tmp_path / "a") == [[1, 2]]  # stopped at its end
    resumed = tmp_path / "b"  # a resumed run that starts at step 4, inside the window
    _loop([training.ProfileSteps(3, 5, perfetto=True)], num_steps=7, start_step=4, run_dir=resumed)
    assert _traced_steps(resumed) == [[5]]


def test_a_window_needs_a_run_folder_and_ordered_steps():
    with pytest.raises(ValueError, match="last"):
        training.ProfileSteps(5, 4)
    with pytest.raises(ValueError, match="first"):
        training.ProfileSteps(0, 4)
    with pytest.raises(ValueError, match="run folder"):
        _loop([training.ProfileSteps(1, 2)], num_steps=2)
