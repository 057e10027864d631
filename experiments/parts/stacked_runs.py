"""Several runs of one model trained as one: their parameters stacked on a leading run axis.

Runs that differ only in a few per-run values (a JR strength γ, an initialisation) share one
compiled step when their parameters are stacked: ``jax.vmap`` maps the loss over the runs and
the sum of the runs' losses is minimised, so each run's gradient and Adam update is its own
(Adam is elementwise). :class:`StackedRuns` names the runs and converts between the per-run
trees and the stacked one, builds that summed loss with per-run metric names
(``"<metric>/<run>"``) and reads the per-run curves back from the logged records. The γ sweep
of ``experiments/synthetic_1d.py`` trains its runs so.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

PyTree = Any


@dataclasses.dataclass(frozen=True)
class StackedRuns:
    """Named runs whose parameters (and per-run states) are stacked on a leading axis.

    Attributes:
      names: the runs, in the order of the leading axis.
    """

    names: tuple[str, ...]

    def stack(self, tree: PyTree) -> PyTree:
        """``tree`` copied to every run, stacked."""
        return self.stack_each([tree] * len(self.names))

    def stack_each(self, trees: Sequence[PyTree]) -> PyTree:
        """One tree per run (in the order of :attr:`names`), stacked."""
        if len(trees) != len(self.names):
            raise ValueError(f"{len(self.names)} runs, got {len(trees)} trees.")
        return jax.tree_util.tree_map(lambda *leaves: jnp.stack(leaves), *trees)

    def unstack(self, tree: PyTree) -> dict[str, PyTree]:
        """``{run name: that run's tree}`` of a stacked tree."""
        return {
            name: jax.tree_util.tree_map(lambda a, i=i: a[i], tree)
            for i, name in enumerate(self.names)
        }

    def summed_loss(
        self, run_loss: Callable[..., tuple[jax.Array, Mapping[str, jax.Array]]], in_axes: tuple
    ) -> Callable[..., tuple[jax.Array, dict[str, jax.Array]]]:
        """``loss(*args) -> (sum of the runs' losses, {"<metric>/<run>": value})``.

        Args:
          run_loss: ``(*args) -> (loss, metrics)`` of one run.
          in_axes: ``jax.vmap``'s: 0 for the stacked arguments, None for the shared ones.
        """
        batched = jax.vmap(run_loss, in_axes)

        def loss(*args: Any) -> tuple[jax.Array, dict[str, jax.Array]]:
            losses, metrics = batched(*args)
            named = {f"{k}/{n}": v[i] for k, v in metrics.items() for i, n in enumerate(self.names)}
            return jnp.sum(losses), named

        return loss

    def history(self, records: Sequence[Mapping[str, Any]], key: str) -> np.ndarray:
        """``[records, runs]``: the metric ``key`` of every run in every record."""
        return np.asarray([[r[f"{key}/{n}"] for n in self.names] for r in records])

    def curves(self, values: np.ndarray) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """``{run name: (step, value)}`` of a ``[steps, runs]`` history (steps from 1)."""
        steps = np.arange(1, values.shape[0] + 1)
        return {name: (steps, values[:, i]) for i, name in enumerate(self.names)}
