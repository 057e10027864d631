"""Random-matrix ensembles as pure functions of a PRNG key (no Haiku).

Every sampler is ``sampler(key, shape, *, scale=1.0, dtype=None)`` (``haar_normal`` takes its
eigenvalue sampler after the shape): the key first and then the shape, as in ``jax.random``; the
law's parameters are keyword-only.

These are the samplers behind :mod:`deqjax.initializers` (the Haiku wrappers) and the Monte-Carlo
checks of :mod:`deqjax.theory`. Init paper (Agarwala & Schoenholz, "Deep equilibrium networks are
sensitive to initialization statistics"), §2.1.2 and §5.3.

Shape convention (shared by every sampler):
  A weight of shape ``shape`` (``len(shape) >= 2``) is sampled as a matrix ``M`` of shape
  ``[fan_in, fan_out]`` with ``fan_in = prod(shape[:-1])`` and ``fan_out = shape[-1]``, then
  reshaped back. This is the layout of ``hk.Linear`` (``y = x @ w``, ``w: [in, out]``), of the
  query/key/value and output projections of ``hk.MultiHeadAttention`` (which are ``hk.Linear``),
  and of ``hk.Conv2D`` kernels ``[kh, kw, c_in, c_out]`` (``fan_in = kh * kw * c_in``).

Scale convention (one for all families):
  ``E[(1/fan_out) tr(M^T M)] = scale**2``. With the mathematical operator ``W = M^T`` (``y = W x``,
  ``W: [fan_out, fan_in]``) this is the paper's ``E[(1/n) tr(W W^T)] = scale**2``: for isotropic
  inputs every output unit has mean square ``scale**2`` times the mean square of an input unit.
  For a square ``n x n`` matrix the spectral edges are then: Gaussian, circular law of radius
  ``scale``; orthogonal, all ``|lambda| = scale``; GOE, semicircle on ``[-2 scale, 2 scale]``;
  antisymmetric, ``i * `` a semicircle on ``[-2 scale, 2 scale]``. GOE and antisymmetric follow the
  textbook entry variances (``scale**2/n`` off the diagonal), so for them the convention holds up to
  a relative ``O(1/n)``: ``(1 + 1/n) scale**2`` and ``(1 - 1/n) scale**2`` respectively.
"""

from __future__ import annotations

import functools
import math
import numbers
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

EigenvalueSampler = Callable[[jax.Array, int], jax.Array]


def check_scale(scale: float, name: str = "scale") -> float:
    """Validates a concrete scale (finite, ``>= 0``); traced values pass through unchecked.

    Raises:
      ValueError: if ``scale`` is a concrete number that is negative, non-finite or not real.
    """
    if isinstance(scale, jax.core.Tracer):  # traced (e.g. vmapped over scales): checked by caller
        return scale
    if isinstance(scale, bool) or not isinstance(scale, (numbers.Real, np.ndarray, jax.Array)):
        raise ValueError(f"{name} must be a real number, got {scale!r}.")
    if np.ndim(scale) != 0:
        raise ValueError(f"{name} must be a scalar, got shape {np.shape(scale)}.")
    value = float(scale)
    if not math.isfinite(value) or value < 0.0:
        raise ValueError(f"{name} must be finite and >= 0, got {scale!r}.")
    return scale


def matrix_dims(shape: Sequence[int]) -> tuple[int, int]:
    """Returns ``(fan_in, fan_out) = (prod(shape[:-1]), shape[-1])`` (see the module docstring).

    Raises:
      ValueError: if ``shape`` has fewer than two dimensions or a zero dimension.
    """
    shape = tuple(int(s) for s in shape)
    if len(shape) < 2:
        raise ValueError(
            f"shape must have at least 2 dimensions (a matrix, conv kernel or projection), "
            f"got {shape}."
        )
    if any(s <= 0 for s in shape):
        raise ValueError(f"shape must have positive dimensions, got {shape}.")
    return math.prod(shape[:-1]), shape[-1]


