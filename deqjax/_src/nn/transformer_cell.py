"""The DEQ-Transformer cell: weight-tied relative-position self-attention + FFN, input injection.

DEQ paper §4 ("Weight-tied transformers"): ``x̃ = x W_x`` and

    f_θ(z; x) = LN(φ(LN(SelfAttention(z W_QKV + x̃; PE)))),   φ(y) = y + FFN(y)

with the Transformer-XL relative positional attention and memory ``[z*_{-M:}, z]`` of the previous
segment's equilibrium. The JR paper (§3.3, Fig. 2, after Xiong et al. 2020) compares two placements
of the LayerNorms; this cell implements both (``pre_ln``)::

    post-LN (default; the DEQ paper's layer)       pre-LN
    a = Attn(z W_QKV + x̃)                         a = Attn(LN₁(z) W_QKV + x̃)
    y = LN₁(z + a)                                 y = z + a
    out = LN₂(y + FFN(y))                          out = LN₂(y) + FFN(LN₂(y))

so the post-LN output is layer-normalised (bounded range; JR paper: the LN "at the end of the layer"
the stable large DEQs rely on) and the pre-LN output is not (no LN after its last sum); in pre-LN
the memory is normalised by the same ``LN₁`` before its key/value projection.

The pre-LN FFN's skip path starts after ``LN₂``, as in the JR paper's DEQ-Transformer code (its
position-wise FFN normalises its input, then adds the FFN output to the normalised input). The
textbook pre-LN ``out = y + FFN(LN₂(y))`` (Xiong et al. 2020) makes ``f(z) = z + g(z/‖z‖)`` in a
DEQ: the relative residual ``‖g‖ / ‖z + g‖`` falls as ``‖z‖`` grows, so the solver "converges" by
inflating ``z*``, ``J = I + O(1/‖z‖)`` (‖J‖²_F/d pinned at 1) and the model cannot train
(REPRODUCTION.md, claim 5).

The equations are the framework-free cell's (:mod:`deqjax._src.cells.transformer`), which the Flax
NNX and Equinox ``TransformerCell`` compute with too; this module owns the Haiku parameters.
"""

from __future__ import annotations

from typing import Any

import haiku as hk
import jax
import jax.numpy as jnp

from deqjax._src.cells import transformer
from deqjax._src.cells.transformer import TransformerInput
from deqjax._src.nn import norms, variational_dropout, weight_norm
from deqjax._src.nn.per_forward import per_forward

Initializer = Any  # hk.initializers.Initializer or any (shape, dtype) -> array callable

_PAPER_STDDEV = transformer.PAPER_STDDEV  # JR paper App. A.4: every weight from N(0, 0.01)


