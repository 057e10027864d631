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

Initializer = layers.Initializer


class _PhasedCell(eqx.Module):
    """What both cells are: parameters (a dict of arrays), the framework-free cell's phases over
    them (:mod:`deqjax._src.cells`) and the ``inference`` switch; called as
    ``step(z, prepare(x))``."""

    params: dict[str, Any]
    inference: bool
    phases: Any = eqx.field(static=True)

    def __init__(self, built: tuple[dict[str, Any], Any], inference: bool):
        self.params, self.phases = built
        self.inference = checks.check_bool(inference, "inference")

    def initial_state(self, x: Any) -> jax.Array:
        """Zeros of the state's shape (``[B, D]``, ``[B, T, D]``) in the parameters' dtype: the
        DEQ paper's ``z^[0] = 0``."""
        return self.phases.initial_state(x, jax.tree_util.tree_leaves(self.params)[0].dtype)

    def prepare(
        self, x: Any, *, key: jax.Array | None = None, inference: bool | None = None
    ) -> dict[str, Any]:
        """The per-forward-pass context of ``x`` (the weights, the injection, and the dropout
        masks, drawn from ``key`` when not in ``inference``; the Transformer's relative
        embeddings and memory keys and values)."""
        inf = self.inference if inference is None else inference
        training = not checks.check_bool(inf, "inference")
        return self.phases.prepare(self.params, x, training=training, key=key)

    def step(self, z: jax.Array, ctx: dict[str, Any]) -> jax.Array:
        """One evaluation ``f_θ(z; x)`` with the pass's ``ctx``: ``z``'s shape."""
        return self.phases.step(self.params, ctx, z)

    def __call__(
        self, z: jax.Array, x: Any, *, key: jax.Array | None = None, inference: bool | None = None
    ) -> jax.Array:
        """One application ``f_θ(z; x)``: ``step(z, prepare(x, key=key, inference=...))``."""
        return self.step(z, self.prepare(x, key=key, inference=inference))


class MLPCell(_PhasedCell):
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
        built = mlp.build(
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
        super().__init__(built, inference)


class TransformerCell(_PhasedCell):
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
        built = transformer.build(
            key,
            in_features,
            d_model,
            dtype,
            num_heads=num_heads,
            d_ff=d_ff,
            dropout=dropout,
            pre_ln=pre_ln,
            weight_norm=weight_norm,
            w_init=w_init,
            attn_w_init=attn_w_init,
            inject_w_init=inject_w_init,
        )
        super().__init__(built, inference)
