"""``precision=``: the cell's products carry it in every evaluation (forward solve, backward solve,
final VJP, and in ``dq.nn.DEQ`` both phases and the cell map); the solvers' own products are full
precision whatever it is; it is normalised once.

On a CPU float32 products are exact whatever the setting, so these tests read the precision
attribute of the ``dot_general`` operations in the lowered program. They run at the precision a
user has (JAX's default, ``None``), not at the suite's pin (``tests/conftest.py``), except where
they set one themselves.
"""

from __future__ import annotations

import functools
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import deqjax as dq
from deqjax._src import compiled
from deqjax._src import precision as precision_lib
from deqjax._src.models import deq_settings
from deqjax._src.precision import check_precision

D = 7  # the cell's products are the only 7x7 ones in the program

pytestmark = pytest.mark.usefixtures("users_default_precision")


def _dots(text: str, shape: str | None = None) -> tuple[int, int]:
    """``(HIGHEST, other)`` counts of the program's ``dot_general`` lines (those on ``shape``)."""
    lines = [line for line in text.splitlines() if "stablehlo.dot_general" in line]
    if shape is not None:
        lines = [line for line in lines if shape in line]
    highest = sum("precision = [HIGHEST, HIGHEST]" in line for line in lines)
    return highest, len(lines) - highest


def _cell_dots(text: str) -> tuple[int, int]:
    return _dots(text, f"tensor<{D}x{D}xf32>")


def _problem():
    rng = np.random.default_rng(0)
    w = rng.normal(size=(D, D)).astype(np.float32)
    w *= 0.5 / np.linalg.norm(w, 2)
    return jnp.asarray(w), jnp.asarray(rng.normal(size=D).astype(np.float32))


def cell(w, x, z):
    return jnp.tanh(w @ z + x)


ADJOINTS = {
    # GMRES's own products are full precision by design; restart=5 keeps them off 7x7 shapes.
    "implicit": dq.ImplicitAdjoint(fallback=dq.solvers.GMRES(restart=5)),
    "unrolled": dq.UnrolledAdjoint(),
}
# The full-precision checks of the solves in a gradient program that reads the statistics: the
# forward solve's (one evaluation of the cell), and for the implicit adjoint the backward's (the
# cell at z* and its VJP at full precision).
CHECKS = {"implicit": 3, "unrolled": 1}


def _grad_text(precision, adjoint, ambient):
    w, x = _problem()
    solver = dq.solvers.FixedPointIteration(max_steps=30)

    def loss(w):
        z0 = jnp.zeros(D, jnp.float32)
        z, sol = dq.fixed_point(
            cell, w, x, z0, solver=solver, adjoint=ADJOINTS[adjoint], precision=precision
        )
        return jnp.sum(z**2), sol.status  # the statistics are read: their checks stay

    with jax.default_matmul_precision(ambient):
        return jax.jit(jax.grad(loss, has_aux=True)).lower(w).as_text()


@pytest.mark.parametrize("adjoint", ["implicit", "unrolled"])
def test_every_product_of_the_cell_has_the_precision(adjoint):
    # precision= overrides the ambient setting, in both directions.
    full, none = _cell_dots(_grad_text("highest", adjoint, "default"))
    assert full >= 3 and none == 0  # forward loop, bookkeeping, backward loop, final VJP
    assert _cell_dots(_grad_text("highest", adjoint, "highest")) == (full, 0)
    for precision, ambient in [("default", "highest"), (None, "default")]:
        highest, reduced = _cell_dots(_grad_text(precision, adjoint, ambient))
        # Every product of the loops at the reduced precision, and the checks at full precision
        # on top of them.
        assert reduced == full and highest == CHECKS[adjoint]
    # At full precision nothing is checked: the same program as precision="highest".
    assert _cell_dots(_grad_text(None, adjoint, "highest")) == (full, 0)


SOLVERS = {
    "FixedPointIteration": dq.solvers.FixedPointIteration(batch_ndim=1),
    "Anderson": dq.solvers.Anderson(batch_ndim=1),
    "Anderson (one problem)": dq.solvers.Anderson(),
    "Broyden": dq.solvers.Broyden(batch_ndim=1),
    "Broyden (one problem)": dq.solvers.Broyden(),
    "Reversible": dq.solvers.Reversible(batch_ndim=1),
}
BACKWARD = {
    "GMRES": dq.solvers.GMRES(),
    "BiCGStab": dq.solvers.BiCGStab(),
    "NormalCG": dq.solvers.NormalCG(),
}