def _square_dim(shape: Sequence[int], family: str) -> int:
    fan_in, fan_out = matrix_dims(shape)
    if fan_in != fan_out:
        raise ValueError(
            f"shape must be square for the {family} ensemble after the [prod(shape[:-1]), "
            f"shape[-1]] reshape, got {tuple(shape)} -> [{fan_in}, {fan_out}]."
        )
    return fan_in


def _resolve_dtype(dtype) -> tuple[jnp.dtype, jnp.dtype]:
    """Returns (output dtype, dtype to compute in: float32 at least)."""
    out = jnp.result_type(float) if dtype is None else jnp.dtype(dtype)
    if not jnp.issubdtype(out, jnp.floating):
        raise ValueError(f"dtype must be a floating dtype, got {out}.")
    compute = out if out in (jnp.dtype(jnp.float32), jnp.dtype(jnp.float64)) else jnp.float32
    return out, jnp.dtype(compute)


def _sampler_arguments(
    scale, shape, dtype, square: str | None = None
) -> tuple[jax.Array, tuple[int, ...], jnp.dtype]:
    """Checks a sampler's arguments once: (scale as a compute-dtype array, shape, output dtype).

    ``square`` names the ensemble when it needs a square matrix after the fan-in reshape.
    """
    check_scale(scale)
    if square is None:
        matrix_dims(shape)
    else:
        _square_dim(shape, square)
    out, compute = _resolve_dtype(dtype)
    return jnp.asarray(scale, compute), tuple(int(s) for s in shape), out


def gaussian(key: jax.Array, shape: Sequence[int], *, scale: float = 1.0, dtype=None) -> jax.Array:
    """I.i.d. ``N(0, scale**2 / fan_in)`` entries (the init paper's "random" ensemble).

    Args:
      key: PRNG key.
      shape: weight shape, ``len(shape) >= 2`` (see the module docstring for the reshape).
      scale: the ``scale`` of ``E[(1/n) tr(W W^T)] = scale**2``.
      dtype: floating output dtype (default: JAX's default float).

    Returns:
      An array of ``shape``; for square shapes its spectrum fills the disc of radius ``scale``.

    Example:
      >>> w = gaussian(jax.random.key(0), (256, 256), scale=0.9)
    """
    return _gaussian(key, *_sampler_arguments(scale, shape, dtype))


@functools.partial(jax.jit, static_argnames=("shape", "out"))
def _gaussian(key, scale, shape, out):
    fan_in, _ = matrix_dims(shape)
    g = jax.random.normal(key, shape, scale.dtype) / math.sqrt(fan_in)
    return (g * scale).astype(out)


def _haar_orthogonal_columns(key: jax.Array, rows: int, cols: int, dtype) -> jax.Array:
    """A Haar-distributed ``[rows, cols]`` matrix with orthonormal columns (``rows >= cols``).

    QR of a Gaussian matrix with the sign correction ``Q <- Q diag(sign(diag(R)))`` (Mezzadri 2007):
    plain QR is not Haar because LAPACK fixes the signs of ``diag(R)``.
    """
    g = jax.random.normal(key, (rows, cols), dtype)
    q, r = jnp.linalg.qr(g)  # q: [rows, cols], r: [cols, cols]
    d = jnp.diagonal(r)
    signs = jnp.where(d < 0, -1.0, 1.0).astype(dtype)
    return q * signs[None, :]


def haar_orthogonal(
    key: jax.Array, shape: Sequence[int], *, scale: float = 1.0, dtype=None
) -> jax.Array:
    """``scale`` times a Haar-random (semi-)orthogonal matrix.

    For ``fan_in >= fan_out`` the ``[fan_in, fan_out]`` matrix has orthonormal columns times
    ``scale``; for ``fan_in < fan_out`` orthonormal rows times ``scale * sqrt(fan_out / fan_in)``,
    which keeps ``(1/fan_out) tr(M^T M) = scale**2`` exactly (every draw, not only on average).

    Args:
      key: PRNG key.
      shape: weight shape, ``len(shape) >= 2``.
      scale: the ``scale`` of ``E[(1/n) tr(W W^T)] = scale**2``.
      dtype: floating output dtype.

    Returns:
      An array of ``shape``; square ones have all eigenvalues on the circle ``|lambda| = scale``.
    """
    return _haar_orthogonal(key, *_sampler_arguments(scale, shape, dtype))


