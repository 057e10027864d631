"""Equinox layer: the ``DEQ`` module, DEQ cells and the §4.1 classifier, as ``eqx.Module``.

The counterpart of ``dq.nn`` (Haiku) on the same framework-free solve: same solvers, adjoints,
batching modes, ``Solution``, cell map (``deq.solve(x).cell_fn``, for Jacobian regularisation)
and backward statistics; the cells compute the Haiku cells' equations with parameters of the
same names, drawn at construction. Importing it loads Equinox (not Haiku).

>>> import deqjax as dq
>>> cell = dq.equinox.MLPCell(784, 128, w_init=dq.initializers.HaarOrthogonal(0.9),
...                           key=jax.random.key(0))
>>> deq = dq.equinox.DEQ(cell, solver=dq.solvers.Anderson(max_steps=30, tol=1e-4))
>>> z_star, sol = deq(x)                      # x: [B, 784] -> z_star: [B, 128]
"""

from deqjax._src.cells.transformer import TransformerInput
from deqjax._src.deq.deq_output import DEQOutput
from deqjax._src.frontends.equinox_cells import MLPCell, TransformerCell
from deqjax._src.frontends.equinox_classifier import MLPClassifier, classifier_fns
from deqjax._src.frontends.equinox_deq import DEQ

__all__ = [
    "DEQ",
    "DEQOutput",
    "MLPCell",
    "MLPClassifier",
    "TransformerCell",
    "TransformerInput",
    "classifier_fns",
]
