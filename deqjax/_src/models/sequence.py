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
``[B, T, D]`` for the DEQ, ``[depth, B, T, D]`` for the explicit models; :func:`next_memory` keeps
the last ``M`` positions), gradient stopped. Carrying it costs ``depth`` times more for the
explicit models: the DEQ paper's memory claim covers the carried state as well as the activations.

Cells: ``"transformer"`` (:class:`~deqjax.nn.TransformerCell`, ``d_ff = 2 d_model``; memory is
attended to) or ``"trellis"`` (:class:`~deqjax.nn.TrellisCell` with ``d_model // 2`` hidden units,
state ``[h; c]``; the memory's last position is its history padding). A trellis cell of kernel
``k`` moves information ``k - 1`` positions per evaluation, so ``n`` evaluations (solver steps or
layers) see ``n (k - 1)`` positions back (:func:`trellis_reach`).
"""

from __future__ import annotations

from typing import Any

import haiku as hk
import jax
import jax.numpy as jnp

from deqjax._src import adjoints, checks
from deqjax._src import jacobian_regularization as jr_lib
from deqjax._src.models import jr_aux
from deqjax._src.nn import deq as deq_lib
from deqjax._src.nn import transformer_cell, trellis_cell
from deqjax._src.solvers import anderson as anderson_lib
from deqjax._src.solvers import base, summary

KINDS = ("deq", "tied", "untied")
CELLS = ("transformer", "trellis")


def sequence_cell(
    cell: str,
    *,
    d_model: int,
    num_heads: int = 4,
    pre_ln: bool = False,
    trellis_kernel: int = 2,
    d_ff: int | None = None,
    ffn_init: hk.initializers.Initializer | None = None,
    name: str | None = None,
) -> hk.Module:
    """A transformer or trellis cell whose state has ``d_model`` features (call inside a
    transform).

    ``d_ff`` (``None``: ``2 * d_model``) and ``ffn_init`` (the FFN weights' initializer, e.g.
    ``dq.initializers.GOE(2.0)`` for the init paper's §4.3; ``None``: the JR paper's
    ``N(0, 0.01)``) are the transformer cell's; the trellis cell takes neither.

    Raises:
      ValueError: if ``cell`` is not one of :data:`CELLS`, or ``d_ff``/``ffn_init`` is given to
        the trellis cell.
    """
    if cell == "transformer":
        d_ff = 2 * d_model if d_ff is None else d_ff
        return transformer_cell.TransformerCell(
            d_model, num_heads=num_heads, d_ff=d_ff, pre_ln=pre_ln, w_init=ffn_init, name=name
        )
    if cell == "trellis":
        if d_ff is not None or ffn_init is not None:
            raise ValueError("d_ff and ffn_init are transformer-cell options; cell is 'trellis'.")
        return trellis_cell.TrellisCell(d_model // 2, kernel_size=trellis_kernel, name=name)
    raise ValueError(f"cell must be one of {CELLS}, got {cell!r}.")


def cell_input(cell: str, x: jax.Array, mems: jax.Array | None) -> Any:
    """The cell's input for embeddings ``x`` and a ``[B, M, D]`` memory (or ``None``)."""
    if cell == "transformer":
        return transformer_cell.TransformerInput(x, mems)
    if mems is None:
        return trellis_cell.TrellisInput(x)
    return trellis_cell.TrellisInput(x, history=mems[:, -1:])


def trellis_reach(num_evals: int, kernel_size: int) -> int:
    """How many positions back ``num_evals`` trellis evaluations can carry information.

    One evaluation reads the hidden states ``k - 1`` positions back through the causal
    convolution of kernel ``k`` and the cell state one position back, so information moves at most
    ``k - 1`` positions per evaluation, whether the evaluations are explicit layers or DEQ solver
    steps (a solver's iterates are built from evaluations only).
    """
    return num_evals * (kernel_size - 1)


def memory_shape(
    kind: str, *, batch_size: int, memory_length: int, d_model: int, depth: int
) -> tuple[int, ...]:
    """The carried memory's shape: ``[B, M, D]`` (DEQ) or ``[depth, B, M, D]`` (explicit)."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}.")
    shape = (batch_size, memory_length, d_model)
    return shape if kind == "deq" else (depth,) + shape


def initial_memory(
    kind: str,
    *,
    batch_size: int,
    memory_length: int,
    d_model: int,
    depth: int,
    dtype: Any = jnp.float32,
) -> jax.Array:
    """Zero memory before a stream's first segment (shape :func:`memory_shape`)."""
    shape = memory_shape(
        kind, batch_size=batch_size, memory_length=memory_length, d_model=d_model, depth=depth
    )
    return jnp.zeros(shape, dtype)


def next_memory(new_mems: jax.Array, memory_length: int) -> jax.Array:
    """The next segment's memory: the last ``memory_length`` positions of ``aux["new_mems"]``."""
    return new_mems[..., -memory_length:, :]


def reset_memory(mems: jax.Array, reset: jax.Array) -> jax.Array:
    """``mems`` with the streams flagged by ``reset [B]`` (bool) set to zero: the memory of a
    stream whose new pass begins (``dq.data.LMBatches``' ``batch["reset"]``). ``mems`` is
    ``[B, M, D]`` or ``[depth, B, M, D]``.

    Raises:
      ValueError: if ``mems`` is neither, or its batch axis differs from ``reset``'s.
    """
    if mems.ndim not in (3, 4) or mems.shape[mems.ndim - 3] != reset.shape[0]:
        raise ValueError(
            f"mems must be [B, M, D] or [depth, B, M, D] with B = reset's {reset.shape[0]}, got "
            f"shape {mems.shape}."
        )
    flag = reset[:, None, None] if mems.ndim == 3 else reset[None, :, None, None]
    return jnp.where(flag, jnp.zeros_like(mems), mems)


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
      solver: the DEQ's forward solver (``None``: ``dq.nn.DEQ``'s default, Anderson).
      eval_solver: the DEQ's solver when ``is_training=False`` (``None``: ``solver``).
      adjoint: the DEQ's gradient strategy (``None``: ``dq.ImplicitAdjoint()``).
      regularizer: JR penalty of the DEQ when ``is_training`` (``None``: none; explicit models
        report zeros).
      name: Haiku module name.

    Raises:
      ValueError: for an unknown ``kind`` or ``cell``, ``depth < 1`` or a ``regularizer`` that
        is not a ``JacobianRegularizer``.
    """

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
        solver: base.Solver | None = None,
        eval_solver: base.Solver | None = None,
        adjoint: adjoints.Adjoint | None = None,
        regularizer: jr_lib.JacobianRegularizer | None = None,
        name: str | None = None,
    ):
        super().__init__(name=name)
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {kind!r}.")
        if cell not in CELLS:
            raise ValueError(f"cell must be one of {CELLS}, got {cell!r}.")
        checks.check_positive_int(depth, "depth")
        jr_aux.check_regularizer(regularizer)
        self.kind = kind
        self.cell = cell
        self.d_model = d_model
        self.num_heads = num_heads
        self.depth = depth
        self.pre_ln = pre_ln
        self.trellis_kernel = trellis_kernel
        self.d_ff = d_ff
        self.ffn_init = ffn_init
        self.solver = anderson_lib.anderson if solver is None else solver
        self.eval_solver = eval_solver
        self.adjoint = adjoint
        self.regularizer = regularizer

    def _cell(self, name: str | None = None) -> hk.Module:
        return sequence_cell(
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
          step: the training step, for a ``regularizer`` whose ``gamma`` is a schedule.

        Raises:
          ValueError: for a memory of the wrong rank or depth.
        """
        if self.kind == "deq":
            return self._deq(x, mems, is_training, step)
        return self._explicit(x, mems, is_training)

    def _deq(self, x, mems, is_training, step):
        if mems is not None and mems.ndim != 3:
            raise ValueError(f"mems of the DEQ must be [B, M, D], got shape {mems.shape}.")
        deq = deq_lib.DEQ(
            self._cell(), solver=self.solver, eval_solver=self.eval_solver, adjoint=self.adjoint
        )
        out = deq.solve(cell_input(self.cell, x, mems), is_training=is_training)
        aux = summary.summarize(out.solution)  # nfe, rel_residual (batch means), ...
        aux.update(jr_aux.jr_terms(self.regularizer, out, is_training, step))
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
            z = f(z, cell_input(self.cell, x, mem), is_training=is_training)
        zero = jnp.zeros((), x.dtype)
        aux = {
            "nfe": jnp.asarray(float(depth), jnp.float32),
            "rel_residual": jnp.full((), jnp.nan, jnp.float32),
        } | dict.fromkeys(jr_aux.KEYS, zero)
        if mems is not None:
            aux["new_mems"] = jax.lax.stop_gradient(jnp.stack(layer_inputs))  # [depth, B, T, D]
        return z, aux
