"""Models users import: DEQ classifiers and sequence models, each with its paper reference.

* :class:`MLPClassifier`: the init paper's §4.1 fully connected DEQ classifier (Agarwala &
  Schoenholz 2022) with pluggable Gaussian / Haar-orthogonal / GOE recurrent initialisation
  (:func:`recurrent_init`); :func:`classifier_fns` gives its loss, evaluation and diagnostics.
* :class:`ScalarDEQ`: the JR paper's §5.1 200-parameter scalar DEQ, its synthetic 1-D data
  (:func:`jr_synthetic_data`) and Fig. 5 (:func:`plot_jr_fig5`).
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
from deqjax._src.models.mlp_classifier import (
    INIT_FAMILIES,
    ClassifierFns,
    MLPClassifier,
    classifier_fns,
    recurrent_init,
)
from deqjax._src.models.scalar_deq import (
    ScalarDEQ,
    jr_fig5_metrics,
    jr_synthetic_data,
    jr_synthetic_target,
    plot_jr_fig5,
)
from deqjax._src.models.sequence import (
    CELLS,
    KINDS,
    SequenceBackbone,
    initial_memory,
    memory_shape,
    next_memory,
    reset_memory,
    sequence_cell,
    trellis_reach,
)
from deqjax._src.models.sequence_model import SequenceModel

__all__ = [
    "CELLS",
    "ClassifierFns",
    "INIT_FAMILIES",
    "KINDS",
    "MDEQClassifier",
    "MLPClassifier",
    "ScalarDEQ",
    "SequenceBackbone",
    "SequenceModel",
    "budget_solver",
    "classifier_fns",
    "evaluate_lm",
    "grid_pool",
    "initial_memory",
    "jr_fig5_metrics",
    "jr_synthetic_data",
    "jr_synthetic_target",
    "lm_loss",
    "memory_shape",
    "next_memory",
    "plot_jr_fig5",
    "recurrent_init",
    "reset_memory",
    "sequence_cell",
    "token_nll",
    "trellis_reach",
]
