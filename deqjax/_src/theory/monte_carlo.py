"""Monte-Carlo counterparts of the theory's predictions, measured on one random matrix.

Each function measures, on one matrix ``W`` drawn at width ``n`` (:func:`sample_matrix`), the
quantity a prediction gives in the large-``n`` limit (init paper Figs. 1-3):

* :func:`linear_trace` — :func:`~deqjax.theory.linear_second_moment` (Fig. 1);
* :func:`forward_iteration`'s variance ``q`` — :func:`~deqjax.theory.mean_field_variance` (Fig. 2),
  and its residual, the transition of Fig. 4;
* :func:`jacobian_radius` — Theorem 3.2's :func:`~deqjax.theory.spectral_radius` (Fig. 3).

Host-side numpy results (float64 when x64 is on): these are measurements for plots and tables, not
training code. Argument order as in the predictions, with the matrix ``w`` in place of the scale:
``jacobian_radius(w, ensemble, h, phi)`` mirrors ``spectral_radius(scale, ensemble, q, phi)``.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from deqjax._src import random_matrices
from deqjax._src.theory import activations, ensembles
from deqjax._src.theory.activations import Phi

SAMPLERS = {
    "gaussian": random_matrices.gaussian,
    "orthogonal": random_matrices.haar_orthogonal,
    "goe": random_matrices.goe,
}


def sample_matrix(key: jax.Array, n: int, scale: float, ensemble: str) -> np.ndarray:
    """An ``n x n`` draw of ``ensemble`` at ``scale`` (numpy, float64 under x64).

    The pure sampler of :mod:`deqjax.initializers` for the ensemble (``gaussian``,
    ``haar_orthogonal`` or ``goe``) with ``E[(1/n) tr(W W^T)] = scale**2``.

    Args:
      key: a ``jax.random`` key.
      n: the width.
      scale: the weight scale.
      ensemble: ``"gaussian"``, ``"orthogonal"`` or ``"goe"``.

    Returns:
      The matrix ``W`` ``[n, n]``.

    Raises:
      ValueError: for an unknown ensemble or an invalid scale.

    Example:
      >>> w = dq.theory.sample_matrix(jax.random.key(0), 500, 0.9, "goe")
    """
    ensembles.check_ensemble(ensemble)
    return np.asarray(SAMPLERS[ensemble](key, (n, n), scale=scale, dtype=jnp.float64))


def linear_trace(w: np.ndarray) -> float:
    """``(1/n) tr((I - W)^{-1} (I - W)^{-T})``: the linear DEQ's ``(1/n) E_x ||z*||^2`` (Fig. 1).

    The measurement of :func:`~deqjax.theory.linear_second_moment` on the matrix ``w`` ``[n, n]``.
    """
    n = w.shape[0]
    resolvent = np.linalg.inv(np.eye(n) - w)
    return float(np.sum(resolvent * resolvent) / n)


def forward_iteration(w, x, phi: Phi, *, steps: int) -> tuple[float, float, np.ndarray]:
    """Runs ``h <- W phi(h) + x`` (init paper Eq. 23) from ``h = 0`` for each column of ``x``.

    Args:
      w: the matrix ``[n, n]``.
      x: the inputs ``[n, B]``, one per column.
      phi: a name in ``PHI_NAMES`` or an elementwise callable.
      steps: the number of iterations.

    Returns:
      ``(q, residual, h)``: mean of ``h**2`` over the last third of the steps (Fig. 2), the
      relative residual ``||h_T+1 - h_T|| / ||h_T||`` per column, averaged (Fig. 4), and the last
      iterate ``[n, B]``.
    """
    q, res, h = _forward_iteration(jnp.asarray(w), jnp.asarray(x), phi=phi, steps=steps)
    return float(q), float(res), np.asarray(h)


@functools.partial(jax.jit, static_argnames=("phi", "steps"))
def _forward_iteration(w, x, *, phi, steps):
    fn, _ = activations.activation(phi)
    tail = max(steps // 3, 1)

    def body(k, carry):
        h, acc = carry
        h = w @ fn(h) + x
        acc = acc + jnp.where(k >= steps - tail, jnp.mean(h * h), 0.0)
        return h, acc

    h, acc = jax.lax.fori_loop(0, steps, body, (jnp.zeros_like(x), jnp.zeros((), x.dtype)))
    nxt = w @ fn(h) + x
    res = jnp.linalg.norm(nxt - h, axis=0) / (jnp.linalg.norm(h, axis=0) + 1e-30)
    return acc / tail, jnp.mean(res), h


def jacobian_radius(w: np.ndarray, ensemble: str, h: np.ndarray, phi: Phi) -> float:
    """``max |eig(diag(phi'(h)) W)|``: the DEQ Jacobian's spectral radius at the state ``h``.

    The measurement of Theorem 3.2's :func:`~deqjax.theory.spectral_radius` on one matrix (Fig. 3),
    by a dense eigen-decomposition. For the GOE with ``phi' >= 0`` the spectrum is computed from the
    symmetric ``D^{1/2} W D^{1/2}``, ``D = diag(phi'(h))`` (same eigenvalues, App. C.1).

    Args:
      w: the matrix ``[n, n]``.
      ensemble: the ensemble ``w`` was drawn from (``"goe"`` selects the symmetric form).
      h: the pre-activations ``[n]``, e.g. a column of :func:`forward_iteration`'s last iterate.
      phi: a name in ``PHI_NAMES`` or an elementwise callable.

    Returns:
      The spectral radius.

    Raises:
      ValueError: for an unknown ensemble or ``phi``.
    """
    ensembles.check_ensemble(ensemble)
    _, dphi = activations.activation(phi)
    d = np.asarray(dphi(jnp.asarray(h)))
    if ensemble == "goe" and np.all(d >= 0):
        root = np.sqrt(d)
        return float(np.abs(np.linalg.eigvalsh(root[:, None] * w * root[None, :])).max())
    return float(np.abs(np.linalg.eigvals(d[:, None] * w)).max())
