"""The 200-parameter scalar DEQ of the JR paper §5.1 / Fig. 5 (Bai, Koltun & Kolter 2021,
"Stabilizing equilibrium models by Jacobian regularization"), and its synthetic 1-D data.

Model: ``f(z; x) = W₂ᵀ ReLU(W₁ z + U x + b)`` with ``W₁, W₂, U, b ∈ ℝ⁵⁰`` (200 parameters) and
prediction ``ŷ = z*``, a scalar fixed point per scalar input. Initialisation: ``W₁, U, b ~
U(±1/√2)``, ``W₂ ~ U(±1/√hidden)`` (PyTorch's default for a ``Linear(2, hidden)`` on ``(z, x)``
and a ``Linear(hidden, 1)``; the paper does not give one).

Data: ``y = 3/2 x³ + x² − 5x + 2 sin x − 3 + δ`` (the main text's ``−5x``; App. A.1 writes
``+5x``), ``δ ~ N(0, noise²)``, ``x ~ U[x_min, x_max]`` (the paper does not give the range).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from deqjax._src import checks, jacobian
from deqjax._src.normalise import as_solver
from deqjax._src.solvers.solution import CONVERGED, Solution

Params = dict[str, jax.Array]


def jr_synthetic_target(x: np.ndarray, linear_sign: int = -1) -> np.ndarray:
    """``h(x) = 3/2 x³ + x² ± 5x + 2 sin x − 3`` (JR paper §5.1 uses ``−5x``)."""
    return 1.5 * x**3 + x**2 + linear_sign * 5.0 * x + 2.0 * np.sin(x) - 3.0


def jr_synthetic_data(
    seed: int,
    n_train: int,
    n_val: int,
    *,
    noise: float = 0.05,
    x_min: float = -2.0,
    x_max: float = 2.0,
    linear_sign: int = -1,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(x_train, y_train, x_val, y_val)``, float32 ``[n]`` each, drawn from ``seed``."""
    rng = np.random.default_rng(seed)
    n = n_train + n_val
    x = rng.uniform(x_min, x_max, n)
    y = jr_synthetic_target(x, linear_sign) + noise * rng.normal(size=n)
    x, y = x.astype(np.float32), y.astype(np.float32)
    return x[:n_train], y[:n_train], x[n_train:], y[n_train:]


@dataclasses.dataclass(frozen=True)
class ScalarDEQ:
    """The JR paper's §5.1 scalar DEQ (module docstring) as pure functions of a params dict.

    Attributes:
      hidden: width of the ReLU layer (50 in the paper: 4 x 50 = 200 parameters).
    """

    hidden: int = 50

    def __post_init__(self):
        checks.check_positive_int(self.hidden, "hidden")

    def init(self, key: jax.Array) -> Params:
        """The ``4 * hidden`` float32 parameters ``W1, U, b, W2``."""
        k1, k2, k3, k4 = jax.random.split(key, 4)
        a, c = 1.0 / np.sqrt(2.0), 1.0 / np.sqrt(self.hidden)
        u = lambda k, r: jax.random.uniform(k, (self.hidden,), jnp.float32, -r, r)  # noqa: E731
        return {"W1": u(k1, a), "U": u(k2, a), "b": u(k3, a), "W2": u(k4, c)}

    @staticmethod
    def cell(params: Params, x: jax.Array, z: jax.Array) -> jax.Array:
        """``f(z; x) = W₂ᵀ ReLU(W₁ z + U x + b)`` for scalar ``x`` and ``z``."""
        h = jax.nn.relu(params["W1"] * z + params["U"] * x + params["b"])
        return jnp.dot(params["W2"], h)

    def batch_cell(self, params: Params, xs: jax.Array, zs: jax.Array) -> jax.Array:
        """:meth:`cell` over a batch ``[B]`` of inputs and states."""
        return jax.vmap(self.cell, in_axes=(None, 0, 0))(params, xs, zs)

    def slope(self, params: Params, xs: jax.Array, zs: jax.Array) -> jax.Array:
        """``∂f/∂z`` at each ``(x, z)``: ``[B]`` (the Jacobian of a scalar DEQ)."""
        return jax.vmap(jax.grad(self.cell, argnums=2), in_axes=(None, 0, 0))(params, xs, zs)

    def solve(self, params: Params, xs: jax.Array, solver: Any) -> Solution:
        """Per-example solves of ``z = f(z; x)`` from ``z = 0``, no gradient (a monitor).

        Batch-native (``solver`` with ``batch_ndim=1``): one loop for the batch, each example
        stopping on its own.

        Args:
          params: the model's parameters.
          xs: inputs ``[B]``.
          solver: a batch-native solver (e.g. ``dq.solvers.Anderson(max_steps=6, tol=1e-4)``).
        """
        batch_solver = as_solver(solver, name="solver").replace(batch_ndim=1)
        params = jax.lax.stop_gradient(params)
        f = lambda z: self.batch_cell(params, xs, z)  # noqa: E731
        return batch_solver(f, jnp.zeros(xs.shape, jnp.float32))


