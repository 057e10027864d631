"""The non-linearity ``phi`` of a DEQ ``h = W phi(h) + x``, given by name or as a callable.

* A name in ``PHI_NAMES``: ``"tanh"``, ``"relu"``, ``"hardtanh"`` (``clip(h, -1, 1)``),
  ``"linear"``. The Gaussian moments of ``relu``, ``hardtanh`` and ``linear`` have closed forms
  (erf); ``tanh`` uses Gauss–Hermite quadrature.
* A callable ``phi(h)``: elementwise and jax-traceable; its derivative is taken with ``jax.grad``.
  A piecewise-linear callable gets exact moments (:mod:`.piecewise_linear`), any other one
  quadrature.

``phi`` is a static argument everywhere (hashable: a string or a function).
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

PHI_NAMES = ("tanh", "relu", "hardtanh", "linear")

Phi = str | Callable[[jax.Array], jax.Array]
Elementwise = Callable[[jax.Array], jax.Array]


def check_phi(phi: Phi) -> Phi:
    """Returns ``phi``.

    Raises:
      ValueError: unless ``phi`` is a name in ``PHI_NAMES`` or a callable.
    """
    if isinstance(phi, str):
        if phi not in PHI_NAMES:
            raise ValueError(f"phi must be one of {PHI_NAMES} or a callable, got {phi!r}.")
        return phi
    if not callable(phi):
        raise ValueError(f"phi must be one of {PHI_NAMES} or a callable, got {phi!r}.")
    return phi


def activation(phi: Phi) -> tuple[Elementwise, Elementwise]:
    """Returns ``(phi, phi')`` as elementwise functions, resolving names.

    Raises:
      ValueError: if ``phi`` is neither a known name nor callable.
    """
    phi = check_phi(phi)
    if phi == "tanh":
        return jnp.tanh, lambda h: 1.0 - jnp.tanh(h) ** 2
    if phi == "relu":
        return jax.nn.relu, lambda h: (h > 0).astype(h.dtype)
    if phi == "hardtanh":
        return (lambda h: jnp.clip(h, -1.0, 1.0)), lambda h: (jnp.abs(h) < 1).astype(h.dtype)
    if phi == "linear":
        return (lambda h: h), jnp.ones_like
    fn = phi
    grad = jax.grad(lambda h: fn(h))

    def dphi(h):
        return jax.vmap(grad)(h.reshape(-1)).reshape(h.shape)

    return fn, dphi
