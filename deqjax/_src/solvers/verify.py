"""The check of a solve at full precision: what a solver reports holds whatever precision f ran in.

A solver judges its iterates by the residuals it computes from ``f`` as ``f`` is traced: with
float32 products at reduced precision (JAX's default on GPUs: TF32, operands rounded to 10
mantissa bits; ``precision=`` of ``dq.fixed_point``) those residuals carry the rounding of the
products, and a tolerance below it is "met" by noise: solves reported converged that, recomputed
in float64, are not (BENCHMARKS.md, "Honest numbers").

So where ``f`` runs at reduced precision (:func:`deqjax._src.precision.full_twin` tells, at trace
time, from the precision of the cell and the ambient setting), :func:`verified` evaluates ``f``
once more, at full precision, at the returned iterate, per problem, and reports what that
evaluation says:

* ``abs_residual`` and ``rel_residual`` are the full-precision residuals of ``value``;
* a problem that reported ``CONVERGED`` but whose full-precision residual (by ``stop_mode``) is
  above ``tol`` reports ``PRECISION_FLOOR``: it stopped at the floor of the reduced arithmetic,
  not at ``tol``. The other codes keep their meaning (a ``MAX_STEPS`` or ``STALLED`` solve stays
  one, with its full-precision residual).

The iterate, ``num_steps`` (the loop's evaluations), the ``trace`` (the loop's residuals, as it
saw them) and ``f_value`` (the loop's ``f(value)``) are unchanged. Where ``f`` runs at full
precision already (``"highest"``, or the ambient setting is) nothing is added to the program.
The check costs one evaluation of ``f`` per solve (the implicit backward: one more linearisation
of the cell, see :mod:`deqjax._src.adjoints.implicit`); BENCHMARKS.md, "Honest numbers", gives
its time.

The first solve traced on a GPU or TPU with a reduced precision and a relative tolerance below
that precision's rounding warns once (:class:`PrecisionFloorWarning`), naming ``tol``, the
precision and the floor to expect; the floor actually hit is in the Solution (and in
``dq.solvers.summarize``'s ``precision_floor`` fraction and ``rel_residual_max``).
"""

from __future__ import annotations

import threading
import warnings

import jax
import jax.numpy as jnp

from deqjax._src import tree
from deqjax._src.solvers import stopping
from deqjax._src.solvers.problem import Problem
from deqjax._src.solvers.solution import CONVERGED, PRECISION_FLOOR, Solution

# The rounding of one float32 product at a reduced precision, on the accelerators that reduce it:
# TF32 keeps 10 mantissa bits (2^-11), bfloat16 7 (2^-8). JAX's default is TF32 on NVIDIA GPUs
# and one bfloat16 pass on TPUs.
_ROUNDING = {"tensorfloat32": 2.0**-11, "bfloat16": 2.0**-8}
_DEFAULT_ROUNDING = {"gpu": 2.0**-11, "tpu": 2.0**-8}

_warned: set[tuple[float, str, str]] = set()
_warned_lock = threading.Lock()


class PrecisionFloorWarning(UserWarning):
    """A solve's tolerance is below what its matmul precision resolves on this backend."""


def expected_floor(precision: str, backend: str) -> float | None:
    """The relative rounding of one float32 product at ``precision`` on ``backend``, or ``None``
    where the products are full float32 (CPUs, or a full-precision setting)."""
    if backend not in _DEFAULT_ROUNDING:
        return None
    if precision == "default":
        return _DEFAULT_ROUNDING[backend]
    return _ROUNDING.get(precision)


def warn_once(tol: float, stop_mode: str, precision: str, backend: str) -> None:
    """Warns once per ``(tol, stop_mode, precision)`` where a relative ``tol`` is below the
    rounding :func:`expected_floor` gives for ``precision`` on ``backend``."""
    floor = expected_floor(precision, backend)
    if floor is None or stop_mode == "abs" or not 0 < tol < floor:
        return
    key = (float(tol), stop_mode, precision)
    with _warned_lock:
        if key in _warned:
            return
        _warned.add(key)
    warnings.warn(
        f"tol={tol:g} (stop_mode={stop_mode!r}) is below the rounding of float32 products at "
        f"matmul precision {precision!r} on {backend} (about {floor:.1e} relative per "
        "product): solves may stop at that floor. deqjax checks each solve with one full-precision "
        "evaluation of f, so those report status PRECISION_FLOOR and their full-precision "
        "residuals. To reach tol, pass precision='highest' (dq.fixed_point, dq.nn.DEQ) or set "
        "jax.config.update('jax_default_matmul_precision', 'highest'); or raise tol.",
        PrecisionFloorWarning,
        stacklevel=2,
    )


def verified(problem: Problem, rule: stopping.StoppingRule, sol: Solution) -> Solution:
    """``sol`` with its residuals and status recomputed from one full-precision evaluation of
    ``f`` at ``sol.value`` (see the module docstring); ``sol`` itself where ``f`` runs at full
    precision.

    Args:
      problem: the solved problem (its ``full_fn`` is ``f`` at full precision, or ``None``).
      rule: the stopping rule the solve ran by (its ``tol``, ``stop_mode`` and batch axes).
      sol: the solver's Solution.
    """
    if problem.full_fn is None:
        return sol
    warn_once(rule.tol, rule.stop_mode, problem.precision, jax.default_backend())
    value = sol.value
    fx, _ = problem.full_fn(value)
    r = stopping.residuals(value, fx, tree.tree_sub(fx, value), rule, problem.rdtype)
    met = r.finite & (r.res <= jnp.asarray(rule.tol, problem.rdtype))
    status = jnp.where((sol.status == CONVERGED) & ~met, PRECISION_FLOOR, sol.status)
    return sol._replace(
        abs_residual=r.abs.astype(sol.abs_residual.dtype),
        rel_residual=r.rel.astype(sol.rel_residual.dtype),
        status=status.astype(sol.status.dtype),
    )
