"""Flax NNX layer: the ``DEQ`` module, DEQ cells and the §4.1 classifier, as ``flax.nnx.Module``.

The counterpart of ``dq.nn`` (Haiku) on the same framework-free solve: same solvers, adjoints,
batching modes, ``Solution``, cell map (``deq.solve(x).cell_fn``, for Jacobian regularisation)
and backward statistics; the cells compute the Haiku cells' equations with parameters of the
same names. Importing it loads Flax (not Haiku).

>>> import deqjax as dq
>>> from flax import nnx
>>> cell = dq.nnx.MLPCell(784, 128, w_init=dq.initializers.HaarOrthogonal(0.9), rngs=nnx.Rngs(0))
>>> deq = dq.nnx.DEQ(cell, solver=dq.solvers.Anderson(max_steps=30, tol=1e-4))
>>> z_star, sol = deq(x)                      # x: [B, 784] -> z_star: [B, 128]
"""

from deqjax._src.cells.transformer import TransformerInput
from deqjax._src.deq.deq_output import DEQOutput
from deqjax._src.frontends.nnx_cells import MLPCell, TransformerCell
from deqjax._src.frontends.nnx_classifier import MLPClassifier, classifier_fns
from deqjax._src.frontends.nnx_deq import DEQ

__all__ = [
    "DEQ",
    "DEQOutput",
    "MLPCell",
    "MLPClassifier",
    "TransformerCell",
    "TransformerInput",
    "classifier_fns",
]
