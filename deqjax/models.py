"""Models users import: DEQ classifiers and sequence models, each with its paper reference.

* :class:`MLPClassifier`: the init paper's §4.1 fully connected DEQ classifier (Agarwala &
  Schoenholz 2022) with pluggable Gaussian / Haar-orthogonal / GOE recurrent initialisation
  (:func:`recurrent_init`, families :data:`INIT_FAMILIES`); :func:`classifier_fns` gives its
  loss, evaluation and diagnostics.
* :class:`ScalarDEQ`: the JR paper's §5.1 200-parameter scalar DEQ, its synthetic 1-D data
  (:func:`jr_synthetic_data`); ``experiments/synthetic_1d.py`` draws its Fig. 5.
* :class:`DEQSettings`: how a model solves its DEQ (forward and evaluation solvers, adjoint, JR
  regulariser, precision), the one ``deq=`` keyword of :class:`MDEQClassifier`,
  :class:`SequenceBackbone` and :class:`SequenceModel`.
* :class:`MDEQClassifier`: the multiscale DEQ image classifier (Bai et al. 2020; JR paper App. A.3):
  stem, ``dq.nn.MultiscaleCell`` in ``dq.nn.DEQ``, readout of ``f(z*)``, pooled linear head;
  :func:`budget_solver` for the JR paper's inference budgets (Table 3).
* :class:`SequenceBackbone`: the DEQ-Transformer / DEQ-TrellisNet (DEQ paper §4) and the explicit
  weight-tied and untied baselines, with Transformer-XL memory (:func:`initial_memory`,
  :func:`next_memory`, :func:`reset_memory`); :class:`SequenceModel` puts embeddings and a head
  around it (language model, copy memory; DEQ paper §5): :func:`lm_loss`, :func:`evaluate_lm`,
  :func:`token_nll`; :func:`trellis_reach` for the trellis cell's receptive field.

>>> import deqjax as dq
>>> def forward(tokens, mems, is_training):
...     deq = dq.models.DEQSettings(dq.solvers.Anderson(max_steps=12, tol=1e-3))
...     model = dq.models.SequenceModel(2000, "deq", d_model=64, deq=deq)
...     return model(tokens, mems, is_training=is_training)     # (logits, aux)
"""

from deqjax._src.models.classifier_fns import ClassifierFns, classifier_fns
from deqjax._src.models.deq_settings import DEQSettings
from deqjax._src.models.language_model import evaluate_lm, lm_loss, token_nll
from deqjax._src.models.mdeq import MDEQClassifier, budget_solver
from deqjax._src.models.memory import initial_memory, next_memory, reset_memory
from deqjax._src.models.mlp_classifier import INIT_FAMILIES, MLPClassifier, recurrent_init
from deqjax._src.models.scalar_deq import (
    ScalarDEQ,
    jr_fig5_metrics,
    jr_synthetic_data,
    jr_synthetic_target,
)
from deqjax._src.models.sequence import SequenceBackbone
from deqjax._src.models.sequence_cells import trellis_reach
from deqjax._src.models.sequence_model import SequenceModel

__all__ = [
    "ClassifierFns",
    "DEQSettings",
    "INIT_FAMILIES",
    "MDEQClassifier",
    "MLPClassifier",
    "ScalarDEQ",
    "SequenceBackbone",
    "SequenceModel",
    "budget_solver",
    "classifier_fns",
    "evaluate_lm",
    "initial_memory",
    "jr_fig5_metrics",
    "jr_synthetic_data",
    "jr_synthetic_target",
    "lm_loss",
    "next_memory",
    "recurrent_init",
    "reset_memory",
    "token_nll",
    "trellis_reach",
]
