"""The reverse-mode-only layers (``ImplicitAdjoint()``, ``ShineAdjoint``) refuse every
forward-mode use, jitted or not, with a ``ValueError`` naming
``dq.ImplicitAdjoint(forward_mode=True)`` (``deqjax._src.adjoints.reverse_only``), never
returning the derivative of their solver loops; and the guards cost a gradient nothing."""

import collections
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import deqjax as dq
from deqjax._src.adjoints import reverse_only
from tests.helpers.dense_ift import contractive_problem, dense_reference, loss_of_z, tanh_cell

P, X = contractive_problem(seed=3, d=4)
XS = jnp.stack([X, -X, 0.5 * X])
SOLVER = dq.solvers.Anderson(tol=1e-12, max_steps=100)
NAMES_FORWARD_MODE = r"dq\.ImplicitAdjoint\(forward_mode=True\)"
DEFAULT = dq.ImplicitAdjoint()


def batch_cell(p, x, z):
    """:func:`tanh_cell` on a batch: z, x [B, D]."""
    return jnp.tanh(z @ p["W"].T + jnp.broadcast_to(p["b"], z.shape) + x)


def loss_of(adjoint=DEFAULT, solver=SOLVER, jitted=True):
    """``ℓ(z*(p, x))`` for the tanh layer, and a ``jax.jit`` of it (the loss a user jits)."""

    def loss(p, x=X, probe=None):
        cell = tanh_cell if x.ndim == 1 else batch_cell
        z0 = jnp.zeros_like(x)
        z, _ = dq.fixed_point(cell, p, x, z0, solver=solver, adjoint=adjoint, backward_stats=probe)
        return loss_of_z(z) if z.ndim == 1 else jnp.sum(jnp.sin(z) + 0.5 * z**2)

    return jax.jit(loss) if jitted else loss


def _sum(t):
    return sum(jnp.sum(leaf).astype(jnp.float64) for leaf in jax.tree_util.tree_leaves(t))


TRANSFORMS = {
    "hessian": lambda loss: jax.hessian(lambda p: loss(p))(P),
    "jvp_of_grad": lambda loss: jax.jvp(jax.grad(loss), (P,), (P,)),
    "jit_of_jvp_of_grad": lambda loss: jax.jit(lambda p: jax.jvp(jax.grad(loss), (p,), (p,)))(P),
    "grad_of_grad": lambda loss: jax.grad(lambda p: _sum(jax.grad(loss)(p)))(P),
    "jvp": lambda loss: jax.jvp(loss, (P,), (P,)),
    "jacfwd": lambda loss: jax.jacfwd(loss)(P),
    "linearize": lambda loss: jax.linearize(loss, P)[1](P),
    "vmap_of_jvp": lambda loss: jax.vmap(lambda t: jax.jvp(loss, (P,), (t,)))(
        jax.tree_util.tree_map(lambda a: jnp.stack([a, a]), P)
    ),
}


@pytest.mark.parametrize("jitted", [True, False], ids=["jitted_loss", "plain_loss"])
@pytest.mark.parametrize("transform", sorted(TRANSFORMS))
def test_every_forward_mode_use_of_the_default_adjoint_names_forward_mode_true(transform, jitted):
    expected = (ValueError, NAMES_FORWARD_MODE)
    if jitted and transform in JAX_REFUSES_FIRST:
        expected = (TypeError, "can't apply forward-mode autodiff")
    with pytest.raises(expected[0], match=expected[1]):
        jax.block_until_ready(TRANSFORMS[transform](loss_of(jitted=jitted)))


# A jax.vmap of a jvp of a loss jitted before the jvp: JAX batches the jvp'd program eqn by eqn,
# and its own rule for the custom_vjp's tangent (custom_lin) refuses at batching, while the guard
# on the layer's inputs must batch as the identity (jax.grad of a jax.vmap of the layer batches
# it too) and refuses only where the tangent is evaluated or lowered, later. Still an error,
# never the loops' derivative; only its message is JAX's.
JAX_REFUSES_FIRST = ("jacfwd", "vmap_of_jvp")


