"""The random-matrix ensembles of the init paper (§2.1.2), by name.

With ``E[(1/n) tr(W W^T)] = scale**2`` (:mod:`deqjax.initializers`): ``"gaussian"`` (i.i.d.
entries; circular law of radius ``scale``), ``"orthogonal"`` (Haar; every ``|lambda| = scale``) and
``"goe"`` (symmetric; semicircle on ``[-2 scale, 2 scale]``).
"""

from __future__ import annotations

ENSEMBLES = ("gaussian", "orthogonal", "goe")


def check_ensemble(ensemble: str) -> str:
    """Returns ``ensemble``.

    Raises:
      ValueError: unless ``ensemble`` is one of ``ENSEMBLES``.
    """
    if not isinstance(ensemble, str) or ensemble not in ENSEMBLES:
        raise ValueError(f"ensemble must be one of {ENSEMBLES}, got {ensemble!r}.")
    return ensemble
