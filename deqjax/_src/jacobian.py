"""Jacobian diagnostics of a DEQ cell at its equilibrium (JR paper §4, Eq. 1–4).

* :func:`frobenius_sq` — the Hutchinson estimate of ``‖J_f(z)‖²_F / d`` (JR paper, Eq. 3–4), through
  vector–Jacobian products only and differentiable, so it can be used as a training penalty.
* :func:`spectral_radius` — a power-method monitor of ``ρ(J_f(z))`` (the JR paper's Fig. 7), which
  also reports the modulus of a dominant complex-conjugate pair.
* :func:`backward_convergence` — runs the backward (adjoint) solve of Eq. 2 outside autodiff and
  returns its :class:`~deqjax.solvers.Solution` (the "backward convergence" curves of Fig. 3b/10a,
  with the trace). Inside a training step the backward that actually ran reports its summed
  statistics through the :class:`~deqjax.BackwardStats` gradient channel instead.

All three take the map ``z ↦ f(z)`` at fixed parameters as a closure (e.g. ``lambda z: cell(params,
x, z)``); ``z`` may be any state the solvers take (:func:`deqjax._src.tree.check_state_tree`: a
pytree of float arrays, or of complex arrays) and ``d`` is always its total number of entries.

**Complex states.** A complex state is a vector of ``C^n`` seen as ``R^{2n}`` (real and imaginary
parts), and ``J`` is the real Jacobian ``J_R`` of ``f`` there (``2n × 2n``; ``f`` may use
``conj(z)``). For a holomorphic ``f``, with complex Jacobian ``A = ∂f/∂z``,
``J_R = [[Re A, −Im A], [Im A, Re A]]``: ``‖J_R‖²_F / (2n) = ‖A‖²_F / n`` and the eigenvalues of
``J_R`` are those of ``A`` and their conjugates, so both diagnostics then read as ``A``'s.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp

from deqjax._src import checks, tree, vma
from deqjax._src.adjoints import backward_solve
from deqjax._src.normalise import as_solver
from deqjax._src.solvers import anderson as anderson_lib
from deqjax._src.solvers import base
from deqjax._src.solvers.solution import Solution

PyTree = Any
MapFn = Callable[[PyTree], PyTree]
CellFn = Callable[[PyTree, PyTree, PyTree], PyTree]


def _check_map(f: MapFn, z: PyTree, key: Any, count: int, count_name: str) -> jnp.dtype:
    """Checks the arguments shared by the two estimators; returns ``z``'s reduction dtype."""
    if not callable(f):
        raise ValueError(f"f must be callable, got {type(f).__name__}.")
    tree.check_state_tree(z, "z")
    if not isinstance(key, jax.Array):
        raise ValueError(f"key must be a jax.random key array, got {type(key).__name__}.")
    checks.check_positive_int(count, count_name)
    return tree.reduction_dtype(z)


def _normal_like(key: jax.Array, z: PyTree) -> PyTree:
    """A pytree like ``z`` of i.i.d. standard normals (one independent key per leaf); on a complex
    leaf standard complex normals (``E|ε_i|² = 1``: real and imaginary parts of variance 1/2)."""
    leaves, treedef = jax.tree_util.tree_flatten(z)
    keys = jax.random.split(key, len(leaves))
    samples = [jax.random.normal(k, jnp.shape(leaf), leaf.dtype) for k, leaf in zip(keys, leaves)]
    return jax.tree_util.tree_unflatten(treedef, samples)


