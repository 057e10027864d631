"""The DEQ-Transformer cell as pure functions of a parameter pytree (DEQ paper §4; JR paper
Fig. 2), the one definition every framework's ``TransformerCell`` computes with.

``x̃ = x W_x + b_x`` and, post-LN (default) or pre-LN (see ``dq.nn.TransformerCell``)::

    post-LN                                      pre-LN
    a = Attn(z W_QKV + x̃)                       a = Attn(LN₁(z) W_QKV + x̃)
    y = LN₁(z + a)                               y = z + a
    out = LN₂(y + FFN(y))                        out = LN₂(y) + FFN(LN₂(y))

with Transformer-XL relative attention over the memory ``[z*_{-M:}, z]``. Parameters (the names
of the Haiku cell's): ``w_q, w_k, w_v, w_o`` ``[D, D]``, ``w_ff1`` ``[D, F]``, ``w_ff2`` ``[F, D]``
(each an array, or ``{"v", "g"}`` when weight-normalised), ``b_o``, ``b_ff1``, ``b_ff2``,
``u_bias``, ``v_bias`` ``[H, Dh]``, ``w_inject_q/k/v`` ``[Dx, D]``, ``b_inject`` ``[3, D]``,
``w_r`` ``[D, D]``, and ``ln_attn``, ``ln_ffn`` (``{"scale", "offset"}``). :func:`prepare`
computes once per forward pass what does not depend on ``z`` (weights, injection, relative
embeddings, the memory's keys and values, dropout masks); :func:`step` is one evaluation.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from deqjax._src import checks
from deqjax._src.cells import layers
from deqjax._src.cells import relative_attention as rel_attn

Params = dict[str, Any]
PAPER_STDDEV = 0.01  # JR paper App. A.4 / DEQ code: every weight starts from N(0, 0.01)
BIAS_RANGE = 0.05  # the content and position biases start from U(-0.05, 0.05), as the DEQ code
DROPOUTS = ("drop_q", "drop_k", "drop_v", "drop_attn", "drop_ff1", "drop_ff2")
WEIGHTS = ("w_q", "w_k", "w_v", "w_o", "w_ff1", "w_ff2")
LayerNorm = Callable[[jax.Array], jax.Array]
Dropout = Callable[[str, jax.Array], jax.Array]  # (name, value) -> value with its mask


class TransformerInput(NamedTuple):
    """The input of a DEQ-Transformer cell when it carries a memory.

    Attributes:
      x: ``[B, T, Dx]`` the segment's input embeddings (injected into Q, K, V).
      mems: ``[B, M, D]`` the previous segment's equilibrium (its last ``M`` positions) or ``None``.
    """

    x: jax.Array
    mems: jax.Array | None = None


class Weights(NamedTuple):
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


def check_settings(
    d_model: int,
    num_heads: int,
    d_ff: int | None,
    dropout: float,
    *,
    pre_ln: bool,
    weight_norm: bool,
    initializers: dict[str, Any],
) -> tuple[int, float]:
    """``(d_ff, dropout)`` of a cell's settings (``d_ff`` ``None``: ``4 * d_model``), checked.

    Raises:
      ValueError: naming the argument, for a non-positive or non-int ``d_model``, ``num_heads``,
        ``d_ff``; an odd ``d_model``; ``num_heads`` not dividing ``d_model``; ``dropout`` outside
        ``[0, 1)``; a non-bool ``pre_ln`` or ``weight_norm``; a non-callable initializer (the
        ``initializers`` given by name).
    """
    checks.check_positive_int(d_model, "d_model")
    checks.check_positive_int(num_heads, "num_heads")
    if d_model % 2:
        raise ValueError(f"d_model must be even (sinusoidal relative embeddings), got {d_model}.")
    if d_model % num_heads:
        raise ValueError(f"num_heads={num_heads} must divide d_model={d_model}.")
    d_ff = 4 * d_model if d_ff is None else d_ff
    checks.check_positive_int(d_ff, "d_ff")
    checks.check_bool(pre_ln, "pre_ln")
    checks.check_bool(weight_norm, "weight_norm")
    for name, value in initializers.items():
        layers.check_initializer(value, name)
    return d_ff, layers.check_rate(dropout, "dropout")


def build(
    key: jax.Array,
    in_features: int,
    d_model: int,
    *,
    num_heads: int,
    d_ff: int | None,
    dropout: float,
    pre_ln: bool,
    weight_norm: bool,
    dtype: Any,
    **initializers: Any,
) -> tuple[Params, float]:
    """A front-end cell's construction: the settings checked (:func:`check_settings`, and a
    positive ``in_features``), then ``(init(key, ...), dropout)``; ``initializers`` by name."""
    checks.check_positive_int(in_features, "in_features")
    d_ff, dropout = check_settings(
        d_model,
        num_heads,
        d_ff,
        dropout,
        pre_ln=pre_ln,
        weight_norm=weight_norm,
        initializers=initializers,
    )
    params = init(
        key,
        in_features,
        d_model,
        num_heads=num_heads,
        d_ff=d_ff,
        weight_norm=weight_norm,
        dtype=dtype,
        **initializers,
    )
    return params, dropout


def split_input(x: jax.Array | TransformerInput) -> tuple[jax.Array, jax.Array | None]:
    """``(inputs [B, T, Dx], mems [B, M, D] or None)`` of a cell's input."""
    return (x.x, x.mems) if isinstance(x, TransformerInput) else (x, None)


