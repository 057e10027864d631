"""Multi-host start-up: the configuration from flags and environment, and two processes joined by
``jax.distributed`` training as one."""

import json
import os
import sys

import numpy as np
import pytest

from deqjax import training
from deqjax._src.training.distributed import distributed_config
from tests.helpers.processes import free_port, run_together
from tests.helpers.train_worker import WORKER, worker_env


def test_distributed_config_from_flags_and_env():
    assert distributed_config(environ={}) is None
    env = {
        "DEQJAX_COORDINATOR_ADDRESS": "10.0.0.1:1234",
        "DEQJAX_NUM_PROCESSES": "4",
        "DEQJAX_PROCESS_ID": "2",
    }
    assert distributed_config(environ=env) == ("10.0.0.1:1234", 4, 2)
    assert distributed_config(process_id=3, environ=env).process_id == 3  # flag wins
    assert distributed_config("h:1", 1, 0, environ={}) is None  # one process
    with pytest.raises(ValueError, match="process_id"):
        distributed_config("h:1", 2, 2, environ={})
    with pytest.raises(ValueError, match="coordinator_address"):
        distributed_config(None, 2, 0, environ={})
    with pytest.raises(ValueError, match="host:port"):
        distributed_config("h", 2, 0, environ={})
    assert training.initialize_distributed(environ={}) is None  # single process: no-op


@pytest.mark.slow
@pytest.mark.parametrize("parallel", ["sharded", "pmap"])
def test_two_processes_agree(tmp_path, parallel):
    port = free_port()
    run_together(
        [
            [sys.executable, WORKER, "dist", tmp_path / f"p{i}.json", "--workdir", tmp_path]
            + ["--port", port, "--process_id", i, "--num_processes", 2]
            + ["--num_steps", 6, "--batch_size", 64, "--parallel", parallel]
            for i in range(2)
        ],
        env=worker_env(1),
    )
    r0, r1 = (json.loads((tmp_path / f"p{i}.json").read_text()) for i in range(2))
    assert (r0["process_count"], r0["device_count"], r0["local_batch_size"]) == (2, 2, 32)
    assert (r0["process_index"], r1["process_index"]) == (0, 1)
    assert r0["losses"] == r1["losses"] and r0["digest"] == r1["digest"]
    # Same global batches on one process alone give the same parameters.
    np.testing.assert_allclose(r0["params"], r0["ref_params"], rtol=1e-4, atol=1e-5)
    assert r0["eval"][-1]["count"] == 449 and r0["eval"] == r1["eval"]
    assert os.listdir(tmp_path / "ckpt") == ["6"]  # both processes wrote one checkpoint
    # With the data on the devices (gathered there, each process's copy): the same run.
    for r in (r0, r1):
        assert r["resident_losses"] == r0["losses"] and r["resident_digest"] == r0["digest"]
        assert r["resident_eval"] == r0["eval"]
