"""``MLPCell``: fully connected DEQ cells (init paper §4.1; JR paper §5.1).

Three forms of ``f_θ(z; x)`` with input injection ``u = U x + b`` (computed once per forward pass,
outside the solver loop, with :func:`~deqjax.nn.per_forward`):

* ``"resnet"`` (default) — the init paper's §4.1 "ResNet DEQ layer with non-linearity" for
  Fashion-/MNIST (flatten → this layer → dense logits). The paper's equations were lost in
  extraction; we use the fully connected form of the residual DEQ layer of the Deep Implicit Layers
  tutorial (Kolter, Duvenaud & Johnson 2020, ch. 4) that it builds on::

      f(z; x) = LN(φ(z + LN(u + W₂ LN(φ(W₁ z)))))

  with ``W₁: [D, H]``, ``W₂: [H, D]`` and layer norms ``LN`` (learned scale and offset).
* ``"single"`` — the init paper's theory model (§2–3): ``f(z; x) = φ(W z + u)``, ``W: [D, D]``
  (all ``dq.initializers`` families apply, including GOE and the other square-only ensembles).
* ``"two_layer"`` — the JR paper's tiny ReLU layer (§5.1, App. A.1):
  ``f(z; x) = W₂ φ(W₁ z + u)`` with ``W₁: [D, H]``, ``W₂: [H, D]``; with ``D = 1``, ``H = 50``,
  a scalar ``x`` and ``with_bias=True`` this is its 200-parameter DEQ.

``w_init`` initialises the recurrent (``z``-side) weights ``W``/``W₁``/``W₂``; ``u_init`` the
injection ``U``. Optional weight norm (recurrent weights) and variational dropout on the hidden
activation (on the output for ``"single"``), both held fixed across solver iterations. The
equations are the framework-free cell's (:func:`deqjax._src.cells.mlp.equations`), which the
Flax NNX and Equinox ``MLPCell`` compute with too.
"""

from __future__ import annotations

from typing import Callable

import haiku as hk
import jax
import jax.numpy as jnp

from deqjax._src.cells import mlp
from deqjax._src.nn import norms, variational_dropout, weight_norm
from deqjax._src.nn.per_forward import per_forward


class MLPCell(hk.Module):
    """Fully connected DEQ cell ``f_θ(z; x)``, ``z: [B, D]``, ``x: [B, Dx]`` (see module docs).

    Args:
      hidden_size: ``H`` for ``"resnet"``/``"two_layer"`` (``None``: ``D``, the state width; the
        JR tiny layer uses 50). Must be ``None`` for ``"single"``.
      form: ``"resnet"`` (init paper §4.1, default), ``"single"`` or ``"two_layer"`` (JR §5.1).
      activation: ``φ`` (default ReLU, as in both papers).
      w_init: initializer of the recurrent weights: any ``dq.initializers`` family (e.g.
        ``dq.initializers.HaarOrthogonal(0.9)``, the init paper's best) or Haiku initializer;
        ``None``: ``hk.Linear``'s default (truncated normal, variance ``1/fan_in``).
      u_init: initializer of ``U`` (``None``: ``hk.Linear``'s default).
      with_bias: add the injection bias ``b``.
      weight_norm: weight-normalise the recurrent weights (JR Table 4 uses it for the larger
        models, not for the tiny layer).
      dropout_rate: variational dropout rate (0 disables it).
      name: module name.

    Raises:
      ValueError: unknown ``form``, bad ``hidden_size``, non-callable ``activation``/``w_init``/
        ``u_init``, ``dropout_rate`` outside ``[0, 1)``.

    Example:
      >>> deq = dq.nn.DEQ(dq.nn.MLPCell(w_init=dq.initializers.HaarOrthogonal(0.9)))
      >>> z, sol = deq(hk.Linear(128)(x))                 # x: [B, 784] -> z: [B, 128]
    """

    def __init__(
        self,
        hidden_size: int | None = None,
        *,
        form: str = "resnet",
        activation: Callable[[jax.Array], jax.Array] = jax.nn.relu,
        w_init: hk.initializers.Initializer | None = None,
        u_init: hk.initializers.Initializer | None = None,
        with_bias: bool = True,
        weight_norm: bool = False,
        dropout_rate: float = 0.0,
        name: str | None = None,
    ):
        super().__init__(name=name)
        dropout_rate = mlp.check_settings(
            hidden_size, form, activation, dropout_rate, {"w_init": w_init, "u_init": u_init}
        )
        self.hidden_size = hidden_size
        self.form = form
        self.activation = activation
        self.w_init = w_init
        self.u_init = u_init
        self.with_bias = with_bias
        self.weight_norm = weight_norm
        self.dropout = variational_dropout.VariationalDropout(dropout_rate, name="dropout")

    def __call__(self, z: jax.Array, x: jax.Array, *, is_training: bool = False) -> jax.Array:
        """One application ``f_θ(z; x)``.

        Args:
          z: state ``[B, D]``.
          x: input ``[B, Dx]``.
          is_training: enables dropout (``DEQ`` passes it; direct calls default to eval).

        Returns:
          the new state ``[B, D]``.
        """
        if z.ndim != 2 or x.ndim != 2:
            raise ValueError(f"MLPCell expects z [B, D] and x [B, Dx], got {z.shape}, {x.shape}.")
        d, dtype = z.shape[-1], z.dtype
        h = d if self.hidden_size is None else self.hidden_size
        phi = self.activation

        def weight(name, shape):
            return weight_norm.get_weight(
                name, shape, dtype, w_init=self.w_init, weight_norm=self.weight_norm
            )

        def injection():
            u_init = self.u_init or hk.initializers.VarianceScaling(
                1.0, "fan_in", "truncated_normal"
            )
            width = h if self.form == "two_layer" else d
            u = hk.get_parameter("U", [x.shape[-1], width], dtype, init=u_init)
            out = x.astype(dtype) @ u  # [B, D] (or [B, H] for two_layer)
            if self.with_bias:
                out = out + hk.get_parameter("b", [out.shape[-1]], dtype, init=jnp.zeros)[None, :]
            return out

        u = per_forward("injection", injection)
        names = mlp.weight_names(self.form)
        shapes = {"W": [d, d], "W1": [d, h], "W2": [h, d]}
        w = {name: weight(name, shapes[name]) for name in names}
        return mlp.equations(
            self.form,
            phi,
            z,
            u,
            w,
            lambda name, v: norms.LayerNorm(name=name)(v),
            lambda v: self.dropout(v, is_training=is_training),
        )