def frobenius_sq(f: MapFn, z: PyTree, key: jax.Array, *, num_samples: int = 1) -> jax.Array:
    """Hutchinson estimate of ``‖J_f(z)‖²_F / d`` (JR paper, Eq. 3–4 and App. A.4).

    Computes ``(1 / (M d)) Σ_m ‖ε_mᵀ J_f(z)‖²`` with ``ε_m ~ N(0, I_d)`` i.i.d., using one
    linearisation of ``f`` and ``M = num_samples`` vector–Jacobian products (the Jacobian is never
    formed). Since ``E‖εᵀJ‖² = tr(J Jᵀ) = ‖J‖²_F`` (Eq. 3) the estimate is unbiased; its relative
    standard deviation is ``sqrt(2/M) ‖J Jᵀ‖_F / ‖J‖²_F``, between ``sqrt(2/(M d))`` (``J`` a
    multiple of an orthogonal matrix) and ``sqrt(2/M)`` (``J`` of rank one) — the ``M^{-1/2}`` of
    the JR paper §4.2.

    The result is differentiable in ``z`` and in anything ``f`` closes over (e.g. the cell's
    parameters): its gradient is what trains the model in Eq. 4.

    ``d`` is the total number of entries of ``z``. For a batch stored in one array, with ``f``
    acting per example, the Jacobian is block-diagonal and the result is the batch mean of the
    per-example ``‖J_i‖²_F / d_i`` — the normalisation of the JR paper's reference code.

    For a complex ``z`` (``d`` complex entries) the probes are standard complex normals and the
    estimate is that of ``‖J_R‖²_F / (2d)`` (module docstring), ``‖∂f/∂z‖²_F / d`` for a
    holomorphic ``f``.

    Args:
      f: the map ``z ↦ f(z)`` (parameters and input bound, e.g. ``lambda z: cell(p, x, z)``).
      z: the point (usually the equilibrium ``z*``), a pytree of float arrays, or of complex
        arrays.
      key: a ``jax.random`` key for the probe vectors.
      num_samples: ``M``, the number of probe vectors (``>= 1``).

    Returns:
      A real scalar in the reduction dtype of ``z`` (float64 if any leaf is float64 or
      complex128, else float32).

    Raises:
      ValueError: if ``f`` is not callable, ``z`` is not a state (float or complex pytree),
        ``key`` is not an array, or ``num_samples`` is not a positive int.

    Example:
      >>> z_star, _ = dq.fixed_point(cell, params, x, z0)
      >>> jr = dq.jacobian.frobenius_sq(lambda z: cell(params, x, z), z_star, key)
    """
    dtype = _check_map(f, z, key, num_samples, "num_samples")
    d = tree.tree_size(z)
    f_z, vjp = jax.vjp(f, z)
    probes = jax.vmap(lambda k: _normal_like(k, z))(jax.random.split(key, num_samples))
    probes = vma.like(probes, f_z)  # this device's own cotangents where f(z) varies over devices
    (eps_j,) = jax.vmap(vjp)(probes)  # [M, ...] per leaf
    return tree.tree_sq_norm(eps_j).astype(dtype) / jnp.asarray(num_samples * d, dtype)


def _as_real(t: PyTree) -> PyTree:
    """A complex pytree as a real one: each leaf ``a`` becomes ``[Re a, Im a]`` (a new leading
    axis of 2, in ``a``'s real dtype)."""
    return jax.tree_util.tree_map(lambda a: jnp.stack([jnp.real(a), jnp.imag(a)]), t)


def _as_complex(t: PyTree) -> PyTree:
    """The inverse of :func:`_as_real`."""
    return jax.tree_util.tree_map(lambda r: jax.lax.complex(r[0], r[1]), t)


def _realified(f: MapFn, z: PyTree) -> tuple[MapFn, PyTree]:
    """``f`` and ``z`` on ``R^{2n}`` for a complex ``z`` (module docstring); as given otherwise."""
    if not tree.is_complex(z):
        return f, z
    return lambda r: _as_real(f(_as_complex(r))), _as_real(z)


def _ritz_radius(h11, h12, h21, h22):
    """Largest eigenvalue modulus of the real 2×2 matrix ``[[h11, h12], [h21, h22]]``."""
    half_trace = 0.5 * (h11 + h22)
    det = h11 * h22 - h12 * h21
    disc = half_trace * half_trace - det
    sqrt_disc = jnp.sqrt(jnp.maximum(disc, 0.0))
    real_pair = jnp.maximum(jnp.abs(half_trace + sqrt_disc), jnp.abs(half_trace - sqrt_disc))
    complex_pair = jnp.sqrt(jnp.maximum(det, 0.0))  # |λ|² = det for a conjugate pair
    return jnp.where(disc >= 0, real_pair, complex_pair)


