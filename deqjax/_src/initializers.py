"""Initializers drawing DEQ weights from random-matrix ensembles (init paper §2, §5.3), for
Haiku, Flax and Equinox alike.

Each class is a plain object around a pure sampler of :mod:`deqjax._src.random_matrices` that
takes both initializer protocols:

* Haiku's ``init(shape, dtype)``: the key is ``hk.next_rng_key()``, so it works as the
  ``w_init=`` of any Haiku module;
* JAX's ``init(key, shape, dtype=None)`` (``jax.nn.initializers``, ``flax.nnx.initializers``): a
  key array first, so it works as the ``kernel_init=`` of any Flax module, and as what
  ``deqjax.equinox``'s cells draw their weights with at construction.

The first argument tells them apart: a key array, or a shape. The reshape convention
(``fan_in = prod(shape[:-1])``, matrix ``[fan_in, fan_out]``, so ``hk.Linear``/``nnx.Linear``
kernels, attention projections and conv kernels all work) and the scale convention
``E[(1/n) tr(W W^T)] = scale**2`` are documented in that module. Haiku is imported only by a
Haiku-form call: building an initializer, importing this module and a JAX-form call need only JAX.

Example:
  >>> linear = hk.Linear(256, w_init=dq.initializers.HaarOrthogonal(0.9))
  >>> linear = nnx.Linear(256, 256, kernel_init=dq.initializers.HaarOrthogonal(0.9), rngs=rngs)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from deqjax._src import random_matrices


def _next_rng_key() -> jax.Array:
    """Haiku's next key (inside ``hk.transform``); Haiku is imported here, on first use."""
    import haiku as hk

    return hk.next_rng_key()


def _jax_form(key: jax.Array, shape: Sequence[int], dtype: Any = None) -> tuple[Any, ...]:
    return key, shape, dtype


def _haiku_form(shape: Sequence[int], dtype: Any) -> tuple[Any, ...]:
    return _next_rng_key(), shape, dtype


def key_shape_dtype(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
    """``(key, shape, dtype)`` of an initializer call in either protocol (module docstring): JAX's
    ``(key, shape, dtype=None)`` when the first argument is an array (a key), else Haiku's
    ``(shape, dtype)`` with ``hk.next_rng_key()``."""
    if args and isinstance(args[0], (jax.Array, np.ndarray)):
        return _jax_form(*args, **kwargs)
    return _haiku_form(*args, **kwargs)


class _EnsembleInitializer:
    """Shared constructor (an eagerly validated ``scale``) and call: ``sampler(key, shape,
    scale=scale, dtype=dtype)`` with the key given (JAX form) or Haiku's next key; a subclass names
    its ``sampler``."""

    sampler: Any = None

    def __init__(self, scale: float = 1.0):
        """Builds the initializer; Haiku is needed only when Haiku calls it.

        Args:
          scale: ``E[(1/n) tr(W W^T)] = scale**2``; a finite number ``>= 0``.

        Raises:
          ValueError: for an invalid or traced ``scale``. At call time, the sampler's own errors:
            a shape with fewer than 2 dimensions, or (GOE, antisymmetric, Haar-normal) one that is
            not square after the ``[prod(shape[:-1]), shape[-1]]`` reshape.
        """
        random_matrices.check_scale(scale)
        if isinstance(scale, jax.core.Tracer):
            raise ValueError("scale must be a concrete number, not a traced value.")
        self.scale = float(scale)

    def __call__(self, *args: Any, **kwargs: Any) -> jax.Array:
        """``init(shape, dtype)`` (Haiku) or ``init(key, shape, dtype=None)`` (JAX, Flax)."""
        key, shape, dtype = key_shape_dtype(args, kwargs)
        return type(self).sampler(key, shape, scale=self.scale, dtype=dtype)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(scale={self.scale})"


class Gaussian(_EnsembleInitializer):
    """I.i.d. ``N(0, scale**2 / fan_in)``: spectrum fills the disc of radius ``scale``."""

    sampler = staticmethod(random_matrices.gaussian)


class HaarOrthogonal(_EnsembleInitializer):
    """``scale`` times a Haar-random (semi-)orthogonal matrix (QR with sign correction).

    Square weights have every eigenvalue on ``|lambda| = scale``. Non-square: see
    :func:`deqjax.initializers.haar_orthogonal`.
    """

    sampler = staticmethod(random_matrices.haar_orthogonal)


class GOE(_EnsembleInitializer):
    """Gaussian orthogonal ensemble: symmetric, off-diagonal variance ``scale**2/n``, diagonal
    ``2 scale**2/n``; semicircle spectrum on ``[-2 scale, 2 scale]``.
    """

    sampler = staticmethod(random_matrices.goe)


class Antisymmetric(_EnsembleInitializer):
    """Gaussian antisymmetric matrix (``W^T = -W``, off-diagonal variance ``scale**2/n``); purely
    imaginary eigenvalues, semicircular on ``i [-2 scale, 2 scale]`` (init paper §5.3).
    """

    sampler = staticmethod(random_matrices.antisymmetric)


class HaarNormal(_EnsembleInitializer):
    """Haar-random real normal matrix ``O B O^T`` with eigenvalues drawn by a user sampler
    (init paper §5.3).

    Args:
      eigenvalue_sampler: ``(key, n) -> [n]`` eigenvalues, real (symmetric result) or complex
        (conjugate pairs; see :func:`deqjax.initializers.haar_normal`).
      scale: finite and ``>= 0``; each draw is normalised to ``(1/n) tr(W W^T) = scale**2``
        unless ``normalize=False``.
      normalize: rescale each draw's eigenvalues to unit mean square before applying ``scale``.

    Raises:
      ValueError: for an invalid ``scale`` or a non-callable sampler; at call time, for a
        non-square shape.

    Example:
      >>> circle = lambda k, n: jnp.exp(2j * jnp.pi * jax.random.uniform(k, (n,)))
      >>> w_init = HaarNormal(circle, 0.9)  # a Haar orthogonal matrix, built another way
    """

    def __init__(
        self,
        eigenvalue_sampler: random_matrices.EigenvalueSampler,
        scale: float = 1.0,
        *,
        normalize: bool = True,
    ):
        super().__init__(scale)
        if not callable(eigenvalue_sampler):
            raise ValueError(f"eigenvalue_sampler must be callable, got {eigenvalue_sampler!r}.")
        self.eigenvalue_sampler = eigenvalue_sampler
        self.normalize = bool(normalize)

    def __call__(self, *args: Any, **kwargs: Any) -> jax.Array:
        """``init(shape, dtype)`` (Haiku) or ``init(key, shape, dtype=None)`` (JAX, Flax)."""
        key, shape, dtype = key_shape_dtype(args, kwargs)
        return random_matrices.haar_normal(
            key,
            shape,
            self.eigenvalue_sampler,
            scale=self.scale,
            normalize=self.normalize,
            dtype=dtype,
        )

    def __repr__(self) -> str:
        return f"HaarNormal({self.eigenvalue_sampler!r}, scale={self.scale})"
