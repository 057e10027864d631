"""The multi-host section: one process without a coordinator; bad settings are named."""

import pytest

from deqjax import harness


def test_single_process_and_bad_settings(monkeypatch):
    for name in ("DEQJAX_COORDINATOR_ADDRESS", "DEQJAX_NUM_PROCESSES", "DEQJAX_PROCESS_ID"):
        monkeypatch.delenv(name, raising=False)
    assert harness.MultiHostConfig().initialize() is None
    assert harness.MultiHostConfig("host:1", 1, 0).initialize() is None  # one process
    with pytest.raises(ValueError, match="process_id"):
        harness.MultiHostConfig("host:1", 2, 5).initialize()
