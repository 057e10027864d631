"""Models users import: DEQ classifiers and sequence models, each with its paper reference.

* :class:`MDEQClassifier`: the multiscale DEQ image classifier (Bai et al. 2020; JR paper App. A.3):
  stem, ``dq.nn.MultiscaleCell`` in ``dq.nn.DEQ``, readout of ``f(z*)``, pooled linear head;
  :func:`budget_solver` for the JR paper's inference budgets (Table 3).
* :class:`SequenceBackbone`: the DEQ-Transformer / DEQ-TrellisNet (DEQ paper §4) and the explicit
  weight-tied and untied baselines, with Transformer-XL memory; :class:`SequenceModel` puts
  embeddings and a head around it (language model, copy memory; DEQ paper §5).

>>> import deqjax as dq
>>> def forward(tokens, mems, is_training):
...     model = dq.models.SequenceModel(2000, "deq", d_model=64, solver=functools.partial(
...         dq.solvers.anderson, max_steps=12, tol=1e-3))
...     return model(tokens, mems, is_training=is_training)     # (logits, aux)
"""

from deqjax._src.models.language_model import evaluate_lm, lm_loss, token_nll
from deqjax._src.models.mdeq import MDEQClassifier, budget_solver, grid_pool
from deqjax._src.models.sequence import (
    ADJOINTS,
    CELLS,
    KINDS,
    SequenceBackbone,
    initial_memory,
    make_adjoint,
    memory_shape,
    next_memory,
    reset_memory,
    sequence_cell,
    trellis_reach,
)
from deqjax._src.models.sequence_model import SequenceModel

__all__ = [
    "ADJOINTS",
    "CELLS",
    "KINDS",
    "MDEQClassifier",
    "SequenceBackbone",
    "SequenceModel",
    "budget_solver",
    "evaluate_lm",
    "grid_pool",
    "initial_memory",
    "lm_loss",
    "make_adjoint",
    "memory_shape",
    "next_memory",
    "reset_memory",
    "sequence_cell",
    "token_nll",
    "trellis_reach",
]
