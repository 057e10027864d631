"""Haiku layer: the ``DEQ`` module, DEQ cells, weight norm and variational dropout.

>>> import deqjax as dq
>>> def forward(x, is_training):
...     deq = dq.nn.DEQ(dq.nn.MLPCell(w_init=dq.initializers.HaarOrthogonal(0.9)),
...                     solver=dq.solvers.Anderson(max_steps=30, tol=1e-4))
...     z, sol = deq(hk.Linear(128)(x), is_training=is_training)
...     return hk.Linear(10)(z)
"""

from deqjax._src.deq.deq_output import DEQOutput
from deqjax._src.nn.deq import DEQ
from deqjax._src.nn.mlp_cell import MLPCell
from deqjax._src.nn.multiscale_cell import MultiscaleCell
from deqjax._src.nn.norms import GroupNorm, LayerNorm
from deqjax._src.nn.per_forward import per_forward
from deqjax._src.nn.transformer_cell import TransformerCell, TransformerInput
from deqjax._src.nn.trellis_cell import TrellisCell, TrellisInput
from deqjax._src.nn.variational_dropout import VariationalDropout
from deqjax._src.nn.weight_norm import WeightNorm

__all__ = [
    "DEQ",
    "DEQOutput",
    "GroupNorm",
    "LayerNorm",
    "MLPCell",
    "MultiscaleCell",
    "TransformerCell",
    "TransformerInput",
    "TrellisCell",
    "TrellisInput",
    "VariationalDropout",
    "WeightNorm",
    "per_forward",
]