@pytest.mark.parametrize("solver", list(SOLVERS) + [f"backward {n}" for n in BACKWARD])
def test_the_solvers_own_products_are_full_precision(solver):
    """Anderson's Gram and mixing products, Broyden's low-rank products, the Krylov solvers'
    inner products: HIGHEST at the user's default precision, where precision= governs the cell
    alone. The cell here has no product of its own: every dot_general is the solvers'."""

    def elementwise(p, x, z):
        return jnp.tanh(p * z + x)

    if solver.startswith("backward"):
        forward = dq.solvers.FixedPointIteration(batch_ndim=1)
        adjoint = dq.ImplicitAdjoint(solver=BACKWARD[solver.split()[1]].replace(batch_ndim=1))
    else:
        forward, adjoint = SOLVERS[solver], dq.ImplicitAdjoint()
    x = jnp.ones((4, 6), jnp.float32)

    def loss(p):
        z, sol = dq.fixed_point(
            elementwise, p, x, jnp.zeros_like(x), solver=forward, adjoint=adjoint
        )
        return jnp.sum(z**2), sol.status

    text = jax.jit(jax.grad(loss, has_aux=True)).lower(jnp.full((4, 6), 0.5, jnp.float32)).as_text()
    highest, other = _dots(text)
    # Anderson and Broyden multiply their histories; the GMRES fallback its basis.
    assert highest > 0 and other == 0


def test_precision_does_not_change_cpu_results_and_keys_the_program():
    w, x = _problem()
    compiled.clear()  # the counts below are this test's programs

    def solve(precision):
        return dq.fixed_point(cell, w, x, jnp.zeros(D, jnp.float32), precision=precision)

    (z_none, sol_none), (z_full, sol_full) = solve(None), solve("highest")
    np.testing.assert_array_equal(z_none, z_full)  # float32 on CPU: exact
    assert int(sol_none.status) == int(sol_full.status) == dq.solvers.CONVERGED
    # The check at full precision (precision=None here) confirms the loop's residual.
    np.testing.assert_allclose(sol_none.rel_residual, sol_full.rel_residual, rtol=1e-6)
    assert compiled.size() == 2  # one program per precision
    solve(None), solve("highest")
    assert compiled.size() == 2  # and each reused


def test_deq_applies_the_precision_to_every_phase():
    hk = pytest.importorskip("haiku")

    def forward(x, precision):
        deq = dq.nn.DEQ(lambda z, x: jnp.tanh(hk.Linear(D, name="lin")(z) + x), precision=precision)
        z, sol = deq(x)
        return jnp.sum(z**2), sol.status

    x = jnp.ones((3, D), jnp.float32)
    counts = {}
    for precision in (None, "highest"):
        model = hk.transform(functools.partial(forward, precision=precision))
        params = model.init(jax.random.PRNGKey(0), x)
        with jax.default_matmul_precision("default"):
            grad = jax.grad(functools.partial(model.apply, rng=None, x=x), has_aux=True)
            counts[precision] = _cell_dots(jax.jit(grad).lower(params).as_text())
    full, none = counts["highest"]
    assert full >= 3 and none == 0
    # At the default precision: every product of the DEQ at it, the checks of the forward and
    # backward solves at full precision on top.
    assert counts[None] == (CHECKS["implicit"], full)


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


def _count_checks(monkeypatch) -> list:
    """Records every call of ``check_precision``, through any module's binding of it."""
    calls = []
    real = precision_lib.check_precision

    def counting(precision, *args, **kwargs):
        calls.append(precision)
        return real(precision, *args, **kwargs)

    for name, module in list(sys.modules.items()):
        if name.startswith("deqjax") and getattr(module, "check_precision", None) is real:
            monkeypatch.setattr(module, "check_precision", counting)
    return calls


def test_precision_is_checked_once_where_the_user_passes_it(monkeypatch):
    """``DEQSettings`` checks its ``precision`` once, when built; the DEQ it builds in every
    trace takes the checked value through the internal entry (``CheckedDEQ``) and hands
    ``fixed_point`` none: no second check (once per trace of the DEQ before)."""
    hk = pytest.importorskip("haiku")
    calls = _count_checks(monkeypatch)
    settings = deq_settings.DEQSettings(precision="highest")
    assert settings.precision == "highest"

    def forward(x):
        cell = lambda z, x: jnp.tanh(hk.Linear(D)(z) + x)  # noqa: E731
        out, _ = settings.solve(cell, x, is_training=True, step=None)
        return out.z_star, out.solution.status

    x = jnp.ones((2, D), jnp.float32)
    model = hk.transform(forward)
    params = model.init(jax.random.PRNGKey(0), x)
    jax.jit(model.apply).lower(params, None, x)  # the DEQ and its fixed_point traced
    assert [p for p in calls if p is not None] == ["highest"]
    # The DEQ's products at the checked precision: no check is needed at "highest".
    with jax.default_matmul_precision("default"):
        text = jax.jit(model.apply).lower(params, None, x).as_text()
    assert _cell_dots(text)[1] == 0

    # A dq.nn.DEQ built by the user checks its value (once per construction, i.e. per trace).
    calls.clear()
    direct = hk.transform(lambda x: dq.nn.DEQ(lambda z, x: z + x, precision="highest")(x))
    direct.init(jax.random.PRNGKey(0), x)
    assert [p for p in calls if p is not None] == ["highest"]
