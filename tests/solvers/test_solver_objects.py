"""Solvers as data (``dq.solvers.Anderson`` & co.), ``dq.solvers.summarize``, declared capabilities,
and the forward solve running once per call."""

import dataclasses
import functools
import inspect
import json

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import deqjax as dq
from deqjax._src.solvers import base

OBJECTS = {
    dq.solvers.FixedPointIteration: dq.solvers.fixed_point_iteration,
    dq.solvers.Anderson: dq.solvers.anderson,
    dq.solvers.Broyden: dq.solvers.broyden,
    dq.solvers.Reversible: dq.solvers.reversible,
    dq.solvers.GMRES: dq.solvers.gmres,
    dq.solvers.BiCGStab: dq.solvers.bicgstab,
    dq.solvers.NormalCG: dq.solvers.normal_cg,
}


def _affine(d=5, seed=0):
    a = 0.5 * jax.random.normal(jax.random.PRNGKey(seed), (d, d)) / np.sqrt(d)
    b = jnp.arange(d, dtype=jnp.float64) / d
    return lambda z: a @ z + b, jnp.zeros(d)


@pytest.mark.parametrize("cls", list(OBJECTS), ids=lambda c: c.__name__)
def test_fields_are_the_function_keywords_and_a_call_is_the_function_call(cls):
    fn = OBJECTS[cls]
    keywords = {
        p.name: p.default
        for p in inspect.signature(fn).parameters.values()
        if p.kind is inspect.Parameter.KEYWORD_ONLY
    }
    assert cls().to_dict(with_name=False) == keywords
    f, z0 = _affine()
    got = cls(max_steps=30, tol=1e-9)(f, z0)
    want = fn(f, z0, max_steps=30, tol=1e-9)
    np.testing.assert_array_equal(got.value, want.value)
    np.testing.assert_array_equal(got.num_steps, want.num_steps)


def test_objects_are_frozen_hashable_printable_and_round_trip_through_json():
    s = dq.solvers.Anderson(m=3, tol=1e-6, max_steps=20)
    assert s == dq.solvers.Anderson(m=3, tol=1e-6, max_steps=20) != dq.solvers.Anderson(m=4)
    assert hash(s) == hash(dq.solvers.Anderson(m=3, tol=1e-6, max_steps=20))
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.m = 4
    assert repr(s).startswith("Anderson(max_steps=20, tol=1e-06") and "m=3" in repr(s)
    d = json.loads(json.dumps(s.to_dict()))
    assert d["solver"] == "Anderson" and d["m"] == 3
    assert dq.solvers.from_dict(d) == s
    assert dq.solvers.from_dict(dq.training.to_python(s)) == s  # a run's config.json entry
    sampled = dq.solvers.Anderson(max_steps=8, sample_steps=(2, 4))
    back = dq.solvers.from_dict(json.loads(json.dumps(sampled.to_dict())))  # tuple -> list -> tuple
    assert back == sampled and hash(back) == hash(sampled)
    assert s.replace(tol=1e-3).tol == 1e-3 and s.tol == 1e-6
    with pytest.raises(ValueError, match="config"):
        dq.solvers.from_dict({"solver": "Newton"})


def test_jit_keys_on_the_object_by_value():
    traces = []

    @functools.partial(jax.jit, static_argnums=0)
    def run(solver, z0):
        traces.append(solver)
        return solver(jnp.cos, z0).value

    run(dq.solvers.Anderson(tol=1e-6), jnp.array(1.0))
    z = run(dq.solvers.Anderson(tol=1e-6), jnp.array(1.0))  # an equal object: no retrace
    assert len(traces) == 1
    np.testing.assert_allclose(z, 0.7390851332, rtol=1e-5)
    run(dq.solvers.Anderson(tol=1e-8), jnp.array(1.0))
    assert len(traces) == 2


@pytest.mark.parametrize(
    "cls, field, value",
    [
        (dq.solvers.Anderson, "m", 0),
        (dq.solvers.Anderson, "tol", -1.0),
        (dq.solvers.Broyden, "memory", True),
        (dq.solvers.FixedPointIteration, "damping", 2.0),
        (dq.solvers.FixedPointIteration, "loop", "for"),
        (dq.solvers.Anderson, "batch_ndim", -1),
        (dq.solvers.GMRES, "restart", 0),
    ],
)
def test_bad_fields_fail_at_construction_naming_the_field(cls, field, value):
    with pytest.raises(ValueError, match=field):
        cls(**{field: value})


