"""When an action runs: every N steps, every T seconds, on given steps; fields validated."""

import pytest

from deqjax import training


def test_each_rule_makes_the_action_due():
    every = training.Schedule(every_steps=3)
    assert [s for s in range(1, 10) if every.due(s, now=0.0, last_run=0.0)] == [3, 6, 9]
    timed = training.Schedule(every_seconds=2.0)
    assert not timed.due(5, now=11.9, last_run=10.0) and timed.due(5, now=12.0, last_run=10.0)
    steps = training.Schedule(at_steps=(7, 2, 7))
    assert steps.at_steps == (2, 7)
    assert [s for s in range(1, 10) if steps.due(s, now=0.0, last_run=0.0)] == [2, 7]
    both = training.Schedule(every_steps=4).also_at(6)
    assert [s for s in range(1, 10) if both.due(s, now=0.0, last_run=0.0)] == [4, 6, 8]
    never = training.Schedule(at_end=True)
    assert not any(never.due(s, now=1e9, last_run=0.0) for s in range(1, 10))
    assert not never.periodic and both.periodic and timed.periodic


def test_fields_are_validated_by_name():
    for kwargs, name in (
        (dict(every_steps=0), "every_steps"),
        (dict(every_steps=2.5), "every_steps"),
        (dict(every_steps=True), "every_steps"),
        (dict(every_seconds=0.0), "every_seconds"),
        (dict(every_seconds=float("inf")), "every_seconds"),
        (dict(at_steps=(3, 0)), "at_steps"),
        (dict(at_end=1), "at_end"),
    ):
        with pytest.raises(ValueError, match=name):
            training.Schedule(**kwargs)


def test_an_action_takes_a_schedule_or_its_shorthand_not_both():
    assert training.Action().schedule == training.Schedule()  # never, by default
    assert training.Action(every_steps=5, at_end=True).schedule == training.Schedule(5, at_end=True)
    given = training.Schedule(at_steps=(4,))
    assert training.Action(given).schedule is given
    with pytest.raises(ValueError, match="not both"):
        training.Action(given, every_steps=5)
    with pytest.raises(ValueError, match="every_seconds"):
        training.Action(every_seconds=-1)
