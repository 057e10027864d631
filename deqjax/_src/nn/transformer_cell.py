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
from deqjax._src.cells import relative_attention as rel_attn
from deqjax._src.nn import norms, variational_dropout, weight_norm
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


class _Weights(NamedTuple):
    """The layer's weights: attention ``W_Q, W_K, W_V, W_O`` ``[D, D]``, FFN ``W_1`` ``[D, F]``,
    ``W_2`` ``[F, D]``, biases ``b_O`` ``[D]``, ``b_1`` ``[F]``, ``b_2`` ``[D]``, and the content
    and position biases ``u, v`` ``[H, Dh]``."""

    w_q: jax.Array
    w_k: jax.Array
    w_v: jax.Array
    w_o: jax.Array
    w_1: jax.Array
    w_2: jax.Array
    b_o: jax.Array
    b_1: jax.Array
    b_2: jax.Array
    u_bias: jax.Array
    v_bias: jax.Array


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
        self._check_shapes(z, inputs, mems)
        b, t, d = z.shape
        drop = self.dropout if is_training else 0.0
        ln_attn = norms.LayerNorm(name="ln_attn")
        ln_ffn = norms.LayerNorm(name="ln_ffn")
        # ---- once per forward pass: weights, injection, positions, memory keys/values ----------
        w = self._weights(z.dtype)
        inject = per_forward("injection", lambda: self._injection(inputs, z.dtype))  # [B, T, 3, D]
        m = 0 if mems is None else mems.shape[1]
        r = per_forward("relative_embedding", lambda: self._relative_embedding(m + t, z.dtype))
        if mems is not None:

            def memory_kv():
                mem_in = ln_attn(mems) if self.pre_ln else mems  # [B, M, D]
                return mem_in @ w.w_k, mem_in @ w.w_v  # [B, M, D] each

            memory = per_forward("memory_kv", memory_kv)
        # ---- per solver step ----------------------------------------------------------------
        z_in = ln_attn(z) if self.pre_ln else z  # [B, T, D]
        a = self._attention(z_in, inject, None if mems is None else memory, r, w, drop)
        y = z + a if self.pre_ln else ln_attn(z + a)  # [B, T, D]
        # pre-LN: the FFN's skip path starts after LN₂ (JR paper's DEQ-Transformer code), so the
        # output LN₂(y) + FFN(LN₂(y)) does not carry the scale of z (see the module docstring).
        y_in = ln_ffn(y) if self.pre_ln else y  # [B, T, D]
        hidden = jax.nn.relu(y_in @ w.w_1 + w.b_1[None, None])  # [B, T, F]
        hidden = variational_dropout.time_shared_dropout("drop_ff1", hidden, drop)
        ff = hidden @ w.w_2 + w.b_2[None, None]  # [B, T, D]
        ff = variational_dropout.time_shared_dropout("drop_ff2", ff, drop)
        return y_in + ff if self.pre_ln else ln_ffn(y + ff)  # [B, T, D]

    def _check_shapes(self, z: jax.Array, inputs: jax.Array, mems: jax.Array | None) -> None:
        d = self.d_model
        if inputs.ndim != 3:
            raise ValueError(f"x must be [B, T, Dx], got shape {inputs.shape}.")
        b, t, _ = inputs.shape
        if z.shape != (b, t, d):
            raise ValueError(f"z must be [B, T, D] = {(b, t, d)}, got shape {z.shape}.")
        if mems is not None and (mems.ndim != 3 or mems.shape[0] != b or mems.shape[2] != d):
            raise ValueError(f"mems must be [B, M, D] with B={b}, D={d}, got shape {mems.shape}.")

    @hk.transparent
    def _weights(self, dtype: Any) -> _Weights:
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
        return _Weights(
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
        return jnp.stack([inputs @ w for w in ws], axis=2) + b_x[None, None]  # [B, T, 3, D]

    @hk.transparent
    def _relative_embedding(self, length: int, dtype: Any) -> jax.Array:
        """The projected sinusoidal embeddings of the ``length`` distances: ``[K, H, Dh]``."""
        d = self.d_model
        init = self.attn_w_init or hk.initializers.RandomNormal(_PAPER_STDDEV)
        w_r = hk.get_parameter("w_r", (d, d), dtype, init=init)  # [D, D] (no weight norm)
        pos = rel_attn.relative_positions(length, dtype)  # [K]
        r = rel_attn.sinusoidal_embedding(pos, d) @ w_r  # [K, D]
        return r.reshape(length, self.num_heads, self.d_head)

    @hk.transparent
    def _attention(
        self,
        z_in: jax.Array,
        inject: jax.Array,
        memory: tuple[jax.Array, jax.Array] | None,
        r: jax.Array,
        w: _Weights,
        drop: float,
    ) -> jax.Array:
        """Relative self-attention over the memory and the segment, output projected: ``[B, T,
        D]``; ``memory``: the memory's keys and values, ``[B, M, D]`` each."""
        b, t, d = z_in.shape
        h, dh = self.num_heads, self.d_head
        q = z_in @ w.w_q + inject[:, :, 0]  # [B, T, D]
        k = z_in @ w.w_k + inject[:, :, 1]  # [B, T, D]
        v = z_in @ w.w_v + inject[:, :, 2]  # [B, T, D]
        if memory is not None:
            k = jnp.concatenate([memory[0], k], axis=1)  # [B, M+T, D]
            v = jnp.concatenate([memory[1], v], axis=1)  # [B, M+T, D]
        q = variational_dropout.time_shared_dropout("drop_q", q, drop)
        k = variational_dropout.time_shared_dropout("drop_k", k, drop)
        v = variational_dropout.time_shared_dropout("drop_v", v, drop)
        kk = k.shape[1]
        attn = rel_attn.relative_attention(
            q.reshape(b, t, h, dh),
            k.reshape(b, kk, h, dh),
            v.reshape(b, kk, h, dh),
            r,
            w.u_bias,
            w.v_bias,
        )  # [B, T, H, Dh]
        a = attn.reshape(b, t, d) @ w.w_o + w.b_o[None, None]  # [B, T, D]
        return variational_dropout.time_shared_dropout("drop_attn", a, drop)
