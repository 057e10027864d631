"""``precision=``: every product of the cell (forward solve, backward solve, final VJP, and in
``dq.nn.DEQ`` the per-forward phase and the cell map) carries the chosen matmul precision.

On a CPU float32 products are exact whatever the setting, so these tests read the precision
attribute of the cell's ``dot_general`` operations in the lowered program."""

from __future__ import annotations

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import deqjax as dq
from deqjax._src.models import deq_settings
from deqjax._src.precision import check_precision

D = 7  # the cell's products are the only 7x7 ones in the program


def _cell_dots(text: str) -> list[str]:
    """The ``dot_general`` lines of the lowered program that multiply by the 7x7 matrix."""
    return [
        line
        for line in text.splitlines()
        if "stablehlo.dot_general" in line and f"tensor<{D}x{D}xf32>" in line
    ]


def _problem():
    rng = np.random.default_rng(0)
    w = rng.normal(size=(D, D)).astype(np.float32)
    w *= 0.5 / np.linalg.norm(w, 2)
    return jnp.asarray(w), jnp.asarray(rng.normal(size=D).astype(np.float32))


def cell(w, x, z):
    return jnp.tanh(w @ z + x)


@pytest.mark.parametrize("adjoint", ["implicit", "unrolled"])
@pytest.mark.parametrize("precision", [None, "highest"])
def test_every_product_of_the_cell_has_the_precision(precision, adjoint):
    w, x = _problem()
    # GMRES's own products are full precision by design; restart=5 keeps them off 7x7 shapes.
    fallback = dq.solvers.GMRES(restart=5)
    adj = {"implicit": dq.ImplicitAdjoint(fallback=fallback), "unrolled": dq.UnrolledAdjoint()}
    adj = adj[adjoint]
    solver = dq.solvers.FixedPointIteration(max_steps=30)

    def loss(w):
        z0 = jnp.zeros(D, jnp.float32)
        z, _ = dq.fixed_point(cell, w, x, z0, solver=solver, adjoint=adj, precision=precision)
        return jnp.sum(z**2)

    with jax.default_matmul_precision("default"):  # the ambient setting precision= overrides
        text = jax.jit(jax.grad(loss)).lower(w).as_text()
    dots = _cell_dots(text)
    # forward loop, its residual bookkeeping, the backward loop and the final VJP
    assert len(dots) >= 3
    highest = [re.search(r"precision = \[HIGHEST, HIGHEST\]", line) is not None for line in dots]
    assert all(highest) if precision == "highest" else not any(highest)


def test_precision_does_not_change_cpu_results_and_keys_the_program():
    w, x = _problem()

    def solve(precision):
        return dq.fixed_point(cell, w, x, jnp.zeros(D, jnp.float32), precision=precision)[0]

    np.testing.assert_array_equal(solve(None), solve("highest"))  # float32 on CPU: exact


def test_deq_applies_the_precision_to_every_phase():
    hk = pytest.importorskip("haiku")

    def forward(x, precision):
        deq = dq.nn.DEQ(lambda z, x: jnp.tanh(hk.Linear(D, name="lin")(z) + x), precision=precision)
        return jnp.sum(deq(x)[0] ** 2)

    x = jnp.ones((3, D), jnp.float32)
    for precision in (None, "highest"):
        model = hk.transform(functools.partial(forward, precision=precision))
        params = model.init(jax.random.PRNGKey(0), x)
        with jax.default_matmul_precision("default"):
            text = jax.jit(jax.grad(model.apply)).lower(params, None, x).as_text()
        dots = _cell_dots(text)
        assert len(dots) >= 3
        highest = ["HIGHEST" in line for line in dots]
        assert all(highest) if precision else not any(highest)


@pytest.mark.parametrize("bad", ["fastest", 3, "HIGHEST!"])
def test_bad_precision_is_refused_by_name(bad):
    with pytest.raises(ValueError, match="precision"):
        check_precision(bad)
    w, x = _problem()
    with pytest.raises(ValueError, match="precision must be None or a matmul precision"):
        dq.fixed_point(cell, w, x, jnp.zeros(D, jnp.float32), precision=bad)
    hk = pytest.importorskip("haiku")
    model = hk.transform(lambda x: dq.nn.DEQ(lambda z, x: z + x, precision=bad)(x))
    with pytest.raises(ValueError, match="precision"):
        model.init(jax.random.PRNGKey(0), jnp.ones((2, D), jnp.float32))
    with pytest.raises(ValueError, match="precision"):
        deq_settings.DEQSettings(precision=bad)  # what the models hold