@functools.partial(jax.jit, static_argnames=("shape", "out"))
def _haar_orthogonal(key, scale, shape, out):
    fan_in, fan_out = matrix_dims(shape)
    compute = scale.dtype
    if fan_in >= fan_out:
        m = _haar_orthogonal_columns(key, fan_in, fan_out, compute)
        gain = 1.0
    else:
        m = _haar_orthogonal_columns(key, fan_out, fan_in, compute).T
        gain = math.sqrt(fan_out / fan_in)
    return (m * (scale * gain)).reshape(shape).astype(out)


def goe(key: jax.Array, shape: Sequence[int], *, scale: float = 1.0, dtype=None) -> jax.Array:
    """Gaussian orthogonal ensemble: symmetric, off-diagonal variance ``scale**2/n``, diagonal
    ``2 scale**2/n`` (init paper §2.1.2). Spectrum: semicircle on ``[-2 scale, 2 scale]``.

    Raises:
      ValueError: if the (reshaped) matrix is not square.
    """
    return _symmetrised(key, *_sampler_arguments(scale, shape, dtype, "GOE"), sign=1.0)


@functools.partial(jax.jit, static_argnames=("shape", "out", "sign"))
def _symmetrised(key, scale, shape, out, sign):
    n = shape[-1]
    # One normal per unordered pair {i, j} (i <= j), gathered into both positions so that
    # m[i, j] and m[j, i] are the same number (recomputing (g + g.T) lets fused kernels differ
    # in the last bit between the two triangles).
    rows, cols = np.triu_indices(n)
    index = np.zeros((n, n), np.int32)
    index[rows, cols] = np.arange(rows.size)
    index[cols, rows] = np.arange(rows.size)
    signs = np.where(np.arange(n)[:, None] > np.arange(n)[None, :], sign, 1.0)
    # Off-diagonal variance 1/n; diagonal variance 2/n (GOE) or 0 (antisymmetric).
    gains = np.where(np.eye(n, dtype=bool), math.sqrt(2.0) if sign > 0 else 0.0, 1.0) * signs
    v = jax.random.normal(key, (rows.size,), scale.dtype)
    m = v[index] * (jnp.asarray(gains / math.sqrt(n), scale.dtype) * scale)
    return m.reshape(shape).astype(out)


def antisymmetric(
    key: jax.Array, shape: Sequence[int], *, scale: float = 1.0, dtype=None
) -> jax.Array:
    """Gaussian antisymmetric matrix (``W^T = -W``), off-diagonal variance ``scale**2/n``.

    Init paper §5.3 (after AntisymmetricRNN): a normal ensemble whose eigenvalues ``i lambda`` have
    ``lambda`` semicircular on ``[-2 scale, 2 scale]``.

    Raises:
      ValueError: if the (reshaped) matrix is not square.
    """
    return _symmetrised(key, *_sampler_arguments(scale, shape, dtype, "antisymmetric"), sign=-1.0)


def _normal_block_matrix(eigenvalues: jax.Array, n: int, compute) -> jax.Array:
    """Real block-diagonal matrix with the given spectrum (conjugate pairs for complex input)."""
    if not jnp.iscomplexobj(eigenvalues):
        return jnp.diag(eigenvalues.astype(compute))
    pairs = n // 2
    a = jnp.real(eigenvalues[:pairs]).astype(compute)
    b = jnp.imag(eigenvalues[:pairs]).astype(compute)
    zero = jnp.zeros((pairs,), compute)
    diag = jnp.repeat(a, 2)  # [2 * pairs]
    upper = jnp.stack([-b, zero], axis=1).reshape(-1)[:-1]  # [2 * pairs - 1]
    lower = jnp.stack([b, zero], axis=1).reshape(-1)[:-1]
    block = jnp.diag(diag) + jnp.diag(upper, 1) + jnp.diag(lower, -1)
    if n % 2:
        last = jnp.real(eigenvalues[pairs]).astype(compute)
        block = jnp.pad(block, ((0, 1), (0, 1)))
        block = block.at[n - 1, n - 1].set(last)
    return block


