"""Which cases of a parametrized test run in the default suite and which in the slow lane.

The default suite (``pytest``, aiming at about ten minutes on 2 CPU cores; about fifteen today)
runs the first case(s) of a long parameter matrix; the slow lane (``pytest -m slow``, run by CI
after it) runs the rest. Which cases stay in the default suite is the order of the list: put first
the one that covers most (e.g. a partial last chunk, the batch-native mode).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pytest


def default_first(values: Iterable[Any], keep: int = 1) -> list[Any]:
    """``values`` as parameters: the first ``keep`` in the default suite, the others marked slow.

    A value that is already a ``pytest.param`` keeps its id and marks (slow added); a tuple is
    spread over the parameter names, as ``parametrize("a, b", [(1, 2)])`` does.
    """
    out = []
    for i, v in enumerate(values):
        if i < keep:
            out.append(v)
        elif isinstance(v, type(pytest.param(None))):
            out.append(pytest.param(*v.values, id=v.id, marks=[*v.marks, pytest.mark.slow]))
        else:
            args = v if isinstance(v, tuple) else (v,)
            out.append(pytest.param(*args, marks=pytest.mark.slow))
    return out