class TransformerCell(hk.Module):
    """One weight-tied DEQ-Transformer layer ``f_θ(z; x)`` (DEQ paper §4; JR paper Fig. 2).

    Multi-head causal self-attention with Transformer-XL relative positions (sinusoidal relative
    embeddings projected by ``W_R``, content bias ``u`` and position bias ``v``:
    ``A_ij = (q_i + u)·k_j + (q_i + v)·W_R R_{i-j}``) over the optional memory ``mems`` followed by
    the current segment, then a 2-layer ReLU FFN; the input injection ``x̃ = x W_x + b_x`` (three
    ``[Dx, D]`` maps, one each for Q, K and V) is added to the current positions' queries, keys and
    values. LayerNorm placement is post-LN (default) or pre-LN, as drawn in JR Fig. 2 (see the
    module docstring). Causal: output ``t`` depends only on the memory and on ``z``, ``x`` at
    positions ``<= t``.

    Computed once per DEQ forward pass (``dq.nn.per_forward``), not per solver step: the weight
    normalisation, the dropout masks, the injection ``x̃``, the projected relative embeddings and
    the memory's keys and values (the memory does not depend on ``z``). Memory positions get no
    injection: the stored equilibrium already is a function of its own segment's input.

    Paper defaults (JR paper Table 4, WikiText-103): ``d_model=700``, sequence length 150,
    recurrent (variational) dropout 0.06, weight norm on, LayerNorm; every weight initialised from
    ``N(0, 0.01)`` (JR App. A.4). ``d_ff`` defaults to ``4 * d_model`` (Vaswani et al. 2017).

    Args:
      d_model: state width ``D`` (the equilibrium ``z`` is ``[B, T, D]``); even (sinusoids).
      num_heads: attention heads ``H``; must divide ``d_model``.
      d_ff: FFN hidden width (``None``: ``4 * d_model``). Square-only ``w_init`` families (e.g.
        ``dq.initializers.GOE``) need ``d_ff == d_model``, as in the init paper's GOE runs.
      dropout: variational dropout rate in ``[0, 1)`` on the attention inputs (Q, K, V), the
        attention output and both FFN layers' outputs; one mask per forward pass, shared over
        time and held fixed across solver iterations; active only when ``is_training``.
      pre_ln: ``False`` (default): post-LN; ``True``: pre-LN (JR Fig. 2).
      weight_norm: weight-normalise ``W_Q, W_K, W_V, W_O`` and both FFN weights (JR Table 4).
      w_init: initializer of the FFN weights ``[D, d_ff]`` and ``[d_ff, D]`` (the "dense layers"
        the init paper initialises from random-matrix ensembles); ``None``: ``N(0, 0.01)``.
      attn_w_init: initializer of ``W_Q, W_K, W_V, W_O, W_R`` (each ``[D, D]``); ``None``:
        ``N(0, 0.01)``.
      inject_w_init: initializer of the injection ``W_x`` (three ``[Dx, D]``); ``None``:
        ``N(0, 0.01)``.
      name: Haiku module name.

    Raises:
      ValueError: naming the argument, for a non-positive or non-int ``d_model``, ``num_heads``,
        ``d_ff``; an odd ``d_model``; ``num_heads`` not dividing ``d_model``; ``dropout`` outside
        ``[0, 1)``; a non-bool ``pre_ln`` or ``weight_norm``; a non-callable initializer.

    Example:
      >>> def forward(x, mems):  # x: [B, T, Dx] embeddings, mems: [B, M, 64]
      ...     cell = dq.nn.TransformerCell(64, num_heads=4, dropout=0.06)
      ...     deq = dq.nn.DEQ(cell, solver=dq.solvers.Anderson(max_steps=12))
      ...     z_star, sol = deq(dq.nn.TransformerInput(x, mems))
      ...     return z_star  # [B, T, 64]; its last M positions are the next segment's mems
    """

    def __init__(
        self,
        d_model: int,
        *,
        num_heads: int,
        d_ff: int | None = None,
        dropout: float = 0.0,
        pre_ln: bool = False,
        weight_norm: bool = True,
        w_init: Initializer | None = None,
        attn_w_init: Initializer | None = None,
        inject_w_init: Initializer | None = None,
        name: str | None = None,
    ):
        super().__init__(name=name)
        d_ff, dropout = transformer.check_settings(
            d_model,
            num_heads,
            d_ff,
            dropout,
            pre_ln=pre_ln,
            weight_norm=weight_norm,
            initializers={
                "w_init": w_init,
                "attn_w_init": attn_w_init,
                "inject_w_init": inject_w_init,
            },
        )
        self.d_model = d_model
        self.num_heads = num_heads
        self.d_head = d_model // num_heads
        self.d_ff = d_ff
        self.dropout = dropout
        self.pre_ln = pre_ln
        self.weight_norm = weight_norm
        self.w_init = w_init
        self.attn_w_init = attn_w_init
        self.inject_w_init = inject_w_init

    def initial_state(self, x: jax.Array | TransformerInput) -> jax.Array:
        """Zeros ``[B, T, D]`` (the DEQ paper's ``z^[0] = 0``), in the input's dtype."""
        inputs = x.x if isinstance(x, TransformerInput) else x
        return jnp.zeros(inputs.shape[:2] + (self.d_model,), inputs.dtype)

    def __call__(
        self, z: jax.Array, x: jax.Array | TransformerInput, *, is_training: bool = False
    ) -> jax.Array:
        """One application ``f_θ(z; x)``.

        Args:
          z: ``[B, T, D]`` state.
          x: ``[B, T, Dx]`` input, or ``TransformerInput(x, mems)`` with ``mems`` ``[B, M, D]``.
          is_training: dropout is applied only when ``True`` (``DEQ`` passes it; direct calls
            default to eval).

        Returns:
          ``[B, T, D]`` the new state.
        """
        inputs, mems = transformer.split_input(x)
        transformer.check_shapes(z.shape, inputs, mems, self.d_model)
        t = z.shape[1]
        drop = self.dropout if is_training else 0.0
        ln_attn = norms.LayerNorm(name="ln_attn")
        ln_ffn = norms.LayerNorm(name="ln_ffn")
        # ---- once per forward pass: weights, injection, positions, memory keys/values ----------
        w = self._weights(z.dtype)
        inject = per_forward("injection", lambda: self._injection(inputs, z.dtype))  # [B, T, 3, D]
        m = 0 if mems is None else mems.shape[1]
        r = per_forward("relative_embedding", lambda: self._relative_embedding(m + t, z.dtype))
        memory = None
        if mems is not None:
            memory = per_forward(
                "memory_kv", lambda: transformer.memory_kv(mems, w, ln_attn, self.pre_ln)
            )
        # ---- per solver step: the framework-free cell's equations ------------------------------
        return transformer.equations(
            z,
            inject,
            memory,
            r,
            w,
            num_heads=self.num_heads,
            pre_ln=self.pre_ln,
            ln_attn=ln_attn,
            ln_ffn=ln_ffn,
            drop=lambda name, v: variational_dropout.time_shared_dropout(name, v, drop),
        )

    @hk.transparent
    def _weights(self, dtype: Any) -> transformer.Weights:
        """The layer's weights (plain or weight-normed, computed once per forward) and biases."""
        d, f, h, dh = self.d_model, self.d_ff, self.num_heads, self.d_head
        paper_init = hk.initializers.RandomNormal(_PAPER_STDDEV)
        ffn_init = self.w_init or paper_init
        attn_init = self.attn_w_init or paper_init

        def weight(name, shape, init):
            return weight_norm.get_weight(
                name, shape, dtype, w_init=init, weight_norm=self.weight_norm
            )

        bias_init = hk.initializers.RandomUniform(-0.05, 0.05)  # as the DEQ-Transformer code
        return transformer.Weights(
            w_q=weight("w_q", (d, d), attn_init),
            w_k=weight("w_k", (d, d), attn_init),
            w_v=weight("w_v", (d, d), attn_init),
            w_o=weight("w_o", (d, d), attn_init),
            w_1=weight("w_ff1", (d, f), ffn_init),
            w_2=weight("w_ff2", (f, d), ffn_init),
            b_o=hk.get_parameter("b_o", (d,), dtype, init=jnp.zeros),
            b_1=hk.get_parameter("b_ff1", (f,), dtype, init=jnp.zeros),
            b_2=hk.get_parameter("b_ff2", (d,), dtype, init=jnp.zeros),
            u_bias=hk.get_parameter("u_bias", (h, dh), dtype, init=bias_init),
            v_bias=hk.get_parameter("v_bias", (h, dh), dtype, init=bias_init),
        )

    @hk.transparent
    def _injection(self, inputs: jax.Array, dtype: Any) -> jax.Array:
        """``x̃ = x W_x + b_x`` for Q, K and V: ``[B, T, 3, D]``."""
        d, dx = self.d_model, inputs.shape[-1]
        init = self.inject_w_init or hk.initializers.RandomNormal(_PAPER_STDDEV)
        ws = [hk.get_parameter(f"w_inject_{n}", (dx, d), dtype, init=init) for n in "qkv"]
        b_x = hk.get_parameter("b_inject", (3, d), dtype, init=jnp.zeros)  # [3, D]
        return transformer.injection(ws, b_x, inputs)  # [B, T, 3, D]

    @hk.transparent
    def _relative_embedding(self, length: int, dtype: Any) -> jax.Array:
        """The projected sinusoidal embeddings of the ``length`` distances: ``[K, H, Dh]``."""
        d = self.d_model
        init = self.attn_w_init or hk.initializers.RandomNormal(_PAPER_STDDEV)
        w_r = hk.get_parameter("w_r", (d, d), dtype, init=init)  # [D, D] (no weight norm)
        return transformer.relative_embedding(w_r, length, self.num_heads)  # [K, H, Dh]
