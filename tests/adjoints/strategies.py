"""Every gradient strategy of deqjax, for the tests that run them all: derived from
``dq.__all__`` (the subclasses of ``dq.Adjoint`` it names), each paired with a forward solver it
accepts, so that a new strategy is in those tests without an edit."""

from __future__ import annotations

from typing import Any, Sequence

import jax
import jax.numpy as jnp

import deqjax as dq


def every_strategy() -> list[type[dq.Adjoint]]:
    """The public gradient strategies, in ``dq.__all__``'s order (not the lazy submodules)."""
    public = (vars(dq).get(name) for name in dq.__all__)
    return [
        c
        for c in public
        if isinstance(c, type) and issubclass(c, dq.Adjoint) and c is not dq.Adjoint
    ]


def solver_for(adjoint: dq.Adjoint, candidates: Sequence[Any]) -> Any:
    """The first of ``candidates`` that ``adjoint`` accepts (a strategy raises ``ValueError``,
    naming what it needs, for a forward solver it cannot differentiate)."""

    def cell(p: jax.Array, x: jax.Array, z: jax.Array) -> jax.Array:
        return jnp.tanh(p * z + x)

    x = jnp.ones(2)
    for solver in candidates:
        try:
            jax.eval_shape(
                lambda s=solver: dq.fixed_point(cell, 0.5, x, 0 * x, solver=s, adjoint=adjoint)
            )
        except ValueError:
            continue
        return solver
    raise ValueError(f"{adjoint!r} accepts none of {list(candidates)}")
