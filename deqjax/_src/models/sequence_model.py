"""Token sequence models: embeddings, a sequence backbone with memory, a linear head (DEQ paper §5:
the DEQ-Transformer language model of Table 3 and the copy-memory models of Table 1).

``tokens [B, T] -> hk.Embed -> SequenceBackbone (DEQ / weight-tied / untied, with memory) ->
[LayerNorm if pre_ln] -> hk.Linear(vocab_size) -> logits [B, T, vocab_size]``

The trellis state is ``[h; c]``; the head reads the hidden half ``h``. A pre-LN cell leaves its
state un-normalised, so a final LayerNorm precedes the head (as in pre-LN transformers).

The memory is the recurrent carry of a language model trained on contiguous segments
(``dq.data.lm_segments``): start from ``dq.models.initial_memory(...)`` and pass
``dq.models.next_memory(aux["new_mems"], M)`` to the next segment's call (see
:mod:`deqjax._src.models.memory`).
"""

from __future__ import annotations

from typing import Any

import haiku as hk
import jax
import jax.numpy as jnp

from deqjax._src import checks
from deqjax._src.models import sequence


class SequenceModel(hk.Module):
    """Token model: embeddings, :class:`SequenceBackbone`, optional final LayerNorm, linear head.

    Args:
      vocab_size: input and output vocabulary.
      kind: ``"deq"``, ``"tied"`` or ``"untied"`` (see :class:`SequenceBackbone`).
      cell: ``"transformer"`` or ``"trellis"``.
      d_model: state and embedding features.
      embed_init: initializer of the embeddings (``None``: Haiku's default, truncated normal of
        stddev 1; language models use ``hk.initializers.RandomNormal(0.02)``).
      **backbone_kwargs: the remaining :class:`SequenceBackbone` arguments (``num_heads``,
        ``depth``, ``pre_ln``, ``trellis_kernel``, ``d_ff``, ``ffn_init``, and ``deq``, the
        DEQ's :class:`~deqjax.models.DEQSettings`).
      name: Haiku module name.

    Example:
      >>> deq = dq.models.DEQSettings(dq.solvers.Anderson(max_steps=12, tol=1e-3))
      >>> def forward(tokens, mems, is_training):
      ...     model = dq.models.SequenceModel(2000, "deq", d_model=64, deq=deq)
      ...     return model(tokens, mems, is_training=is_training)   # (logits, aux)
    """

    def __init__(
        self,
        vocab_size: int,
        kind: str,
        cell: str = "transformer",
        *,
        d_model: int,
        embed_init: hk.initializers.Initializer | None = None,
        name: str | None = None,
        **backbone_kwargs: Any,
    ):
        super().__init__(name=name)
        checks.check_positive_int(vocab_size, "vocab_size")
        self.vocab_size = vocab_size
        self.d_model = d_model
        self.cell = cell
        self.embed_init = embed_init
        self.backbone = sequence.SequenceBackbone(
            kind, cell, d_model=d_model, name="backbone", **backbone_kwargs
        )

    def __call__(
        self,
        tokens: jax.Array,
        mems: jax.Array | None = None,
        *,
        is_training: bool,
        step: jax.Array | None = None,
    ) -> tuple[jax.Array, dict[str, jax.Array]]:
        """``tokens [B, T]`` int -> ``(logits [B, T, vocab_size], aux)``.

        ``aux`` is the backbone's (``nfe``, ``rel_residual``, ``jr``, ``jr/frobenius_sq``,
        ``jr/applied``, ``new_mems`` with a memory) plus ``z_rms``, the RMS of the backbone's
        output (a pre-LN model's ``z*`` can grow without bound).

        Raises:
          ValueError: if ``tokens`` is not ``[B, T]``.
        """
        if jnp.ndim(tokens) != 2:
            raise ValueError(f"tokens must be [B, T], got shape {jnp.shape(tokens)}.")
        x = hk.Embed(self.vocab_size, self.d_model, w_init=self.embed_init)(tokens)
        z, aux = self.backbone(x, mems, is_training=is_training, step=step)
        aux = aux | {"z_rms": jnp.sqrt(jnp.mean(jnp.square(z)))}
        if self.backbone.pre_ln:
            z = hk.LayerNorm(-1, True, True)(z)
        if self.cell == "trellis":
            z = z[..., : self.d_model // 2]  # the hidden half h of the state [h; c]
        return hk.Linear(self.vocab_size)(z), aux
