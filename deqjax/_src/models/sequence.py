"""Sequence backbones with memory: the DEQ-Transformer / DEQ-TrellisNet and their explicit
weight-tied and untied baselines (DEQ paper §3.3, §4, §5 Tables 1–3).

Three backbones over embeddings ``x: [B, T, Dx]``, each with an optional memory of the previous
segment (Transformer-XL style, gradient stopped):

* ``"deq"``: one weight-tied cell solved to its equilibrium with ``dq.nn.DEQ`` (implicit backward
  by default). Memory ``mems: [B, M, D]``: the previous segment's equilibrium ``z*`` (DEQ paper
  §3.3/§4: one state, whatever the effective depth).
* ``"tied"``: the same weight-tied cell unrolled ``depth`` times from ``z = 0`` (explicit backprop
  through every layer; ``depth`` = the DEQ's forward NFE for a like-for-like comparison).
* ``"untied"``: ``depth`` cells with separate weights (an ordinary deep transformer / TrellisNet).
  For both explicit models the memory is per layer, ``mems: [depth, B, M, D]``: layer ``l`` attends
  to the previous segment's input to layer ``l`` (Transformer-XL, Dai et al. 2019 §3.2:
  ``h^{n}_τ = Layer(h^{n-1}_τ, SG(h^{n-1}_{τ-1}))``). Because these models start from
  ``z^[0] = 0`` and inject ``x`` into every layer (as the DEQ does), layer 0's memory is the zero
  state: the previous segment's tokens reach the current one from layer 1 on. A ``[B, M, D]``
  memory is also accepted (every layer attends to the same states).

With a memory, ``aux["new_mems"]`` holds the next segment's memory (this segment's states:
``[B, T, D]`` for the DEQ, ``[depth, B, T, D]`` for the explicit models;
:func:`~deqjax.models.next_memory` keeps the last ``M`` positions), gradient stopped. Carrying
it costs ``depth`` times more for the explicit models: the DEQ paper's memory claim covers the
carried state as well as the activations.

Cells: ``"transformer"`` or ``"trellis"`` (:mod:`deqjax._src.models.sequence_cells`).
"""

from __future__ import annotations

import haiku as hk
import jax
import jax.numpy as jnp

from deqjax._src import checks
from deqjax._src.models import deq_settings, memory, sequence_cells
from deqjax._src.solvers.summary import summarize