def spectral_radius(f: MapFn, z: PyTree, key: jax.Array, *, num_steps: int = 100) -> jax.Array:
    """Power-method estimate of the spectral radius ``ρ(J_f(z)) = max_i |λ_i|`` (JR paper §4.1).

    The monitor of the JR paper's Fig. 7. ``f`` is linearised once at ``z`` and ``num_steps``
    normalised Jacobian–vector products ``v ← J v / ‖J v‖`` are run from a random Gaussian ``v``.
    The estimate is then read off the last Krylov pair ``(v, J v)`` by a 2×2 Rayleigh–Ritz step
    (``J²v`` costs one more JVP): the largest modulus of the eigenvalues of ``J`` projected on
    ``span{v, J v}``. This handles the cases where plain power iteration does not settle:

    * a dominant *negative* eigenvalue (``v`` flips sign every step): the estimate is ``|λ|``;
    * dominant ``±λ`` (both signs, equal modulus): ``span{v, Jv}`` is their invariant plane;
    * a dominant *complex-conjugate pair* ``r e^{±iθ}`` (``v`` rotates in a plane): the projected
      2×2 matrix has the pair as eigenvalues and the estimate is ``r``.

    When ``v`` has converged to a real eigenvector the plane degenerates; then the estimate is
    ``‖J v‖`` (``= |λ|``), used whenever the part of ``J v`` orthogonal to ``v`` is below
    ``sqrt(eps) ‖J v‖``.

    Limits of the method (document them next to any plot made with it):

    * Convergence is geometric in ``|λ_2| / |λ_1|`` (``|λ_3| / |λ_1|`` for a dominant pair): a
      nearly degenerate top of the spectrum needs many steps. Two real dominant eigenvalues of
      different moduli that are both close to the top, or more than two eigenvalues of (nearly)
      the same modulus (e.g. a Haar-orthogonal ``J``), give an estimate that is only a
      Rayleigh–Ritz value of a non-invariant plane: for a normal ``J`` it never exceeds ``ρ``, but
      for a strongly non-normal ``J`` it lies anywhere in the field of values and can exceed ``ρ``
      before convergence.
    * A random start has zero component along the top eigenvector with probability 0 only in exact
      arithmetic; a ``J`` that is nilpotent or has all eigenvalues 0 gives ``0``.
    * It is a monitor: the result carries no gradient (``stop_gradient``).

    For a batch stored in one array with ``f`` acting per example, the result is the maximum over
    examples (a block-diagonal ``J``), reached at the rate of the slowest block; ``jax.vmap`` this
    function for per-example radii.

    For a complex ``z`` the method runs on its real and imaginary parts: the result is
    ``ρ(J_R)`` (module docstring), ``ρ(∂f/∂z)`` for a holomorphic ``f``, and it is right also for
    an ``f`` that uses ``conj(z)``. A dominant complex eigenvalue ``λ`` of a holomorphic ``f``
    appears in ``J_R`` as the pair ``λ, conj(λ)``, which the Rayleigh–Ritz step above resolves.

    Args:
      f: the map ``z ↦ f(z)`` (parameters and input bound).
      z: the point (usually the equilibrium ``z*``), a pytree of float arrays, or of complex
        arrays.
      key: a ``jax.random`` key for the starting vector.
      num_steps: power iterations (``>= 1``); the total cost is ``num_steps + 1`` JVPs.

    Returns:
      A non-negative scalar in the reduction dtype of ``z``.

    Raises:
      ValueError: for a non-callable ``f``, a ``z`` that is not a state (float or complex
        pytree), a non-array ``key`` or ``num_steps < 1``.

    Example:
      >>> rho = dq.jacobian.spectral_radius(lambda z: cell(params, x, z), z_star, key)
    """
    dtype = _check_map(f, z, key, num_steps, "num_steps")
    z = jax.lax.stop_gradient(jax.tree_util.tree_map(jnp.asarray, z))
    f, z = _realified(f, z)
    _, jvp = jax.linearize(f, z)
    tiny = jnp.asarray(jnp.finfo(dtype).tiny, dtype)

    def normalise(v):
        norm = tree.tree_norm(v)
        return tree.tree_scale(1.0 / jnp.maximum(norm, tiny), v), norm

    v0, _ = normalise(vma.like(_normal_like(key, z), z))

    def power_step(_, v):
        return normalise(jvp(v))[0]

    v = vma.fori_loop(0, num_steps, power_step, v0)
    jv = jvp(v)
    jv_norm = tree.tree_norm(jv)
    # Rayleigh–Ritz on span{v, Jv} with the orthonormal basis q1 = v, q2 ∝ Jv − (vᵀJv) v.
    h11 = tree.tree_vdot(v, jv)
    resid = tree.tree_axpy(-h11, v, jv)
    resid_norm = tree.tree_norm(resid)
    degenerate = resid_norm <= jnp.sqrt(jnp.finfo(dtype).eps) * jv_norm
    q2 = tree.tree_scale(1.0 / jnp.maximum(resid_norm, tiny), resid)
    jq2 = jvp(q2)
    h12 = tree.tree_vdot(v, jq2)
    h21 = resid_norm  # q2ᵀ J q1 = q2ᵀ Jv
    h22 = tree.tree_vdot(q2, jq2)
    ritz = _ritz_radius(h11, h12, h21, h22)
    estimate = jnp.where(degenerate, jv_norm, ritz)
    return jax.lax.stop_gradient(estimate.astype(dtype))