def check_shapes(
    z_shape: tuple[int, ...], inputs: jax.Array, mems: jax.Array | None, d: int
) -> None:
    """Raises ``ValueError`` naming the array whose shape does not fit ``[B, T, *]`` (the state's
    shape ``z_shape``, the input's, the memory's)."""
    if inputs.ndim != 3:
        raise ValueError(f"x must be [B, T, Dx], got shape {inputs.shape}.")
    b, t, _ = inputs.shape
    if tuple(z_shape) != (b, t, d):
        raise ValueError(f"z must be [B, T, D] = {(b, t, d)}, got shape {tuple(z_shape)}.")
    if mems is not None and (mems.ndim != 3 or mems.shape[0] != b or mems.shape[2] != d):
        raise ValueError(f"mems must be [B, M, D] with B={b}, D={d}, got shape {mems.shape}.")


def init(
    key: jax.Array,
    in_features: int,
    d_model: int,
    *,
    num_heads: int,
    d_ff: int,
    weight_norm: bool = True,
    w_init: layers.Initializer | None = None,
    attn_w_init: layers.Initializer | None = None,
    inject_w_init: layers.Initializer | None = None,
    dtype: Any = jnp.float32,
) -> Params:
    """The cell's parameters for ``x: [B, T, in_features]``, ``z: [B, T, d_model]`` (the
    initializers as ``dq.nn.TransformerCell``'s, called as JAX's ``init(key, shape, dtype)``;
    ``None``: ``N(0, 0.01)``)."""
    d, f, dh = d_model, d_ff, d_model // num_heads
    paper = layers.normal(PAPER_STDDEV)
    attn_init, ffn_init = attn_w_init or paper, w_init or paper
    shapes = {"w_q": (d, d), "w_k": (d, d), "w_v": (d, d), "w_o": (d, d)}
    shapes.update({"w_ff1": (d, f), "w_ff2": (f, d)})
    keys = iter(jax.random.split(key, 12))
    params: Params = {
        name: layers.weight_param(
            next(keys),
            shape,
            dtype,
            ffn_init if name.startswith("w_ff") else attn_init,
            weight_norm=weight_norm,
        )
        for name, shape in shapes.items()
    }
    bias = layers.uniform(-BIAS_RANGE, BIAS_RANGE)
    params.update(
        b_o=jnp.zeros((d,), dtype),
        b_ff1=jnp.zeros((f,), dtype),
        b_ff2=jnp.zeros((d,), dtype),
        u_bias=bias(next(keys), (num_heads, dh), dtype),
        v_bias=bias(next(keys), (num_heads, dh), dtype),
        b_inject=jnp.zeros((3, d), dtype),
        w_r=attn_init(next(keys), (d, d), dtype),
        ln_attn=layers.layer_norm_params(d, dtype),
        ln_ffn=layers.layer_norm_params(d, dtype),
    )
    for n in "qkv":
        params[f"w_inject_{n}"] = (inject_w_init or paper)(next(keys), (in_features, d), dtype)
    return params


