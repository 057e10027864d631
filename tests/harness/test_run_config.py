"""The run section: its flags, and ``--quiet`` as ``--no_progress``."""

import dataclasses

from deqjax import harness


@dataclasses.dataclass(frozen=True)
class Config:
    run: harness.ResumableRunConfig = harness.ResumableRunConfig()


def test_run_flags():
    c = harness.parse_config(Config(), ["--seed", "4", "--resume", "--force", "--quiet"])
    assert c.run == harness.ResumableRunConfig(seed=4, resume=True, force=True, progress=False)
    assert not harness.parse_config(Config(), ["--no_progress"]).run.progress
    assert harness.parse_config(Config(), ["--overwrite", "--smoke"]).run.overwrite
    assert "resume" not in harness.flat_dict(harness.RunConfig())  # only resumable runs resume