class SequenceBackbone(hk.Module):
    """A DEQ, weight-tied or untied sequence backbone with memory (see the module docstring).

    Args:
      kind: ``"deq"``, ``"tied"`` or ``"untied"``.
      cell: ``"transformer"`` or ``"trellis"``.
      d_model: state features ``D``.
      num_heads: attention heads (transformer).
      depth: layers of the explicit models (ignored by the DEQ).
      pre_ln: pre-LayerNorm transformer cells (default post-LN).
      trellis_kernel: the trellis cell's kernel size ``k``.
      d_ff: the transformer cell's FFN width (``None``: ``2 * d_model``).
      ffn_init: the transformer cell's FFN weight initializer (``None``: ``N(0, 0.01)``); the
        init paper's ensembles are ``dq.initializers.{Gaussian, HaarOrthogonal, GOE}(scale)``
        (GOE needs ``d_ff == d_model``).
      deq: how the DEQ is solved, a :class:`~deqjax.models.DEQSettings` (forward and evaluation
        solvers, adjoint, JR regulariser, the cell's precision; ``None``: ``DEQSettings()``,
        Anderson and the implicit adjoint, no regulariser). Explicit models ignore it and
        report zero JR entries.
      name: Haiku module name.

    Attributes:
      KINDS: the backbone kinds, ``("deq", "tied", "untied")``.
      CELLS: the cells, ``("transformer", "trellis")``.

    Raises:
      ValueError: for an unknown ``kind`` or ``cell``, ``depth < 1`` or a ``deq`` that is not a
        ``DEQSettings``.
    """

    KINDS = memory.KINDS
    CELLS = sequence_cells.CELLS

    def __init__(
        self,
        kind: str,
        cell: str = "transformer",
        *,
        d_model: int,
        num_heads: int = 4,
        depth: int = 1,
        pre_ln: bool = False,
        trellis_kernel: int = 2,
        d_ff: int | None = None,
        ffn_init: hk.initializers.Initializer | None = None,
        deq: deq_settings.DEQSettings | None = None,
        name: str | None = None,
    ):
        super().__init__(name=name)
        if kind not in self.KINDS:
            raise ValueError(f"kind must be one of {self.KINDS}, got {kind!r}.")
        if cell not in self.CELLS:
            raise ValueError(f"cell must be one of {self.CELLS}, got {cell!r}.")
        checks.check_positive_int(depth, "depth")
        self.deq_settings = deq_settings.check_settings(deq)
        self.kind = kind
        self.cell = cell
        self.d_model = d_model
        self.num_heads = num_heads
        self.depth = depth
        self.pre_ln = pre_ln
        self.trellis_kernel = trellis_kernel
        self.d_ff = d_ff
        self.ffn_init = ffn_init

    def _cell(self, name: str | None = None) -> hk.Module:
        return sequence_cells.sequence_cell(
            self.cell,
            d_model=self.d_model,
            num_heads=self.num_heads,
            pre_ln=self.pre_ln,
            trellis_kernel=self.trellis_kernel,
            d_ff=self.d_ff,
            ffn_init=self.ffn_init,
            name=name,
        )

    def __call__(
        self,
        x: jax.Array,
        mems: jax.Array | None = None,
        *,
        is_training: bool,
        step: jax.Array | None = None,
    ) -> tuple[jax.Array, dict[str, jax.Array]]:
        """Runs the backbone on ``x [B, T, Dx]``; returns ``(z [B, T, D], aux)``.

        ``aux``: ``nfe`` (forward cell evaluations; batch mean for the DEQ), ``rel_residual``
        (the DEQ's final ``‖f(z) - z‖ / ‖f(z)‖``, batch mean; NaN for explicit models; the DEQ
        adds the rest of ``dq.solvers.summarize``), the JR
        entries ``jr`` (the term to add to the loss), ``jr/frobenius_sq``, ``jr/applied`` (zeros
        for explicit models) and, when ``mems`` is given, ``new_mems`` (module docstring).

        Args:
          x: embeddings ``[B, T, Dx]``.
          mems: ``None``; ``[B, M, D]`` (the DEQ's memory; for explicit models shared by all
            layers); or ``[depth, B, M, D]`` for explicit models (layer ``l`` attends to
            ``mems[l]``).
          is_training: the DEQ's solver vs eval solver; dropout; the JR penalty.
          step: the training step, for a ``deq.regularizer`` whose ``gamma`` is a schedule.

        Raises:
          ValueError: for a memory of the wrong rank or depth.
        """
        if self.kind == "deq":
            return self._deq(x, mems, is_training, step)
        return self._explicit(x, mems, is_training)

    def _deq(self, x, mems, is_training, step):
        if mems is not None and mems.ndim != 3:
            raise ValueError(f"mems of the DEQ must be [B, M, D], got shape {mems.shape}.")
        x_cell = sequence_cells.cell_input(self.cell, x, mems)
        out, jr = self.deq_settings.solve(self._cell(), x_cell, is_training=is_training, step=step)
        aux = summarize(out.solution) | jr  # nfe, rel_residual (batch means), ...
        if mems is not None:
            aux["new_mems"] = jax.lax.stop_gradient(out.z_star)
        return out.z_star, aux

    def _explicit(self, x, mems, is_training):
        depth = self.depth
        if mems is not None and mems.ndim not in (3, 4):
            raise ValueError(f"mems must be [B, M, D] or [depth, B, M, D], got {mems.shape}.")
        if mems is not None and mems.ndim == 4 and mems.shape[0] != depth:
            raise ValueError(f"per-layer mems must be [depth={depth}, B, M, D], got {mems.shape}.")
        layer_mems = [
            None if mems is None else (mems[i] if mems.ndim == 4 else mems) for i in range(depth)
        ]
        if self.kind == "tied":
            cells = [self._cell()] * depth
        else:
            cells = [self._cell(name=f"layer{i}") for i in range(depth)]
        z = jnp.zeros(x.shape[:2] + (self.d_model,), x.dtype)
        layer_inputs = []
        for f, mem in zip(cells, layer_mems):
            layer_inputs.append(z)
            z = f(z, sequence_cells.cell_input(self.cell, x, mem), is_training=is_training)
        zero = jnp.zeros((), x.dtype)
        aux = {
            "nfe": jnp.asarray(float(depth), jnp.float32),
            "rel_residual": jnp.full((), jnp.nan, jnp.float32),
        } | dict.fromkeys(deq_settings.JR_KEYS, zero)
        if mems is not None:
            aux["new_mems"] = jax.lax.stop_gradient(jnp.stack(layer_inputs))  # [depth, B, T, D]
        return z, aux
