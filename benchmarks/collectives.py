"""Where a compiled program's cross-device collectives are: inside a while loop or outside.

A data-parallel DEQ step should average its gradient once (collectives outside every loop) and run
its solver loops on each device alone (no collective inside a loop: under a sharded ``jit`` without
``shard_map`` a batch-wide stopping rule is an all-reduce per iteration, jax#20968). This reads the
optimised HLO text (``jitted.lower(*args).compile().as_text()``) and counts collective
instructions in the computations reachable from any while loop's body or condition, and in the
rest.
"""

from __future__ import annotations

import re
from typing import NamedTuple

_COLLECTIVES = (
    "all-reduce",
    "all-gather",
    "reduce-scatter",
    "all-to-all",
    "collective-permute",
    "collective-broadcast",
)
_OP = re.compile(
    r"^\s*(?:ROOT\s+)?%?[\w.\-]+\s*=\s*[^=]*?\s(" + "|".join(_COLLECTIVES) + r")(?:-start)?\("
)
_HEADER = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s*\(.*\{\s*$")
_CALLEE = re.compile(
    r"(?:to_apply|calls|body|condition|true_computation|false_computation)=%?([\w.\-]+)"
)
_BRANCHES = re.compile(r"branch_computations=\{([^}]*)\}")
_LOOP = re.compile(r"\bwhile\(.*?condition=%?([\w.\-]+).*?body=%?([\w.\-]+)")


class Collectives(NamedTuple):
    """Collective instructions of one compiled program."""

    in_loops: int  # in computations a while loop's body or condition reaches
    outside: int  # everywhere else
    loops: int  # while loops in the program


def _computations(hlo: str) -> dict[str, list[str]]:
    comps: dict[str, list[str]] = {}
    name = None
    for line in hlo.splitlines():
        header = _HEADER.match(line)
        if header:
            name = header.group(1)
            comps[name] = []
        elif line.startswith("}"):
            name = None
        elif name is not None:
            comps[name].append(line)
    return comps


def _callees(lines: list[str]) -> set[str]:
    out = set()
    for line in lines:
        out.update(_CALLEE.findall(line))
        for group in _BRANCHES.findall(line):
            out.update(n.strip().lstrip("%") for n in group.split(","))
    return out


def count_collectives(hlo: str) -> Collectives:
    """Counts the collectives of a compiled program's HLO text, inside loops and outside."""
    comps = _computations(hlo)
    roots = set()
    for lines in comps.values():
        for line in lines:
            roots.update(_LOOP.findall(line)[0] if _LOOP.search(line) else ())
    reached, todo = set(), list(roots)
    while todo:
        name = todo.pop()
        if name in reached or name not in comps:
            continue
        reached.add(name)
        todo.extend(_callees(comps[name]))
    inside = outside = 0
    for name, lines in comps.items():
        n = sum(bool(_OP.search(line)) for line in lines)
        if name in reached:
            inside += n
        else:
            outside += n
    loops = sum(bool(_LOOP.search(line)) for lines in comps.values() for line in lines)
    return Collectives(inside, outside, loops)