def jr_fig5_metrics(
    model: ScalarDEQ,
    params: Params,
    xs: jax.Array,
    ys: jax.Array,
    *,
    forward: Any,
    backward: Any,
    tight: Any,
    eval_fpi: Any,
    eval_broyden: Any,
) -> dict[str, jax.Array]:
    """The JR paper's Fig. 5 table for one run on ``(xs, ys)`` (jit-able, no gradient).

    Args:
      model, params: the model and its parameters.
      xs, ys: validation inputs and targets ``[B]``.
      forward: the training forward solver.
      backward: the implicit backward solver (for ``backward_rel_residual``).
      tight: a tight solver for the reference ``z*``.
      eval_fpi: fixed-point iteration whose NFE is reported (a solver object with ``max_steps``,
        e.g. ``dq.solvers.FixedPointIteration(max_steps=30, tol=1e-4)``).
      eval_broyden: Broyden whose NFE is reported.

    Returns:
      ``val_mse`` (with the training ``forward`` solver), ``val_mse_tight`` (solved by ``tight``),
      ``mean_abs_slope`` / ``max_abs_slope`` (``|∂f/∂z|`` at the tight ``z*``), ``nfe_fpi``
      (fixed-point iterations to ``eval_fpi.tol``, its ``max_steps`` where it does not converge),
      ``fpi_converged`` (fraction), ``nfe_broyden`` and ``backward_rel_residual`` (the implicit
      backward solve with ``backward`` for the MSE's cotangent, per example, mean).
    """
    eval_fpi = as_solver(eval_fpi, name="eval_fpi")
    backward = as_solver(backward, name="backward")
    s6, st = model.solve(params, xs, forward), model.solve(params, xs, tight)
    sf, sb = model.solve(params, xs, eval_fpi), model.solve(params, xs, eval_broyden)
    z, slope = st.value, jnp.abs(model.slope(params, xs, st.value))
    g = 2.0 * (z - ys) / ys.shape[0]  # ∂(MSE)/∂z*
    back = jax.vmap(
        lambda x, zz, gg: jacobian.backward_convergence(
            model.cell, params, x, zz, gg, solver=backward
        )
    )(xs, z, g)
    conv_f = sf.status == CONVERGED
    f32 = lambda a: a.astype(jnp.float32)  # noqa: E731
    return {
        "val_mse": jnp.mean((s6.value - ys) ** 2),
        "val_mse_tight": jnp.mean((z - ys) ** 2),
        "mean_abs_slope": jnp.mean(slope),
        "max_abs_slope": jnp.max(slope),
        "nfe_fpi": jnp.mean(f32(jnp.where(conv_f, sf.num_steps, eval_fpi.max_steps))),
        "fpi_converged": jnp.mean(f32(conv_f)),
        "nfe_broyden": jnp.mean(f32(sb.num_steps)),
        "backward_rel_residual": jnp.mean(back.rel_residual),
    }
