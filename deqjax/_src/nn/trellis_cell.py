"""The DEQ-TrellisNet cell: a weight-tied causal temporal convolution with input injection and the
LSTM-style gated activation (DEQ paper §4, after Bai, Kolter & Koltun 2019, "Trellis networks").

DEQ paper §4:

    x̃ = Conv1D(x; W_x)                                         (input injection, once per forward)
    f_θ(z; x) = ψ(Conv1D([u_{-(k-1)s:}, z]; W_z) + x̃)

with kernel size ``k``, dilation ``s``, ``u`` the previous segment's last ``(k-1)s`` states (history
padding) or zeros, and ψ the LSTM gated activation of TrellisNet. The state at each time step is
``z_t = [h_t ; c_t]`` (hidden and cell, ``2H`` features). The convolution reads the hidden half
``h`` (history-padded) and produces ``4H`` pre-activations ``[i, o, g, f]``; with the cell state of
the PREVIOUS time step ``c_{t-1}`` (the history's last ``c`` at ``t = 0``):

    c_t = σ(f_t) ⊙ c_{t-1} + σ(i_t) ⊙ tanh(g_t),      h_t = σ(o_t) ⊙ tanh(c_t).

Everything is causal: ``f(z; x)_t`` depends on ``z_{≤t}``, ``x_{≤t}`` and the history only.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import haiku as hk
import jax
import jax.numpy as jnp

from deqjax._src import checks
from deqjax._src.nn import variational_dropout, weight_norm
from deqjax._src.nn.per_forward import per_forward

Initializer = Any  # hk.initializers.Initializer or any (shape, dtype) -> array callable

# TrellisNet / DEQ code: weights start from N(0, 0.01).
_PAPER_STDDEV = 0.01


class TrellisInput(NamedTuple):
    """The input of :class:`TrellisCell` when it continues a previous segment.

    Attributes:
      x: ``[B, T, Dx]`` the segment's inputs.
      history: ``[B, P, 2H]`` the previous segment's last ``P = (k-1)·s`` equilibrium states
        (``z*[:, -P:]``), or ``None`` for zero padding.
      x_history: ``[B, P, Dx]`` the previous segment's last ``P`` inputs (so the injection
        convolution is continuous too), or ``None`` for zero padding.
    """

    x: jax.Array
    history: jax.Array | None = None
    x_history: jax.Array | None = None


def _causal_conv(padded: jax.Array, kernel: jax.Array, dilation: int, length: int) -> jax.Array:
    """``out[:, t] = Σ_j padded[:, t + j·s] @ kernel[j]``: a causal dilated conv whose last tap
    ``j = k-1`` reads time ``t`` (``padded`` holds ``(k-1)s`` history steps before the segment).

    Args:
      padded: ``[B, P + T, C_in]`` with ``P = (k-1)·dilation``.
      kernel: ``[k, C_in, C_out]``.
      dilation: ``s``.
      length: ``T``.

    Returns:
      ``[B, T, C_out]``.
    """
    taps = [
        padded[:, j * dilation : j * dilation + length] @ kernel[j]  # [B, T, C_out]
        for j in range(kernel.shape[0])
    ]
    return sum(taps[1:], taps[0])


class TrellisCell(hk.Module):
    """One weight-tied TrellisNet layer in DEQ form ``f_θ(z; x)`` (DEQ paper §4).

    State ``z``: ``[B, T, 2H]``, the concatenation ``[h ; c]`` of the hidden and cell states
    (use :meth:`hidden` for ``h``, e.g. for a language-model head). Input ``x``: ``[B, T, Dx]``
    or :class:`TrellisInput` with history padding. See the module docstring for the equations.

    Computed once per DEQ forward pass (``dq.nn.per_forward``), not per solver step: the input
    injection ``x̃ = Conv1D([x_history; x]; W_x) + b`` (``[B, T, 4H]``), the weight normalisation
    and the dropout mask.

    ``w_init`` draws the recurrent kernel ``W_z`` ``[k, H, 4H]`` block by block: each ``[H, H]``
    block (one tap, one gate) comes from ``w_init((H, H), dtype)``, so every family (square-only
    ones such as ``dq.initializers.GOE`` included) sees a square matrix and a scale comparable to
    a dense ``H``-wide layer. (The Jacobian ``∂f/∂z`` is block lower-triangular in time, so its
    spectrum is set by the current-time tap's blocks.)

    Paper defaults (TrellisNet / DEQ-TrellisNet): kernel size 2, dilation 1, weights from
    ``N(0, 0.01)``, weight norm on, variational ("recurrent") dropout on the hidden state.

    Args:
      hidden_size: ``H``; the state has ``2H`` features.
      kernel_size: ``k >= 2``, the temporal kernel size.
      dilation: ``s >= 1``.
      dropout: variational dropout rate in ``[0, 1)`` on ``h`` before the convolution; one mask
        per forward pass, shared over time, fixed across solver iterations; only when
        ``is_training``.
      weight_norm: weight-normalise ``W_z`` (per output channel).
      w_init: initializer of the ``[H, H]`` blocks of ``W_z``; ``None``: ``N(0, 0.01)``.
      inject_w_init: initializer of ``W_x`` ``[k, Dx, 4H]``; ``None``: ``N(0, 0.01)``.
      name: Haiku module name.

    Raises:
      ValueError: naming the argument, for a non-positive/non-int ``hidden_size`` or
        ``dilation``, ``kernel_size < 2``, ``dropout`` outside ``[0, 1)``, a non-bool
        ``weight_norm`` or a non-callable initializer.

    Example:
      >>> cell = dq.nn.TrellisCell(32, kernel_size=2)
      >>> deq = dq.nn.DEQ(cell, solver=dq.solvers.Broyden(max_steps=30))
      >>> z_star, sol = deq(dq.nn.TrellisInput(x, history=z_prev[:, -1:]))  # x: [B, T, Dx]
      >>> h = dq.nn.TrellisCell.hidden(z_star)  # [B, T, 32]
    """

    def __init__(
        self,
        hidden_size: int,
        *,
        kernel_size: int = 2,
        dilation: int = 1,
        dropout: float = 0.0,
        weight_norm: bool = True,
        w_init: Initializer | None = None,
        inject_w_init: Initializer | None = None,
        name: str | None = None,
    ):
        super().__init__(name=name)
        checks.check_positive_int(hidden_size, "hidden_size")
        checks.check_positive_int(kernel_size, "kernel_size")
        if kernel_size < 2:
            raise ValueError(
                f"kernel_size must be >= 2 (a temporal convolution over [z_(t-1), z_t]), got "
                f"{kernel_size}."
            )
        checks.check_positive_int(dilation, "dilation")
        checks.check_bool(weight_norm, "weight_norm")
        for arg, value in (("w_init", w_init), ("inject_w_init", inject_w_init)):
            if value is not None and not callable(value):
                raise ValueError(f"{arg} must be an initializer or None, got {value!r}.")
        self.hidden_size = hidden_size
        self.kernel_size = kernel_size
        self.dilation = dilation
        self.dropout = variational_dropout.check_rate(dropout, "dropout")
        self.weight_norm = weight_norm
        self.w_init = w_init
        self.inject_w_init = inject_w_init

    @property
    def history_length(self) -> int:
        """``P = (k-1)·s``: how many previous states (and inputs) the history padding holds."""
        return (self.kernel_size - 1) * self.dilation

    @property
    def state_size(self) -> int:
        """``2H``: features of the state ``[h ; c]``."""
        return 2 * self.hidden_size

    @staticmethod
    def hidden(z: jax.Array) -> jax.Array:
        """The hidden half ``h`` ``[..., H]`` of a state ``[..., 2H]``."""
        return z[..., : z.shape[-1] // 2]

    def initial_state(self, x: jax.Array | TrellisInput) -> jax.Array:
        """Zeros ``[B, T, 2H]`` in the input's dtype."""
        inputs = x.x if isinstance(x, TrellisInput) else x
        return jnp.zeros(inputs.shape[:2] + (self.state_size,), inputs.dtype)

    def __call__(
        self, z: jax.Array, x: jax.Array | TrellisInput, *, is_training: bool = False
    ) -> jax.Array:
        """One application ``f_θ(z; x)``.

        Args:
          z: ``[B, T, 2H]`` state ``[h ; c]``.
          x: ``[B, T, Dx]`` input, or ``TrellisInput(x, history, x_history)``.
          is_training: dropout is applied only when ``True`` (``DEQ`` passes it; direct calls
            default to eval).

        Returns:
          ``[B, T, 2H]`` the new state.
        """
        if isinstance(x, TrellisInput):
            inputs, history, x_history = x
        else:
            inputs, history, x_history = x, None, None
        hs, p = self.hidden_size, self.history_length
        if inputs.ndim != 3:
            raise ValueError(f"x must be [B, T, Dx], got shape {inputs.shape}.")
        b, t, dx = inputs.shape
        if z.shape != (b, t, 2 * hs):
            raise ValueError(f"z must be [B, T, 2H] = {(b, t, 2 * hs)}, got shape {z.shape}.")
        if history is not None and history.shape != (b, p, 2 * hs):
            raise ValueError(
                f"history must be [B, (k-1)*dilation, 2H] = {(b, p, 2 * hs)}, got {history.shape}."
            )
        if x_history is not None and x_history.shape != (b, p, dx):
            raise ValueError(
                f"x_history must be [B, (k-1)*dilation, Dx] = {(b, p, dx)}, got {x_history.shape}."
            )
        dtype = z.dtype
        paper_init = hk.initializers.RandomNormal(_PAPER_STDDEV)
        block_init = self.w_init or paper_init
        inject_init = self.inject_w_init or paper_init
        k = self.kernel_size

        def kernel_init(shape, dtype):  # [k, H, 4H], each [H, H] block from w_init
            del shape
            blocks = [[block_init((hs, hs), dtype) for _ in range(4)] for _ in range(k)]
            return jnp.stack([jnp.concatenate(row, axis=-1) for row in blocks])

        def weight(name, shape, init):  # plain or weight-normed, computed once per forward
            return weight_norm.get_weight(
                name, shape, dtype, w_init=init, weight_norm=self.weight_norm
            )

        # ---- once per forward pass -----------------------------------------------------------
        w_z = weight("w_z", (k, hs, 4 * hs), kernel_init)  # [k, H, 4H]

        def injection():
            w_x = hk.get_parameter("w_x", (k, dx, 4 * hs), dtype, init=inject_init)  # [k, Dx, 4H]
            b_x = hk.get_parameter("b_x", (4 * hs,), dtype, init=jnp.zeros)  # [4H]
            x_hist = jnp.zeros((b, p, dx), inputs.dtype) if x_history is None else x_history
            x_pad = jnp.concatenate([x_hist, inputs], axis=1)  # [B, P+T, Dx]
            return _causal_conv(x_pad, w_x, self.dilation, t) + b_x[None, None]  # [B, T, 4H]

        inject = per_forward("injection", injection)  # [B, T, 4H]
        if history is None:
            history = jnp.zeros((b, p, 2 * hs), dtype)  # [B, P, 2H]

        # ---- per solver step -------------------------------------------------------------------
        h, c = z[..., :hs], z[..., hs:]  # [B, T, H] each
        h_pad = jnp.concatenate([history[..., :hs], h], axis=1)  # [B, P+T, H]
        h_pad = variational_dropout.time_shared_dropout(
            "drop_h", h_pad, self.dropout if is_training else 0.0
        )
        pre = _causal_conv(h_pad, w_z, self.dilation, t) + inject  # [B, T, 4H]
        c_prev = jnp.concatenate([history[:, -1:, hs:], c[:, :-1]], axis=1)  # [B, T, H]: c_{t-1}
        gate_i, gate_o, gate_g, gate_f = jnp.split(pre, 4, axis=-1)  # [B, T, H] each
        c_new = jax.nn.sigmoid(gate_f) * c_prev + jax.nn.sigmoid(gate_i) * jnp.tanh(gate_g)
        h_new = jax.nn.sigmoid(gate_o) * jnp.tanh(c_new)  # [B, T, H]
        return jnp.concatenate([h_new, c_new], axis=-1)  # [B, T, 2H]
