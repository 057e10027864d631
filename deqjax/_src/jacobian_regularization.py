"""The Jacobian-regularized training objective of the JR paper (§4.2 Eq. 4, App. A.4).

    L_total = L_orig + τ · γ · (1 / (M d)) Σ_m ‖ε_mᵀ J_f(z*)‖²,   ε_m ~ N(0, I_d),  τ ~ Bernoulli(p)

:class:`JacobianRegularizer` holds ``γ`` (a constant or any optax schedule), ``p`` and ``M``; its
:meth:`~JacobianRegularizer.penalty` returns the term to add to a loss and a dict of scalar
metrics. The gate ``τ`` is drawn once per call (per training step) and, when ``τ = 0``, a
``lax.cond`` skips the Hutchinson estimator entirely (no VJP, and none in the backward pass).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from deqjax._src import checks, jacobian, tree, vma

PyTree = Any
Schedule = Callable[[jax.typing.ArrayLike], jax.typing.ArrayLike]
GammaLike = float | Schedule


@dataclasses.dataclass(frozen=True)
class JacobianRegularizer:
    """Bernoulli-gated Hutchinson penalty ``τ γ ‖J_f(z*)‖²_F / d`` (JR paper, App. A.4).

    A frozen, hashable value object: build it once outside ``jit`` and call :meth:`penalty`
    inside the loss function (it is pure and jit/grad-friendly; all state — the step, the key, an
    adaptive ``γ`` — is passed in).

    Args:
      gamma: the strength ``γ``: a constant ``>= 0`` or a schedule ``step -> γ`` (any optax
        schedule, e.g. ``optax.linear_schedule(1.6, 2.5, num_steps)`` for the JR paper's ramps).
      p: the probability that the penalty is applied at a step (``τ ~ Bernoulli(p)``), in
        ``[0, 1]``. ``p = 1`` and ``p = 0`` are resolved statically (no random draw, no cond).
      num_samples: ``M``, Hutchinson probe vectors per application (``>= 1``).
      differentiate_z_star: if ``False`` (default, as in the JR paper's reference code) the
        penalty is differentiated only through ``f``'s parameters with ``z*`` held fixed; if
        ``True`` its gradient also flows into ``z*`` (and through the DEQ's adjoint into the
        parameters that produced it).

    Raises:
      ValueError: for a negative or non-finite constant ``gamma``, a non-callable non-number
        ``gamma``, ``p`` outside ``[0, 1]`` or ``num_samples < 1``.

    Example:
      >>> reg = JacobianRegularizer(optax.cosine_decay_schedule(2.0, 1000), p=0.4)
      >>> def loss_fn(params, x, y, key, step):
      ...     z, sol = dq.fixed_point(cell, params, x, z0, solver=solver)
      ...     jr, metrics = reg.penalty(lambda z: cell(params, x, z), z, key, step)
      ...     return jnp.mean((z - y) ** 2) + jr, metrics
    """

    gamma: GammaLike = 1.0
    p: float = 1.0
    num_samples: int = 1
    differentiate_z_star: bool = False

    def __post_init__(self):
        if not callable(self.gamma):
            if not (np.isfinite(checks.check_real(self.gamma, "gamma")) and self.gamma >= 0):
                raise ValueError(f"gamma must be finite and >= 0, got {self.gamma}.")
        if not 0.0 <= checks.check_real(self.p, "p") <= 1.0:
            raise ValueError(f"p must be in [0, 1], got {self.p}.")
        checks.check_positive_int(self.num_samples, "num_samples")

    def gamma_at(self, step: jax.typing.ArrayLike | None = None) -> jax.typing.ArrayLike:
        """The scheduled ``γ`` at ``step`` (the constant if ``gamma`` is not a schedule).

        Raises:
          ValueError: if ``gamma`` is a schedule and ``step`` is ``None``.
        """
        if not callable(self.gamma):
            return self.gamma
        if step is None:
            raise ValueError("step is required when gamma is a schedule (callable step -> gamma).")
        return self.gamma(step)

    def penalty(
        self,
        f_z: Callable[[PyTree], PyTree],
        z_star: PyTree,
        key: jax.Array,
        step: jax.typing.ArrayLike | None = None,
        *,
        gamma: jax.typing.ArrayLike | None = None,
    ) -> tuple[jax.Array, dict[str, jax.Array]]:
        """The term ``τ γ frobenius_sq(f_z, z*)`` to add to the loss, and its metrics.

        Args:
          f_z: the cell at fixed parameters and input, ``z ↦ f(params, x, z)`` — a pure closure
            (inside ``hk.transform``, over the cell's params as ``lambda z: apply(p, x, z)``).
            The penalty's gradient reaches the parameters through this closure.
          z_star: the equilibrium, a pytree of float arrays, or of complex arrays (a whole
            batch: ``d`` is its total size, so the estimate is the batch mean of per-example
            ``‖J‖²_F / d``; for a complex state, the real Jacobian's ``‖J_R‖²_F / (2d)``, see
            :func:`~deqjax.jacobian.frobenius_sq`). Do not ``vmap`` the penalty over examples:
            the gate is one coin per step.
          key: a ``jax.random`` key, fresh every step; split here into the gate and the probes.
          step: the training step, passed to a ``gamma`` schedule (ignored for a constant).
          gamma: overrides the configured ``γ`` (e.g. ``AdaptiveGammaState.gamma`` from
            :class:`~deqjax.regularization.AdaptiveGamma`); may be traced.

        Returns:
          ``(term, metrics)``: ``term`` a scalar in the reduction dtype of ``z_star`` (exactly 0
          when ``τ = 0``); ``metrics`` a dict of gradient-free scalars:
          ``"jr/penalty"`` (the term), ``"jr/frobenius_sq"`` (the estimate, 0 when skipped),
          ``"jr/gamma"`` and ``"jr/applied"`` (``τ`` as 0.0/1.0). The mean estimate over applied
          steps is ``Σ frobenius_sq / Σ applied``.

        Raises:
          ValueError: if ``gamma`` is a schedule and neither ``step`` nor ``gamma=`` is given, or
            for invalid ``f_z``, ``z_star``, ``key`` (see :func:`~deqjax.jacobian.frobenius_sq`).
        """
        if not callable(f_z):
            raise ValueError(f"f_z must be callable, got {type(f_z).__name__}.")
        tree.check_state_tree(z_star, "z_star")
        if not isinstance(key, jax.Array):
            raise ValueError(f"key must be a jax.random key array, got {type(key).__name__}.")
        dtype = tree.reduction_dtype(z_star)
        g = self.gamma_at(step) if gamma is None else gamma
        g = jnp.asarray(g).astype(dtype)
        z = z_star if self.differentiate_z_star else jax.lax.stop_gradient(z_star)
        gate_key, probe_key = jax.random.split(key)

        def estimate():
            return jacobian.frobenius_sq(f_z, z, probe_key, num_samples=self.num_samples)

        if self.p == 1.0:
            applied = jnp.asarray(True)
            frob = estimate()
        elif self.p == 0.0:
            applied = jnp.asarray(False)
            frob = jnp.zeros((), dtype)
        else:
            applied = jax.random.bernoulli(gate_key, self.p)
            frob = vma.cond(applied, estimate, lambda: jnp.zeros((), dtype))
        term = g * frob
        stop = jax.lax.stop_gradient
        metrics = {
            "jr/penalty": stop(term),
            "jr/frobenius_sq": stop(frob),
            "jr/gamma": stop(g),
            "jr/applied": applied.astype(dtype),
        }
        return term, metrics
