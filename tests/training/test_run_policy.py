"""The one overwrite/resume policy: contradicting flags, a fresh run over an earlier run's files,
a resume with nothing to resume."""

import pytest

from deqjax._src.training.run_policy import RunPolicy


class _Refused(Exception):
    pass


def _refuse():
    return _Refused("refused")


def test_resume_and_overwrite_contradict_each_other():
    assert RunPolicy(resume=True).check() == RunPolicy(True, False)
    with pytest.raises(ValueError, match="^resume and overwrite contradict"):
        RunPolicy(resume=True, overwrite=True).check()
    with pytest.raises(_Refused, match="--resume and --overwrite contradict"):
        RunPolicy(resume=True, overwrite=True).check(flags=True, error=_Refused)


def test_a_fresh_run_deletes_earlier_files_only_with_overwrite():
    assert RunPolicy().to_delete([], _refuse) == []
    with pytest.raises(_Refused):
        RunPolicy().to_delete(["ckpt/4"], _refuse)
    assert RunPolicy(overwrite=True).to_delete(("ckpt/4", "metrics.jsonl"), _refuse) == [
        "ckpt/4",
        "metrics.jsonl",
    ]
    assert RunPolicy(resume=True).to_delete(["ckpt/4"], _refuse) == []  # continued, kept


def test_resume_needs_something_to_resume():
    assert RunPolicy().resume_from(None, _refuse) is None  # a fresh run resumes nothing
    assert RunPolicy().resume_from("ckpt/4", _refuse) is None
    assert RunPolicy(resume=True).resume_from("ckpt/4", _refuse) == "ckpt/4"
    for nothing in (None, []):
        with pytest.raises(_Refused):
            RunPolicy(resume=True).resume_from(nothing, _refuse)