def haar_normal(
    key: jax.Array,
    shape: Sequence[int],
    eigenvalue_sampler: EigenvalueSampler,
    *,
    scale: float = 1.0,
    normalize: bool = True,
    dtype=None,
) -> jax.Array:
    """A Haar-random real normal matrix ``O B O^T`` with a user-given eigenvalue distribution.

    Init paper §5.3: "one can construct a Haar-distributed random normal family with any eigenvalue
    distribution of interest, complex or real". ``O`` is Haar orthogonal; ``B`` is block diagonal:

    * ``eigenvalue_sampler(key, n)`` returns a REAL array ``[n]``: ``B = diag(lambda)``, so the
      result is symmetric with exactly these eigenvalues (a semicircle sampler gives a GOE-like
      law).
    * it returns a COMPLEX array ``[n]``: the first ``n // 2`` values ``a + i b`` become 2x2 blocks
      ``[[a, -b], [b, a]]`` (eigenvalues ``a +- i b``), and for odd ``n`` the real part of the next
      value is one real eigenvalue. The spectrum is the conjugation-symmetrised law.

    Args:
      key: PRNG key.
      shape: a square weight shape (after the ``[prod(shape[:-1]), shape[-1]]`` reshape).
      eigenvalue_sampler: ``(key, n) -> [n]`` real or complex eigenvalues.
      scale: the ``scale`` of ``(1/n) tr(W W^T) = scale**2``.
      normalize: if True, rescale each draw's eigenvalues to mean ``|lambda|**2`` exactly 1 before
        multiplying by ``scale`` (the convention then holds every draw, as for ``haar_orthogonal``);
        if False, use the sampler's values as given (the sampler should then have
        ``E|lambda|**2 = 1``).
      dtype: floating output dtype.

    Returns:
      A real normal matrix of ``shape``.

    Raises:
      ValueError: if the shape is not square or the sampler output has the wrong shape.

    Example:
      >>> disk = lambda k, n: jnp.sqrt(jax.random.uniform(k, (n,))) * jnp.exp(
      ...     2j * jnp.pi * jax.random.uniform(jax.random.fold_in(k, 1), (n,)))
      >>> w = haar_normal(jax.random.key(0), (64, 64), disk, scale=0.5)
    """
    if not callable(eigenvalue_sampler):
        raise ValueError(f"eigenvalue_sampler must be callable, got {eigenvalue_sampler!r}.")
    scale, shape, out = _sampler_arguments(scale, shape, dtype, "Haar-normal")
    n = shape[-1]
    key_eig, _ = jax.random.split(key)
    got = jax.eval_shape(lambda k: eigenvalue_sampler(k, n), key_eig)
    if getattr(got, "shape", None) != (n,):
        raise ValueError(
            f"eigenvalue_sampler(key, {n}) must return shape ({n},), got "
            f"{getattr(got, 'shape', got)}."
        )
    return _haar_normal(key, scale, shape, out, eigenvalue_sampler, bool(normalize))


@functools.partial(jax.jit, static_argnums=(2, 3, 4, 5))
def _haar_normal(key, scale, shape, out, eigenvalue_sampler, normalize):
    n = shape[-1]
    compute = scale.dtype
    key_eig, key_basis = jax.random.split(key)
    eigenvalues = jnp.asarray(eigenvalue_sampler(key_eig, n))
    block = _normal_block_matrix(eigenvalues, n, compute)  # [n, n]
    if normalize:
        rms = jnp.sqrt(jnp.sum(block * block) / n)
        block = block / jnp.where(rms > 0, rms, jnp.ones((), compute))
    basis = _haar_orthogonal_columns(key_basis, n, n, compute)
    m = basis @ block @ basis.T
    return (m * scale).reshape(shape).astype(out)