def test_call_overrides_and_their_errors():
    f, z0 = _affine()
    s = dq.solvers.Anderson(tol=1e-9)
    batched = s(lambda z: z @ jnp.eye(5) * 0.5 + 1.0, jnp.zeros((3, 5)), batch_ndim=1)
    assert batched.status.shape == (3,)
    assert s(f, z0, loop="scan").value.shape == (5,)
    with pytest.raises(ValueError, match="unknown keyword"):
        s(f, z0, restart=3)
    with pytest.raises(ValueError, match="unknown keyword"):
        dq.solvers.GMRES()(f, z0, loop="scan")


def test_capabilities_are_declared_and_inspection_is_the_fallback():
    anderson, gmres = dq.solvers.Anderson(), dq.solvers.GMRES()
    assert anderson.loop_kinds == ("while", "scan", "python") and anderson.batch_native
    assert gmres.loop_kinds == () and gmres.batch_native
    assert base.accepts_loop_kind(anderson) and not base.accepts_loop_kind(gmres)
    assert base.accepts_loop_kind(functools.partial(anderson, tol=1e-3))
    assert base.accepts_batch_ndim(functools.partial(gmres, tol=1e-3))

    def mine(f, z0):  # a user's solver: inspected, declares nothing
        return dq.solvers.anderson(f, z0)

    assert not base.accepts_loop_kind(mine) and not base.accepts_batch_ndim(mine)
    assert base.accepts_loop_kind(dq.solvers.broyden)


def test_describe_reads_objects_functions_and_partials():
    assert dq.solvers.describe(dq.solvers.Broyden(memory=4))["memory"] == 4
    d = dq.solvers.describe(functools.partial(dq.solvers.anderson, tol=1e-3))
    assert d["solver"] == "anderson" and d["tol"] == 1e-3 and d["m"] == 5
    d = dq.solvers.describe(functools.partial(dq.solvers.Anderson(m=2), batch_ndim=1))
    assert d["solver"] == "Anderson" and d["m"] == 2 and d["batch_ndim"] == 1
    assert dq.solvers.describe(lambda f, z0: None) == {"solver": "<lambda>"}


def test_an_object_shows_its_settings_to_signature_inspection():
    """inspect.signature of an object (or a partial of one) is its function's, with the object's
    values as defaults: code that inspects solvers sees what the object runs with."""
    sig = inspect.signature(functools.partial(dq.solvers.Broyden(memory=3), tol=1e-3))
    assert sig.parameters["memory"].default == 3 and sig.parameters["tol"].default == 1e-3
    assert "return_inverse" in sig.parameters  # ShineAdjoint's check passes through the partial


@pytest.mark.parametrize(
    "obj, fn, adjoint",
    [
        (dq.solvers.Reversible(max_steps=30, tol=1e-8), dq.solvers.reversible, "ReversibleAdjoint"),
        (dq.solvers.Broyden(max_steps=30, tol=1e-8), dq.solvers.broyden, "ShineAdjoint"),
    ],
    ids=["reversible", "shine"],
)
def test_objects_drive_the_adjoints_that_need_their_solver(obj, fn, adjoint):
    w, x, z0 = _problem()
    adj = getattr(dq, adjoint)()

    def grad(solver):
        loss = lambda p: jnp.sum(dq.fixed_point(_cell, p, x, z0, solver=solver, adjoint=adj)[0])  # noqa: E731
        return jax.grad(loss)(w)

    want = grad(functools.partial(fn, max_steps=30, tol=1e-8))
    np.testing.assert_allclose(grad(obj), want, rtol=1e-12, atol=1e-14)


def test_implicit_fallback_reads_the_tolerance_of_a_solver_object():
    config = dq.ImplicitAdjoint().backward_config(dq.solvers.Anderson(tol=1e-7, max_steps=20))
    assert config.fallback.keywords["tol"] == 1e-7
    assert config.fallback.keywords["max_steps"] == 40


def _cell(p, x, z):
    return jnp.tanh(p @ z + x)