def backward_convergence(
    f: CellFn,
    params: PyTree,
    x: PyTree,
    z_star: PyTree,
    cotangent: PyTree,
    *,
    solver: base.Solver = anderson_lib.anderson,
    fallback: base.Solver | str | None = None,
    batch_ndim: int = 0,
) -> Solution:
    """Runs the backward solve ``uᵀ = uᵀ J_f(z*) + g`` (JR paper, Eq. 2) and returns its statistics.

    The same solve :class:`deqjax.ImplicitAdjoint` runs inside the VJP of
    :func:`deqjax.fixed_point` (it calls the one implementation,
    ``deqjax._src.adjoints.backward_solve.solve_adjoint``: first solve, then ``fallback`` where
    it did not converge),
    run here on stopped-gradient inputs so that its :class:`~deqjax.solvers.Solution` — steps,
    residuals, trace, status — can be logged. This is the "backward convergence" monitor of the
    JR paper's Fig. 3b/10a; pass the adjoint's backward ``solver`` and ``fallback="gmres"`` (the
    adjoint's default) to see what training sees. Inside a training step the cheaper way is the
    :class:`~deqjax.BackwardStats` gradient channel, which reports the solve training actually ran.

    Args:
      f: the cell ``f(params, x, z)``.
      params: its parameters.
      x: its input.
      z_star: the (forward) fixed point.
      cotangent: ``g = ∂ℓ/∂z*``, a pytree like ``z_star``, e.g.
        ``jax.grad(lambda z: loss(head(z)))(z_star)``. For a complex ``z_star`` it is JAX's
        cotangent (what ``jax.grad`` of a real loss returns), and ``uᵀ J`` is the VJP of ``f`` in
        JAX's convention (``Aᵀ u``, no conjugation, for a holomorphic ``f`` of Jacobian ``A``),
        as in the implicit gradient.
      solver: the backward solver ``(h, u0) -> Solution``, e.g.
        ``dq.solvers.Anderson(max_steps=6, tol=1e-4)`` (an object, a function or a
        ``functools.partial``); default ``anderson``.
      fallback: as in :class:`deqjax.ImplicitAdjoint` (``"gmres"``, a solver, or ``None``:
        the default here, the first solve only).
      batch_ndim: leading axes of ``z_star`` that index independent problems (a batch-native
        solver solves them as such; another solves the batch as one problem); 0: the solver's
        own ``batch_ndim`` (by default one problem per call; ``jax.vmap`` it for per-example
        solves).

    Returns:
      The backward :class:`~deqjax.solvers.Solution` for ``u`` (its ``value`` is ``u``): with a
      fallback, ``num_steps`` counts both solves, residuals and ``status`` are the final ones and
      ``trace`` is the first solve's.

    Raises:
      ValueError: if ``f`` or ``solver`` is not callable or ``z_star``/``cotangent`` are not
        states (float or complex pytrees).

    Example:
      >>> g = jax.grad(lambda z: jnp.sum((z - y) ** 2))(z_star)
      >>> sol_b = dq.jacobian.backward_convergence(cell, params, x, z_star, g, solver=bwd)
      >>> sol_b.rel_residual, sol_b.num_steps
    """
    if not callable(f):
        raise ValueError(f"f must be callable, got {type(f).__name__}.")
    solver = as_solver(solver)
    tree.check_state_tree(z_star, "z_star")
    tree.check_state_tree(cotangent, "cotangent")
    fallback = backward_solve.normalise_fallback(fallback)
    config = backward_solve.resolve_backward(solver, fallback, batch_ndim=batch_ndim)
    stop = jax.lax.stop_gradient
    vjp = backward_solve.linearise(f, stop(params), stop(x), stop(z_star))
    return stop(backward_solve.solve_adjoint(vjp, stop(cotangent), config).solution)
