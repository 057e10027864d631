"""The settings of the initialisation paper's fully connected DEQ classifier (§4.1), checked once
for every framework's ``MLPClassifier`` (``dq.models``, ``deqjax.nnx``, ``deqjax.equinox``)."""

from __future__ import annotations

from typing import Any

from deqjax._src import checks
from deqjax._src.initializers import HaarOrthogonal
from deqjax._src.solvers.anderson import Anderson

CELL_FORMS = ("resnet", "single")


def checked(num_classes: int, cell_form: str, w_init: Any, solver: Any) -> tuple[Any, Any]:
    """``(w_init, solver)`` with their defaults (``None``: Haar-orthogonal recurrent weights at
    σ = 1, ``dq.solvers.Anderson()``), after checking ``num_classes`` and ``cell_form``.

    Raises:
      ValueError: naming the argument, for a ``num_classes`` that is not a positive int or a
        ``cell_form`` not in :data:`CELL_FORMS`.
    """
    checks.check_positive_int(num_classes, "num_classes")
    if cell_form not in CELL_FORMS:
        raise ValueError(f"cell_form must be 'resnet' or 'single', got {cell_form!r}.")
    w_init = HaarOrthogonal(1.0) if w_init is None else w_init
    return w_init, Anderson() if solver is None else solver
