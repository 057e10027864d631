"""The flat view of a nested configuration: names, replacement by name, sections."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import pytest

from deqjax import harness
from deqjax._src.harness.flat_config import declared, find_section, flat_paths, replace_flat


@dataclasses.dataclass(frozen=True)
class Leaf:
    SAFE_ON_RESUME: ClassVar[tuple[str, ...]] = ("b",)
    SMOKE: ClassVar[dict] = {"b": 0}

    a: int = 1
    b: int = 2


@dataclasses.dataclass(frozen=True)
class Root:
    SAFE_ON_RESUME: ClassVar[tuple[str, ...]] = ("x",)

    x: float = 0.5
    leaf: Leaf = Leaf()
    run: harness.RunConfig = harness.RunConfig()


def test_flat_dict_and_paths():
    root = Root()
    assert flat_paths(root)["b"] == ("leaf", "b")
    flat = harness.flat_dict(root)
    assert list(flat)[:3] == ["x", "a", "b"] and flat["seed"] == 0 and flat["smoke"] is False


def test_replace_flat_changes_nested_settings_by_name():
    root = replace_flat(Root(), b=5, x=1.0, seed=3)
    assert root == Root(x=1.0, leaf=Leaf(b=5), run=harness.RunConfig(seed=3))
    with pytest.raises(KeyError, match="nope"):
        replace_flat(Root(), nope=1)


def test_sections_by_type_and_what_they_declare():
    assert find_section(Root(), harness.RunConfig) == harness.RunConfig()
    assert find_section(Root(), harness.SolverConfig) is None
    assert declared(Root(), "SAFE_ON_RESUME") == [("x",), ("b",)]
    assert declared(Root(), "SMOKE") == [{"b": 0}]
