"""Equinox DEQ cells: ``MLPCell`` and ``TransformerCell`` around the framework-free cells.

Each holds its parameters as a dict of arrays (the names of the Haiku cell's, so weights move
between frameworks by name), drawn at construction from ``key`` with the initializers given
(``(key, shape, dtype) -> array``: any ``dq.initializers`` object), computes with
:mod:`deqjax._src.cells.mlp` / :mod:`deqjax._src.cells.transformer`, and splits its evaluation
into ``prepare(x, ...)`` (once per forward pass: injection, normalised weights, dropout masks)
and ``step(z, ctx)``, which ``deqjax.equinox.DEQ`` runs outside and inside the solver loop.
Unlike most Equinox layers they are written for a batch (``[B, ...]``), as every DEQ cell is.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp

from deqjax._src import checks
from deqjax._src.cells import layers, mlp, transformer
from deqjax._src.cells.transformer import TransformerInput

Initializer = layers.Initializer


class _DropoutCell(eqx.Module):
    """What both cells share: the ``inference`` switch and the call as ``step(z, prepare(x))``."""

    def _rate(self, rate: float, inference: bool | None) -> float:
        inf = self.inference if inference is None else inference
        return 0.0 if checks.check_bool(inf, "inference") else rate

    def __call__(
        self, z: jax.Array, x: Any, *, key: jax.Array | None = None, inference: bool | None = None
    ) -> jax.Array:
        """One application ``f_θ(z; x)``: ``step(z, prepare(x, key=key, inference=...))``."""
        return self.step(z, self.prepare(x, key=key, inference=inference))


class MLPCell(_DropoutCell):
    """Fully connected DEQ cell ``f_θ(z; x)``, ``z: [B, features]``, ``x: [B, in_features]``
    (init paper §4.1; JR paper §5.1): the forms of ``dq.nn.MLPCell``, same equations.

    Args:
      in_features: the width ``Dx`` of ``x``.
      features: the state width ``D``.
      hidden_features: ``H`` of ``"resnet"``/``"two_layer"`` (``None``: ``D``).
      form: ``"resnet"`` (default), ``"single"`` or ``"two_layer"``.
      activation: ``φ`` (default ReLU).
      w_init: initializer of the recurrent weights, ``(key, shape, dtype) -> array`` (e.g.
        ``dq.initializers.HaarOrthogonal(0.9)``; ``None``: truncated normal of variance
        ``1/fan_in``).
      u_init: initializer of the injection ``U`` (same default).
      with_bias: add the injection bias ``b``.
      weight_norm: weight-normalise the recurrent weights.
      dropout_rate: variational dropout rate on the hidden activation (0 disables it); its
        mask needs a ``key`` in training.
      dtype: the parameters' dtype.
      inference: start in inference mode (no dropout).
      key: draws the weights.

    Raises:
      ValueError: as ``dq.nn.MLPCell``, and for non-positive ``in_features``/``features``.

    Example:
      >>> cell = deqjax.equinox.MLPCell(784, 128, w_init=dq.initializers.HaarOrthogonal(0.9),
      ...                               key=jax.random.key(0))
    """

    params: dict[str, Any]
    inference: bool
    features: int = eqx.field(static=True)
    form: str = eqx.field(static=True)
    activation: Callable[[jax.Array], jax.Array] = eqx.field(static=True)
    dropout_rate: float = eqx.field(static=True)

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
        dtype: Any = jnp.float32,
        inference: bool = False,
        key: jax.Array,
    ):
        self.features, self.form, self.activation = features, form, activation
        self.inference = checks.check_bool(inference, "inference")
        self.params, self.dropout_rate = mlp.build(
            key,
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
            dtype=dtype,
        )

    def initial_state(self, x: jax.Array) -> jax.Array:
        """Zeros ``[B, features]`` in the parameters' dtype."""
        return jnp.zeros((x.shape[0], self.features), self.params["U"].dtype)

    def prepare(
        self, x: jax.Array, *, key: jax.Array | None = None, inference: bool | None = None
    ) -> dict[str, Any]:
        """The per-forward-pass context (injection, weights, dropout mask) of ``x [B, Dx]``."""
        rate = self._rate(self.dropout_rate, inference)
        return mlp.prepare(self.params, x, form=self.form, dropout_rate=rate, key=key)

    def step(self, z: jax.Array, ctx: dict[str, Any]) -> jax.Array:
        """One evaluation ``f_θ(z; x)`` with the pass's ``ctx``: ``[B, D]``."""
        return mlp.step(self.params, ctx, z, form=self.form, activation=self.activation)


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
      dtype: the parameters' dtype.
      inference: start in inference mode (no dropout).
      key: draws the weights.

    Raises:
      ValueError: as ``dq.nn.TransformerCell``.
    """

    params: dict[str, Any]
    inference: bool
    d_model: int = eqx.field(static=True)
    num_heads: int = eqx.field(static=True)
    pre_ln: bool = eqx.field(static=True)
    dropout: float = eqx.field(static=True)

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
        dtype: Any = jnp.float32,
        inference: bool = False,
        key: jax.Array,
    ):
        self.d_model, self.num_heads, self.pre_ln = d_model, num_heads, pre_ln
        self.inference = checks.check_bool(inference, "inference")
        self.params, self.dropout = transformer.build(
            key,
            in_features,
            d_model,
            num_heads=num_heads,
            d_ff=d_ff,
            dropout=dropout,
            pre_ln=pre_ln,
            weight_norm=weight_norm,
            dtype=dtype,
            w_init=w_init,
            attn_w_init=attn_w_init,
            inject_w_init=inject_w_init,
        )

    def initial_state(self, x: jax.Array | TransformerInput) -> jax.Array:
        """Zeros ``[B, T, d_model]`` (the DEQ paper's ``z^[0] = 0``) in the parameters' dtype."""
        inputs, _ = transformer.split_input(x)
        return jnp.zeros(inputs.shape[:2] + (self.d_model,), self.params["b_o"].dtype)

    def prepare(
        self,
        x: jax.Array | TransformerInput,
        *,
        key: jax.Array | None = None,
        inference: bool | None = None,
    ) -> dict[str, Any]:
        """The per-forward-pass context (weights, injection, relative embeddings, memory keys and
        values, dropout masks) of ``x``."""
        return transformer.prepare(
            self.params,
            x,
            num_heads=self.num_heads,
            pre_ln=self.pre_ln,
            dropout=self._rate(self.dropout, inference),
            key=key,
        )

    def step(self, z: jax.Array, ctx: dict[str, Any]) -> jax.Array:
        """One evaluation ``f_θ(z; x)`` with the pass's ``ctx``: ``[B, T, D]``."""
        return transformer.step(self.params, ctx, z, num_heads=self.num_heads, pre_ln=self.pre_ln)
