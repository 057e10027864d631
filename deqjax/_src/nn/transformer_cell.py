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
"""

from __future__ import annotations

from typing import Any, NamedTuple

import haiku as hk
import jax
import jax.numpy as jnp

from deqjax._src import checks
from deqjax._src.nn import norms, variational_dropout, weight_norm
from deqjax._src.nn import relative_attention as rel_attn
from deqjax._src.nn.per_forward import per_forward

Initializer = Any  # hk.initializers.Initializer or any (shape, dtype) -> array callable

# JR paper App. A.4 / DEQ code: every weight starts from N(0, 0.01).
_PAPER_STDDEV = 0.01


class TransformerInput(NamedTuple):
    """The input of :class:`TransformerCell` when it carries a memory.

    Attributes:
      x: ``[B, T, Dx]`` the segment's input embeddings (injected into Q, K, V).
      mems: ``[B, M, D]`` the previous segment's equilibrium (its last ``M`` positions) or ``None``.
    """

    x: jax.Array
    mems: jax.Array | None = None


def _check_initializer(value: Any, name: str) -> None:
    if value is not None and not callable(value):
        raise ValueError(
            f"{name} must be an initializer (callable (shape, dtype)) or None, got {value!r}."
        )


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
        checks.check_positive_int(d_model, "d_model")
        checks.check_positive_int(num_heads, "num_heads")
        if d_model % 2:
            raise ValueError(
                f"d_model must be even (sinusoidal relative embeddings), got {d_model}."
            )
        if d_model % num_heads:
            raise ValueError(f"num_heads={num_heads} must divide d_model={d_model}.")
        if d_ff is None:
            d_ff = 4 * d_model
        checks.check_positive_int(d_ff, "d_ff")
        checks.check_bool(pre_ln, "pre_ln")
        checks.check_bool(weight_norm, "weight_norm")
        _check_initializer(w_init, "w_init")
        _check_initializer(attn_w_init, "attn_w_init")
        _check_initializer(inject_w_init, "inject_w_init")
        self.d_model = d_model
        self.num_heads = num_heads
        self.d_head = d_model // num_heads
        self.d_ff = d_ff
        self.dropout = variational_dropout.check_rate(dropout, "dropout")
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
        inputs, mems = (x.x, x.mems) if isinstance(x, TransformerInput) else (x, None)
        d, h, dh = self.d_model, self.num_heads, self.d_head
        if inputs.ndim != 3:
            raise ValueError(f"x must be [B, T, Dx], got shape {inputs.shape}.")
        b, t, dx = inputs.shape
        if z.shape != (b, t, d):
            raise ValueError(f"z must be [B, T, D] = {(b, t, d)}, got shape {z.shape}.")
        if mems is not None and (mems.ndim != 3 or mems.shape[0] != b or mems.shape[2] != d):
            raise ValueError(f"mems must be [B, M, D] with B={b}, D={d}, got shape {mems.shape}.")
        dtype = z.dtype
        paper_init = hk.initializers.RandomNormal(_PAPER_STDDEV)
        ffn_init = self.w_init or paper_init
        attn_init = self.attn_w_init or paper_init
        inject_init = self.inject_w_init or paper_init
        drop = self.dropout if is_training else 0.0

        ln_attn = norms.LayerNorm(name="ln_attn")
        ln_ffn = norms.LayerNorm(name="ln_ffn")

        def weight(name, shape, init):  # plain or weight-normed, computed once per forward
            return weight_norm.get_weight(
                name, shape, dtype, w_init=init, weight_norm=self.weight_norm
            )

        # ---- once per forward pass: weights, injection, positions, memory keys/values ----------
        w_q = weight("w_q", (d, d), attn_init)  # [D, D]
        w_k = weight("w_k", (d, d), attn_init)  # [D, D]
        w_v = weight("w_v", (d, d), attn_init)  # [D, D]
        w_o = weight("w_o", (d, d), attn_init)  # [D, D]
        w_1 = weight("w_ff1", (d, self.d_ff), ffn_init)  # [D, F]
        w_2 = weight("w_ff2", (self.d_ff, d), ffn_init)  # [F, D]
        b_o = hk.get_parameter("b_o", (d,), dtype, init=jnp.zeros)  # [D]
        b_1 = hk.get_parameter("b_ff1", (self.d_ff,), dtype, init=jnp.zeros)  # [F]
        b_2 = hk.get_parameter("b_ff2", (d,), dtype, init=jnp.zeros)  # [D]
        bias_init = hk.initializers.RandomUniform(-0.05, 0.05)  # as the DEQ-Transformer code
        u_bias = hk.get_parameter("u_bias", (h, dh), dtype, init=bias_init)  # [H, Dh]
        v_bias = hk.get_parameter("v_bias", (h, dh), dtype, init=bias_init)  # [H, Dh]

        def injection():
            ws = [
                hk.get_parameter(f"w_inject_{n}", (dx, d), dtype, init=inject_init) for n in "qkv"
            ]
            b_x = hk.get_parameter("b_inject", (3, d), dtype, init=jnp.zeros)  # [3, D]
            return jnp.stack([inputs @ w for w in ws], axis=2) + b_x[None, None]  # [B, T, 3, D]

        inject = per_forward("injection", injection)  # [B, T, 3, D]
        m = 0 if mems is None else mems.shape[1]

        def relative_embedding():
            w_r = hk.get_parameter("w_r", (d, d), dtype, init=attn_init)  # [D, D] (no weight norm)
            pos = rel_attn.relative_positions(m + t, dtype)  # [K]
            return rel_attn.sinusoidal_embedding(pos, d) @ w_r  # [K, D]

        r = per_forward("relative_embedding", relative_embedding).reshape(m + t, h, dh)

        if mems is not None:

            def memory_kv():
                mem_in = ln_attn(mems) if self.pre_ln else mems  # [B, M, D]
                return mem_in @ w_k, mem_in @ w_v  # [B, M, D] each

            k_mem, v_mem = per_forward("memory_kv", memory_kv)

        # ---- per solver step ----------------------------------------------------------------
        z_in = ln_attn(z) if self.pre_ln else z  # [B, T, D]
        q = z_in @ w_q + inject[:, :, 0]  # [B, T, D]
        k = z_in @ w_k + inject[:, :, 1]  # [B, T, D]
        v = z_in @ w_v + inject[:, :, 2]  # [B, T, D]
        if mems is not None:
            k = jnp.concatenate([k_mem, k], axis=1)  # [B, M+T, D]
            v = jnp.concatenate([v_mem, v], axis=1)  # [B, M+T, D]
        q = variational_dropout.time_shared_dropout("drop_q", q, drop)
        k = variational_dropout.time_shared_dropout("drop_k", k, drop)
        v = variational_dropout.time_shared_dropout("drop_v", v, drop)
        attn = rel_attn.relative_attention(
            q.reshape(b, t, h, dh),
            k.reshape(b, m + t, h, dh),
            v.reshape(b, m + t, h, dh),
            r,
            u_bias,
            v_bias,
        )  # [B, T, H, Dh]
        a = attn.reshape(b, t, d) @ w_o + b_o[None, None]  # [B, T, D]
        a = variational_dropout.time_shared_dropout("drop_attn", a, drop)
        y = z + a if self.pre_ln else ln_attn(z + a)  # [B, T, D]

        # pre-LN: the FFN's skip path starts after LN₂ (JR paper's DEQ-Transformer code), so the
        # output LN₂(y) + FFN(LN₂(y)) does not carry the scale of z (see the module docstring).
        y_in = ln_ffn(y) if self.pre_ln else y  # [B, T, D]
        hidden = jax.nn.relu(y_in @ w_1 + b_1[None, None])  # [B, T, F]
        hidden = variational_dropout.time_shared_dropout("drop_ff1", hidden, drop)
        ff = hidden @ w_2 + b_2[None, None]  # [B, T, D]
        ff = variational_dropout.time_shared_dropout("drop_ff2", ff, drop)
        return y_in + ff if self.pre_ln else ln_ffn(y + ff)  # [B, T, D]
