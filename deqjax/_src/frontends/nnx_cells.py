"""Flax NNX DEQ cells: ``MLPCell`` and ``TransformerCell`` around the framework-free cells.

Each holds its parameters as a dict of ``nnx.Param`` (the names of the Haiku cell's, so weights
move between frameworks by name), computes with :mod:`deqjax._src.cells.mlp` /
:mod:`deqjax._src.cells.transformer`, and splits its evaluation into ``prepare(x, ...)`` (once per
forward pass: injection, normalised weights, dropout masks) and ``step(z, ctx)``, which
``deqjax.nnx.DEQ`` runs outside and inside the solver loop. Called directly, ``cell(z, x)`` is
``step(z, prepare(x))``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from deqjax._src import checks
from deqjax._src.cells import layers, mlp, transformer
from deqjax._src.cells.transformer import TransformerInput

Initializer = layers.Initializer


def _as_params(values: dict[str, Any]) -> Any:
    """A nested dict of arrays as a dict of ``nnx.Param`` (module data)."""
    return nnx.data(jax.tree_util.tree_map(nnx.Param, values))


def _values(params: Any, dtype: Any) -> dict[str, Any]:
    """The arrays of a dict of ``nnx.Param``, cast to the compute ``dtype`` (``None``: kept)."""
    values = jax.tree_util.tree_map(
        lambda v: v[...], params, is_leaf=lambda v: isinstance(v, nnx.Variable)
    )
    return values if dtype is None else jax.tree_util.tree_map(lambda a: a.astype(dtype), values)


class _DropoutCell(nnx.Module):
    """What both cells share: ``deterministic`` (``eval()``/``train()``/``nnx.view``) and the call
    as ``step(z, prepare(x))``."""

    deterministic: bool

    def set_view(self, deterministic: bool | None = None) -> None:
        """``nnx.view(cell, deterministic=...)``: sets ``deterministic`` when given."""
        if deterministic is not None:
            self.deterministic = deterministic

    def _rate(self, rate: float, deterministic: bool | None) -> float:
        det = self.deterministic if deterministic is None else deterministic
        return 0.0 if checks.check_bool(det, "deterministic") else rate

    def __call__(
        self,
        z: jax.Array,
        x: Any,
        *,
        key: jax.Array | None = None,
        deterministic: bool | None = None,
    ) -> jax.Array:
        """One application ``f_θ(z; x)``: ``step(z, prepare(x, key=key, deterministic=...))``."""
        return self.step(z, self.prepare(x, key=key, deterministic=deterministic))


class MLPCell(_DropoutCell):
    """Fully connected DEQ cell ``f_θ(z; x)``, ``z: [B, features]``, ``x: [B, in_features]``
    (init paper §4.1; JR paper §5.1): the forms of ``dq.nn.MLPCell``, same equations.

    Args:
      in_features: the width ``Dx`` of ``x``.
      features: the state width ``D``.
      hidden_features: ``H`` of ``"resnet"``/``"two_layer"`` (``None``: ``D``).
      form: ``"resnet"`` (default), ``"single"`` or ``"two_layer"``.
      activation: ``φ`` (default ReLU).
      w_init: initializer of the recurrent weights, ``(key, shape, dtype) -> array``: any
        ``dq.initializers`` object (e.g. ``dq.initializers.HaarOrthogonal(0.9)``) or
        ``nnx.initializers`` function (``None``: truncated normal of variance ``1/fan_in``).
      u_init: initializer of the injection ``U`` (same default).
      with_bias: add the injection bias ``b``.
      weight_norm: weight-normalise the recurrent weights.
      dropout_rate: variational dropout rate on the hidden activation (0 disables it); its
        mask needs a ``key`` in training (``deqjax.nnx.DEQ`` passes one from its ``rngs``).
      dtype: the compute dtype (``None``: the parameters').
      param_dtype: the parameters' dtype.
      deterministic: start in eval mode (no dropout).
      rngs: the ``params`` stream draws the weights.

    Raises:
      ValueError: as ``dq.nn.MLPCell``, and for non-positive ``in_features``/``features``.

    Example:
      >>> cell = deqjax.nnx.MLPCell(784, 128, w_init=dq.initializers.HaarOrthogonal(0.9),
      ...                           rngs=nnx.Rngs(0))
    """

    def __init__(
        self,
        in_features: int,
        features: int,
        *,
        hidden_features: int | None = None,
        form: str = "resnet",
        activation: Callable[[jax.Array], jax.Array] = jax.nn.relu,
        w_init: Initializer | None = None,
        u_init: Initializer | None = None,
        with_bias: bool = True,
        weight_norm: bool = False,
        dropout_rate: float = 0.0,
        dtype: Any = None,
        param_dtype: Any = jnp.float32,
        deterministic: bool = False,
        rngs: nnx.Rngs,
    ):
        self.features, self.form, self.activation, self.dtype = features, form, activation, dtype
        self.deterministic = checks.check_bool(deterministic, "deterministic")
        values, self.dropout_rate = mlp.build(
            rngs.params(),
            in_features,
            features,
            hidden_size=hidden_features,
            form=form,
            activation=activation,
            w_init=w_init,
            u_init=u_init,
            with_bias=with_bias,
            weight_norm=weight_norm,
            dropout_rate=dropout_rate,
            dtype=param_dtype,
        )
        self.params = _as_params(values)

    def initial_state(self, x: jax.Array) -> jax.Array:
        """Zeros ``[B, features]`` in the compute dtype (``x``'s when it is ``None``)."""
        return jnp.zeros((x.shape[0], self.features), self.dtype or x.dtype)

    def prepare(
        self, x: jax.Array, *, key: jax.Array | None = None, deterministic: bool | None = None
    ) -> dict[str, Any]:
        """The per-forward-pass context (injection, weights, dropout mask) of ``x [B, Dx]``."""
        rate = self._rate(self.dropout_rate, deterministic)
        return mlp.prepare(
            _values(self.params, self.dtype), x, form=self.form, dropout_rate=rate, key=key
        )

    def step(self, z: jax.Array, ctx: dict[str, Any]) -> jax.Array:
        """One evaluation ``f_θ(z; x)`` with the pass's ``ctx``: ``[B, D]``."""
        values = _values(self.params, self.dtype)
        return mlp.step(values, ctx, z, form=self.form, activation=self.activation)


class TransformerCell(_DropoutCell):
    """One weight-tied DEQ-Transformer layer ``f_θ(z; x)`` (DEQ paper §4; JR paper Fig. 2): the
    cell of ``dq.nn.TransformerCell`` (its arguments and defaults), same equations.

    ``x`` is ``[B, T, in_features]`` or ``TransformerInput(x, mems)`` with a memory
    ``[B, M, d_model]``; ``z`` is ``[B, T, d_model]``.

    Args:
      in_features: the width ``Dx`` of ``x``.
      d_model, num_heads, d_ff, dropout, pre_ln, weight_norm, w_init, attn_w_init,
        inject_w_init: as ``dq.nn.TransformerCell``'s (initializers called as
        ``(key, shape, dtype)``).
      dtype: the compute dtype (``None``: the parameters').
      param_dtype: the parameters' dtype.
      deterministic: start in eval mode (no dropout).
      rngs: the ``params`` stream draws the weights.

    Raises:
      ValueError: as ``dq.nn.TransformerCell``.
    """

    def __init__(
        self,
        in_features: int,
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
        dtype: Any = None,
        param_dtype: Any = jnp.float32,
        deterministic: bool = False,
        rngs: nnx.Rngs,
    ):
        self.d_model, self.num_heads, self.pre_ln, self.dtype = d_model, num_heads, pre_ln, dtype
        self.deterministic = checks.check_bool(deterministic, "deterministic")
        values, self.dropout = transformer.build(
            rngs.params(),
            in_features,
            d_model,
            num_heads=num_heads,
            d_ff=d_ff,
            dropout=dropout,
            pre_ln=pre_ln,
            weight_norm=weight_norm,
            dtype=param_dtype,
            w_init=w_init,
            attn_w_init=attn_w_init,
            inject_w_init=inject_w_init,
        )
        self.params = _as_params(values)

    def initial_state(self, x: jax.Array | TransformerInput) -> jax.Array:
        """Zeros ``[B, T, d_model]`` (the DEQ paper's ``z^[0] = 0``)."""
        inputs, _ = transformer.split_input(x)
        return jnp.zeros(inputs.shape[:2] + (self.d_model,), self.dtype or inputs.dtype)

    def prepare(
        self,
        x: jax.Array | TransformerInput,
        *,
        key: jax.Array | None = None,
        deterministic: bool | None = None,
    ) -> dict[str, Any]:
        """The per-forward-pass context (weights, injection, relative embeddings, memory keys and
        values, dropout masks) of ``x``."""
        return transformer.prepare(
            _values(self.params, self.dtype),
            x,
            num_heads=self.num_heads,
            pre_ln=self.pre_ln,
            dropout=self._rate(self.dropout, deterministic),
            key=key,
        )

    def step(self, z: jax.Array, ctx: dict[str, Any]) -> jax.Array:
        """One evaluation ``f_θ(z; x)`` with the pass's ``ctx``: ``[B, T, D]``."""
        values = _values(self.params, self.dtype)
        return transformer.step(values, ctx, z, num_heads=self.num_heads, pre_ln=self.pre_ln)
