"""The cells of the sequence models: a DEQ-Transformer or a DEQ-TrellisNet layer (DEQ paper §4),
built from a cell name, and the input each takes.

``"transformer"``: :class:`~deqjax.nn.TransformerCell` (``d_ff = 2 d_model``; the memory is
attended to). ``"trellis"``: :class:`~deqjax.nn.TrellisCell` with ``d_model // 2`` hidden units,
state ``[h; c]``; the memory's last position is its history padding. A trellis cell of kernel
``k`` moves information ``k - 1`` positions per evaluation, so ``n`` evaluations (solver steps or
layers) see ``n (k - 1)`` positions back (:func:`trellis_reach`).
"""

from __future__ import annotations

from typing import Any

import haiku as hk
import jax

from deqjax._src.nn import transformer_cell, trellis_cell

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