def _problem(d=4):
    w = 0.4 * jax.random.normal(jax.random.PRNGKey(1), (d, d)) / np.sqrt(d)
    return w, jnp.linspace(-1.0, 1.0, d), jnp.zeros(d)


@pytest.mark.parametrize("adjoint", [dq.ImplicitAdjoint(), dq.UnrolledAdjoint()], ids=repr)
def test_an_object_solver_gives_the_gradient_of_the_partial(adjoint):
    w, x, z0 = _problem()

    def grad(solver):
        def loss(p):
            return jnp.sum(dq.fixed_point(_cell, p, x, z0, solver=solver, adjoint=adjoint)[0])

        return jax.grad(loss)(w)

    obj = grad(dq.solvers.Anderson(tol=1e-10, max_steps=60))
    part = grad(functools.partial(dq.solvers.anderson, tol=1e-10, max_steps=60))
    np.testing.assert_allclose(obj, part, rtol=1e-10, atol=1e-12)


def test_unrolled_adjoint_refuses_a_solver_object_without_a_scan_loop():
    w, x, z0 = _problem()
    with pytest.raises(ValueError, match="loop='scan'"):
        dq.fixed_point(_cell, w, x, z0, solver=dq.solvers.GMRES(), adjoint=dq.UnrolledAdjoint())


@pytest.mark.parametrize("adjoint", [dq.PhantomAdjoint(steps=3), dq.OneStepAdjoint()], ids=repr)
def test_forward_solve_runs_once_under_grad(adjoint):
    """No tangent enters the solver loop: f runs num_steps times in the solve plus the strategy's
    own differentiated applications (a loop carrying tangents made grad fail with an effect)."""
    w, x, z0 = _problem()
    calls = []

    def cell(p, x_, z):
        jax.debug.callback(lambda _: calls.append(1), z[0])
        return _cell(p, x_, z)

    def loss(p):
        z, sol = dq.fixed_point(
            cell, p, x, z0, solver=dq.solvers.Anderson(tol=1e-10), adjoint=adjoint
        )
        return jnp.sum(z), sol.num_steps

    g, steps = jax.jit(jax.grad(loss, has_aux=True))(w)
    jax.effects_barrier()
    extra = adjoint.steps if isinstance(adjoint, dq.PhantomAdjoint) else 1
    assert len(calls) == int(steps) + extra
    assert np.all(np.isfinite(g))


def test_deq_with_a_solver_object_is_batch_native():
    def forward(x):
        deq = dq.nn.DEQ(dq.nn.MLPCell(), solver=dq.solvers.Anderson(tol=1e-8, max_steps=40))
        return deq(x)

    t = hk.transform(forward)
    x = jax.random.normal(jax.random.PRNGKey(0), (3, 6))
    params = t.init(jax.random.PRNGKey(1), x)
    z, sol = t.apply(params, None, x)
    assert z.shape == (3, 6) and sol.status.shape == (3,) and sol.trace.shape == (3, 40)
    assert np.all(np.asarray(sol.status) == dq.solvers.CONVERGED)


def test_summarize_is_jit_safe_and_counts_statuses():
    sol = dq.solvers.Solution(
        value=jnp.zeros((4, 2)),
        num_steps=jnp.array([3, 5, 7, 9], jnp.int32),
        abs_residual=jnp.array([1e-6, 2e-6, 1.0, jnp.inf]),
        rel_residual=jnp.array([1e-7, 1e-7, 0.5, jnp.nan]),
        trace=jnp.zeros((4, 9)),
        status=jnp.array([0, 0, 2, 3], jnp.int32),
    )
    m = jax.jit(functools.partial(dq.solvers.summarize, prefix="fwd/"))(sol)
    assert float(m["fwd/nfe"]) == 6.0 and float(m["fwd/nfe_max"]) == 9.0
    assert float(m["fwd/converged"]) == 0.5 and float(m["fwd/diverged"]) == 0.25
    assert float(m["fwd/nonfinite"]) == 0.25 and float(m["fwd/max_steps"]) == 0.0
    assert all(v.dtype == jnp.float32 and v.shape == () for v in m.values())
    single = dq.solvers.summarize(dq.solvers.anderson(jnp.cos, jnp.array(1.0), tol=1e-8))
    assert float(single["converged"]) == 1.0 and float(single["nfe"]) >= 2
