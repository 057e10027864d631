"""The MDEQ classifier's section: its transforms at a JR strength and a budget."""

from deqjax import harness
from experiments.parts.mdeq_config import MDEQConfig


def test_transforms_and_smoke():
    c = MDEQConfig()
    assert c.channels == (8, 16) and c.transform(0.5, 2).init is not None
    assert MDEQConfig.SMOKE["channels"] == (4, 8)
    flags = harness.flat_dict(c)
    assert {"train_budget", "backward_steps", "jr_p", "head_grid"} <= set(flags)