def _batch_native(p):
    solver = dq.solvers.Anderson(tol=1e-12, max_steps=100, batch_ndim=1)
    return loss_of(solver=solver, jitted=False)(p, XS)


def _per_example(p):
    return jnp.sum(jax.vmap(lambda x: loss_of(jitted=False)(p, x))(XS))


def _probe_and_params(p):
    return jax.grad(loss_of(jitted=False), argnums=(0, 2))(p, X, dq.BackwardStats.zeros())


def _probe_only(p):
    probe = dq.BackwardStats.zeros()
    return jax.grad(lambda q: loss_of(jitted=False)(p, X, q))(probe)


SOLVES = {
    "batch_native": _batch_native,
    "per_example_vmap": _per_example,
    "shine": lambda p: loss_of(dq.ShineAdjoint(), dq.solvers.Broyden(), jitted=False)(p),
}


@pytest.mark.parametrize("solve", sorted(SOLVES))
def test_hessian_and_jvp_of_grad_are_refused_for_every_solve_of_a_jitted_loss(solve):
    loss = jax.jit(SOLVES[solve])
    with pytest.raises(ValueError, match=NAMES_FORWARD_MODE):
        jax.hessian(lambda p: loss(p))(P)
    with pytest.raises(ValueError, match=NAMES_FORWARD_MODE):
        jax.jvp(jax.grad(loss), (P,), (P,))


@pytest.mark.parametrize("statistics", [_probe_and_params, _probe_only], ids=lambda f: f.__name__)
def test_forward_mode_through_the_backward_stats_channel_is_refused(statistics):
    """The backward's statistics (the probe's cotangent) are not differentiable either."""
    with pytest.raises(ValueError, match=NAMES_FORWARD_MODE):
        jax.jvp(jax.jit(lambda p: _sum(statistics(p))), (P,), (P,))


def test_reverse_mode_is_unchanged_under_jit_vmap_batches_and_the_probe():
    want_p = dense_reference(P, X)[0]
    loss = loss_of()
    for got in (jax.grad(loss)(P), jax.jit(jax.grad(loss))(P)):
        np.testing.assert_allclose(got["W"], want_p["W"], rtol=1e-8, atol=1e-10)
    g_per = jax.jit(jax.grad(_per_example))(P)
    g_native = jax.jit(jax.grad(_batch_native))(P)
    np.testing.assert_allclose(g_native["W"], g_per["W"], rtol=1e-8, atol=1e-10)
    (g_p, stats) = jax.jit(_probe_and_params)(P)
    np.testing.assert_allclose(g_p["W"], want_p["W"], rtol=1e-8, atol=1e-10)
    assert float(stats.count) == 1.0 and float(stats.failures) == 0.0


def _op_counts(fn, *args) -> collections.Counter:
    """The instructions of ``fn``'s compiled program by kind (parameters included)."""
    text = jax.jit(fn).lower(*args).compile().as_text()
    return collections.Counter(re.findall(r"= \S+ ([a-z][\w-]*)\(", text))


def test_the_guards_add_nothing_to_a_compiled_gradient(monkeypatch):
    """The gradient program, probe included, with and without the guards: the same
    instructions. (The check itself is checked: a guard that computed would be seen.)"""

    def grad_program():
        loss = loss_of(jitted=False)
        return _op_counts(jax.grad(loss, argnums=(0, 2)), P, X, dq.BackwardStats.zeros())

    guarded = grad_program()
    monkeypatch.setattr(reverse_only, "refuse_jvp", lambda adjoint, args: args)
    monkeypatch.setattr(reverse_only, "refuse_derivatives", lambda adjoint, args: args)
    assert grad_program() == guarded
    monkeypatch.setattr(
        reverse_only,
        "refuse_derivatives",
        lambda adjoint, args: jax.tree_util.tree_map(
            lambda a: jnp.sin(a) if isinstance(a, jax.Array) and a.dtype == jnp.float64 else a,
            args,
        ),
    )
    assert grad_program() != guarded