def weights(params: Params) -> Weights:
    """The layer's :class:`Weights` (weight-normalised ones normalised)."""
    w = {name: layers.weight(params[name]) for name in WEIGHTS}
    return Weights(
        w_q=w["w_q"],
        w_k=w["w_k"],
        w_v=w["w_v"],
        w_o=w["w_o"],
        w_1=w["w_ff1"],
        w_2=w["w_ff2"],
        b_o=params["b_o"],
        b_1=params["b_ff1"],
        b_2=params["b_ff2"],
        u_bias=params["u_bias"],
        v_bias=params["v_bias"],
    )


def injection(w_inject: list[jax.Array], b_inject: jax.Array, inputs: jax.Array) -> jax.Array:
    """``x̃ = x W_x + b_x`` for Q, K and V (``w_inject``: three ``[Dx, D]``): ``[B, T, 3, D]``."""
    return jnp.stack([inputs @ w for w in w_inject], axis=2) + b_inject[None, None]


def relative_embedding(w_r: jax.Array, length: int, num_heads: int) -> jax.Array:
    """The projected sinusoidal embeddings of the ``length`` distances: ``[K, H, Dh]``."""
    d = w_r.shape[0]
    pos = rel_attn.relative_positions(length, w_r.dtype)  # [K]
    r = rel_attn.sinusoidal_embedding(pos, d) @ w_r  # [K, D]
    return r.reshape(length, num_heads, d // num_heads)


def memory_kv(
    mems: jax.Array, w: Weights, ln_attn: LayerNorm, pre_ln: bool
) -> tuple[jax.Array, jax.Array]:
    """The memory's keys and values (pre-LN: of ``LN₁(mems)``), ``[B, M, D]`` each."""
    mem_in = ln_attn(mems) if pre_ln else mems
    return mem_in @ w.w_k, mem_in @ w.w_v


def attention(
    z_in: jax.Array,
    inject: jax.Array,
    memory: tuple[jax.Array, jax.Array] | None,
    r: jax.Array,
    w: Weights,
    num_heads: int,
    drop: Dropout,
) -> jax.Array:
    """Relative self-attention over the memory and the segment, output projected: ``[B, T, D]``."""
    b, t, d = z_in.shape
    h, dh = num_heads, d // num_heads
    q = z_in @ w.w_q + inject[:, :, 0]  # [B, T, D]
    k = z_in @ w.w_k + inject[:, :, 1]  # [B, T, D]
    v = z_in @ w.w_v + inject[:, :, 2]  # [B, T, D]
    if memory is not None:
        k = jnp.concatenate([memory[0], k], axis=1)  # [B, M+T, D]
        v = jnp.concatenate([memory[1], v], axis=1)  # [B, M+T, D]
    q, k, v = drop("drop_q", q), drop("drop_k", k), drop("drop_v", v)
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
    return drop("drop_attn", a)


def equations(
    z: jax.Array,
    inject: jax.Array,
    memory: tuple[jax.Array, jax.Array] | None,
    r: jax.Array,
    w: Weights,
    *,
    num_heads: int,
    pre_ln: bool,
    ln_attn: LayerNorm,
    ln_ffn: LayerNorm,
    drop: Dropout,
) -> jax.Array:
    """One application ``f_θ(z; x)`` (module docstring) given the pass's injection, memory keys
    and values, relative embeddings and weights, with the framework's layer norms and dropout:
    ``z [B, T, D]`` to ``[B, T, D]``."""
    z_in = ln_attn(z) if pre_ln else z  # [B, T, D]
    a = attention(z_in, inject, memory, r, w, num_heads, drop)
    y = z + a if pre_ln else ln_attn(z + a)  # [B, T, D]
    # pre-LN: the FFN's skip path starts after LN₂ (JR paper's DEQ-Transformer code), so the
    # output LN₂(y) + FFN(LN₂(y)) does not carry the scale of z (see dq.nn.TransformerCell).
    y_in = ln_ffn(y) if pre_ln else y  # [B, T, D]
    hidden = drop("drop_ff1", jax.nn.relu(y_in @ w.w_1 + w.b_1[None, None]))  # [B, T, F]
    ff = drop("drop_ff2", hidden @ w.w_2 + w.b_2[None, None])  # [B, T, D]
    return y_in + ff if pre_ln else ln_ffn(y + ff)  # [B, T, D]


def _layer_norm(params: Params, name: str) -> LayerNorm:
    return lambda v: layers.layer_norm(v, params[name]["scale"], params[name]["offset"])


def prepare(
    params: Params,
    x: jax.Array | TransformerInput,
    *,
    num_heads: int,
    pre_ln: bool = False,
    dropout: float = 0.0,
    key: jax.Array | None = None,
) -> dict[str, Any]:
    """The per-forward-pass context: weights, injection ``[B, T, 3, D]``, relative embeddings,
    the memory's keys and values (or ``None``) and the dropout masks (``[B, 1, width]`` each,
    shared over time; ``{}`` when ``dropout`` is 0).

    Raises:
      ValueError: if ``x`` is not ``[B, T, Dx]`` (or ``mems`` not ``[B, M, D]``), or
        ``dropout > 0`` and no ``key`` is given.
    """
    inputs, mems = split_input(x)
    w = weights(params)
    d = w.w_q.shape[0]
    check_shapes(inputs.shape[:2] + (d,), inputs, mems, d)  # x and mems (z comes later)
    inputs = inputs.astype(w.w_q.dtype)
    mems = None if mems is None else mems.astype(w.w_q.dtype)
    w_inject = [params[f"w_inject_{n}"] for n in "qkv"]
    m = 0 if mems is None else mems.shape[1]
    ctx = {
        "w": w,
        "inject": injection(w_inject, params["b_inject"], inputs),
        "r": relative_embedding(params["w_r"], m + inputs.shape[1], num_heads),
        "memory": None,
        "masks": {},
    }
    if mems is not None:
        ctx["memory"] = memory_kv(mems, w, _layer_norm(params, "ln_attn"), pre_ln)
    if dropout > 0.0:
        if key is None:
            raise ValueError("TransformerCell with dropout > 0 needs a key when training.")
        b, f = inputs.shape[0], w.w_1.shape[1]
        widths = dict.fromkeys(DROPOUTS, d) | {"drop_ff1": f}
        keys = jax.random.split(key, len(DROPOUTS))
        ctx["masks"] = {
            name: layers.dropout_mask(k, (b, 1, widths[name]), dropout, w.w_q.dtype)
            for name, k in zip(DROPOUTS, keys)
        }
    return ctx


def step(
    params: Params, ctx: dict[str, Any], z: jax.Array, *, num_heads: int, pre_ln: bool = False
) -> jax.Array:
    """One evaluation ``f_θ(z; x)`` from :func:`prepare`'s ``ctx``: ``[B, T, D]``.

    Raises:
      ValueError: if ``z`` is not ``[B, T, D]`` for the ``x`` of ``ctx``.
    """
    want = ctx["inject"].shape[:2] + ctx["inject"].shape[3:]
    if z.shape != want:
        raise ValueError(f"z must be [B, T, D] = {want}, got shape {z.shape}.")
    masks = ctx["masks"]
    return equations(
        z,
        ctx["inject"],
        ctx["memory"],
        ctx["r"],
        ctx["w"],
        num_heads=num_heads,
        pre_ln=pre_ln,
        ln_attn=_layer_norm(params, "ln_attn"),
        ln_ffn=_layer_norm(params, "ln_ffn"),
        drop=lambda name, v: v * masks[name] if name in masks else v,
    )
