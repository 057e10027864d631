"""``experiments/repro_init_sweep.py`` (REPRODUCTION.md claim 1): its flags."""

import pytest

from deqjax import harness
from experiments import repro_init_sweep


def test_flags():
    argv = ["--act", "tanh", "--width", "32", "--families", "gaussian,orthogonal", "--seeds", "2"]
    c = harness.parse_config(repro_init_sweep.Config(), [*argv, "--scales", "0.5,1"])
    assert (c.act, c.width, c.families, c.seeds, c.scales) == (
        "tanh",
        32,
        ("gaussian", "orthogonal"),
        2,
        (0.5, 1.0),
    )
    with pytest.raises(SystemExit):
        harness.parse_config(repro_init_sweep.Config(), ["--act", "gelu"])
