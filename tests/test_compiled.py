"""Eager calls run one cached compiled program: a repeated call compiles nothing and keeps
nothing (deqjax._src.compiled).

Compilations are counted with JAX's backend-compile event (and loads from a persistent
compilation cache, which the fixture also turns off); memory kept by compiled code is counted as
lines of /proc/self/maps (each executable maps its code).
"""

import contextlib
import functools
import sys
import warnings
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import deqjax as dq
from deqjax._src import compiled
from deqjax._src import fixed_point as fixed_point_lib
from tests.adjoints.strategies import every_strategy, solver_for

D = 8
MAPS_SLACK = 4  # the allocator may map a page or two; compiled code maps tens per program

_compiles = [0]


def _on_duration(event: str, *args, **kwargs) -> None:
    if event == "/jax/core/compile/backend_compile_duration":
        _compiles[0] += 1


def _on_event(event: str, *args, **kwargs) -> None:
    if event == "/jax/compilation_cache/cache_hits":  # an executable loaded instead of compiled
        _compiles[0] += 1


jax.monitoring.register_event_duration_secs_listener(_on_duration)
jax.monitoring.register_event_listener(_on_event)


@pytest.fixture(autouse=True)
def no_persistent_cache():
    """Every program really compiles here (a persistent cache would load it: maps too)."""
    before = jax.config.jax_enable_compilation_cache
    jax.config.update("jax_enable_compilation_cache", False)
    yield
    jax.config.update("jax_enable_compilation_cache", before)


def maps() -> int:
    with open("/proc/self/maps") as f:
        return sum(1 for _ in f)


def cost(call, n=4, warmup=2):
    """(compiles, new maps) over ``n`` calls of ``call`` after ``warmup`` calls."""
    for _ in range(warmup):
        jax.block_until_ready(call())
    c0, m0 = _compiles[0], maps()
    for _ in range(n):
        jax.block_until_ready(call())
    return _compiles[0] - c0, maps() - m0


def assert_free(call, n=4):
    compiles, new_maps = cost(call, n)
    assert compiles == 0, f"{compiles} compilations in {n} repeated eager calls"
    assert new_maps <= MAPS_SLACK, f"{new_maps} new memory mappings in {n} repeated eager calls"


def cell(p, x, z):
    """One example (z: [D]) or a batch (z: [B, D])."""
    return jnp.tanh(z @ p["W"].T + x + jnp.broadcast_to(p["b"], z.shape))


def params(scale=0.5, seed=0):
    rng = np.random.default_rng(seed)
    w = rng.normal(size=(D, D))
    w = jnp.asarray(w * scale / np.linalg.norm(w, 2))
    return {"W": w, "b": jnp.asarray(rng.normal(size=D))}


P, X, Z0 = params(), jnp.linspace(-1.0, 1.0, D), jnp.zeros(D)


def loss_of(adjoint=None, solver=dq.solvers.anderson, f=cell, x=X, z0=Z0):
    def loss(p):
        z, _ = dq.fixed_point(f, p, x, z0, solver=solver, adjoint=adjoint)
        return jnp.sum(z**2)

    return loss


def grad_of(*args, **kwargs):
    loss = loss_of(*args, **kwargs)
    return lambda: jax.grad(loss)(P)


def test_forward_compiles_once():
    assert_free(lambda: dq.fixed_point(cell, P, X, Z0)[0])


@pytest.mark.parametrize("strategy", every_strategy(), ids=lambda s: s.__name__)
def test_gradient_compiles_once_for_every_adjoint(strategy):
    adjoint = strategy()
    solver = solver_for(
        adjoint,
        [
            dq.solvers.anderson,
            dq.solvers.FixedPointIteration(max_steps=20),
            dq.solvers.Broyden(),
            dq.solvers.Reversible(),
        ],
    )
    call = grad_of(adjoint, solver)
    assert_free(call)
    # and it is the gradient of the solve inlined in a user's jit (the path that runs as before)
    reference = jax.jit(lambda p: jax.grad(lambda q: loss_of(adjoint, solver)(q))(p))(P)
    assert jax.tree_util.tree_all(
        jax.tree_util.tree_map(lambda a, b: np.allclose(a, b, rtol=1e-6), call(), reference)
    )


def test_settings_written_inside_the_loss_hit_the_cache():
    def loss(p):
        z, _ = dq.fixed_point(
            cell, p, X, Z0, solver=dq.solvers.Broyden(max_steps=20), adjoint=dq.ImplicitAdjoint()
        )
        return jnp.sum(z**2)

    assert_free(lambda: jax.grad(loss)(P))


def test_batch_native_solver_and_has_aux():
    xb, zb = jnp.stack([X, -X, 0.5 * X]), jnp.zeros((3, D))
    native = dq.solvers.Anderson(batch_ndim=1)
    assert_free(grad_of(solver=native, x=xb, z0=zb))

    def with_aux(p, x, z):
        new = cell(p, x, z)
        return new, {"norm": jnp.sum(new**2)}

    def loss(p):
        (z, aux), _ = dq.fixed_point(with_aux, p, X, Z0, has_aux=True)
        return jnp.sum(z) + aux["norm"]

    assert_free(lambda: jax.grad(loss)(P))


def test_backward_stats_probe():
    def loss(p, probe):
        z, _ = dq.fixed_point(cell, p, X, Z0, backward_stats=probe)
        return jnp.sum(z**2)

    probe = dq.BackwardStats.zeros()
    assert_free(lambda: jax.grad(loss, argnums=(0, 1))(P, probe))


def test_solver_objects_functions_and_partials():
    f = functools.partial(cell, P, X)
    assert_free(lambda: dq.solvers.anderson(f, Z0).value)
    assert_free(lambda: dq.solvers.Anderson(m=3)(f, Z0).value)
    assert_free(lambda: functools.partial(dq.solvers.broyden, max_steps=10)(f, Z0).value)
    assert_free(lambda: dq.solvers.FixedPointIteration()(lambda z: cell(P, X, z), Z0).value)
    partial_solver = functools.partial(dq.solvers.anderson, m=3)
    assert_free(lambda: dq.fixed_point(cell, P, X, Z0, solver=partial_solver)[0])


def test_fresh_lambda_over_new_arrays_reuses_the_program():
    """A loss written with an inline lambda closing over arrays: the lambda is new on every call,
    the arrays have new values; the program is the same (the arrays are its operands)."""
    step = [0]

    def call():
        step[0] += 1
        w, b = P["W"] * (1.0 + 0.01 * step[0]), P["b"]

        def loss(x):
            z, _ = dq.fixed_point(lambda p, xx, z: jnp.tanh(z @ w.T + xx + p), b, x, Z0)
            return jnp.sum(z**2)

        return jax.grad(loss)(X)

    assert_free(call)
    w = P["W"] * 1.05  # the values of the closed-over array are read, not baked in
    got = dq.fixed_point(lambda p, xx, z: jnp.tanh(z @ w.T + xx + p), P["b"], X, Z0)[0]
    want = dq.fixed_point(cell, {"W": w, "b": P["b"]}, X, Z0)[0]
    np.testing.assert_allclose(got, want, rtol=1e-12)


class _Scale:
    """A plain object: a closure over it is keyed by its contents (a new value: a new program)."""

    def __init__(self, value):
        self.value = value


def test_fresh_function_each_call_compiles_at_most_once_and_keeps_little(monkeypatch):
    monkeypatch.setattr(compiled, "MAX_ENTRIES", 2)

    def call(i):
        scale = _Scale(0.5 + 0.01 * i)
        z, _ = dq.fixed_point(lambda p, x, z: jnp.tanh(scale.value * (z @ p["W"].T) + x), P, X, Z0)
        return z

    jax.block_until_ready(call(0))
    c0 = _compiles[0]
    counts = []
    for i in range(1, 9):
        jax.block_until_ready(call(i))
        counts.append(maps())
    assert _compiles[0] - c0 <= 8  # at most one compilation per call
    assert counts[-1] - counts[3] <= MAPS_SLACK  # evicted programs are freed


@contextlib.contextmanager
def lookups():
    """The cache keys looked up while the block runs (every call that runs a cached program
    looks its key up; an un-jitted or inline run none): independent of what other tests left in
    the process-wide cache."""
    keys = []
    real = compiled._entry
    with mock.patch.object(compiled, "_entry", lambda *a: keys.append(a[0]) or real(*a)):
        yield keys


def test_under_transformations_runs_inline():
    """Under jit, vmap, scan and eval_shape the result is the un-jitted solve's; the cache is not
    used inside a trace that stages out."""
    f = jax.jit(lambda p: dq.fixed_point(cell, p, X, Z0)[0])
    want = dq.fixed_point(cell, P, X, Z0)[0]
    with lookups() as keys:
        np.testing.assert_allclose(f(P), want, rtol=1e-12)
    assert keys == []
    xs = jnp.stack([X, -X])
    batched = jax.vmap(lambda x: dq.fixed_point(cell, P, x, Z0)[0])(xs)
    np.testing.assert_allclose(batched[1], dq.fixed_point(cell, P, -X, Z0)[0], rtol=1e-10)
    _, scanned = jax.lax.scan(lambda c, x: (c, dq.fixed_point(cell, P, x, Z0)[0]), 0.0, xs)
    np.testing.assert_allclose(scanned, batched, rtol=1e-10)


def _record_staged(seen, name):
    def f(x):
        seen[name] = compiled.staged()
        return x

    return f


def test_staged_tells_staging_traces_from_eager_transformations():
    """``staged`` (public JAX API only) is True under every trace that stages out and False under
    evaluation and eager ``grad``/``jvp``/``vmap``/``linearize``."""
    seen = {}
    rec = functools.partial(_record_staged, seen)
    x = jnp.ones(3)
    rec("eval")(x)
    jax.grad(lambda y: rec("grad")(y).sum())(x)
    jax.jvp(rec("jvp"), (x,), (x,))
    jax.vmap(rec("vmap"))(x)
    jax.linearize(rec("linearize"), x)
    jax.vmap(jax.grad(lambda y: rec("vmap_of_grad")(y).sum()))(x[None])
    jax.hessian(lambda y: rec("hessian")(y).sum())(x)
    eager_names = set(seen)
    jax.jit(rec("jit"))(x)
    jax.lax.scan(lambda c, _: (rec("scan")(c), None), x, None, length=1)
    jax.eval_shape(rec("eval_shape"), x)
    jax.checkpoint(rec("checkpoint"))(x)
    jax.pmap(rec("pmap"))(x[None])
    jax.lax.cond(True, rec("cond"), lambda y: y, x)
    jax.jit(jax.grad(lambda y: rec("grad_in_jit")(y).sum()))(x)
    jax.lax.scan(
        lambda c, _: (jax.grad(lambda y: rec("grad_in_scan")(y).sum())(c), None), x, None, length=1
    )
    assert {name for name, staged in seen.items() if not staged} == eager_names
    assert len(seen) == len(eager_names) + 8


def test_staged_call_with_concrete_inputs_runs_the_program_inline():
    """Under ``jit`` with no traced input (numpy constants) the cached program is called: JAX
    inlines it into the caller's program, and the value is the eager one."""
    w = np.asarray(P["W"])

    def solve():
        return dq.solvers.anderson(
            lambda z: np.float64(0.5) * jnp.tanh(w @ z) + 1.0, np.zeros(D)
        ).value

    want = solve()
    got = jax.jit(solve)()
    np.testing.assert_allclose(got, want, rtol=1e-12)


def _python_warm_start(f, z0):
    """A user's solver with Python control flow on values (it cannot be traced): plain
    iterations to a loose tolerance, then Anderson."""
    z = z0
    while float(jnp.max(jnp.abs(f(z) - z))) > 1e-2:
        z = f(z)
    return dq.solvers.anderson(f, z)


def test_untraceable_user_solver_under_eager_grad_runs_unjitted():
    """A backward solve with the user's solver runs after the call returned, where a failure to
    trace could not fall back: under an eager ``grad`` the solve runs un-jitted."""
    with lookups() as keys:
        g = jax.grad(loss_of(solver=_python_warm_start))(P)
    # no program of dq.fixed_point's (the Anderson the user's solver calls runs its own)
    assert not [k for k in keys if k[0] is fixed_point_lib._run_compiled]
    assert keys  # the inner Anderson calls are looked up: the test sees lookups
    want = jax.grad(loss_of())(P)
    np.testing.assert_allclose(g["W"], want["W"], rtol=1e-3, atol=1e-6)
    # eagerly, without a transformation, its program fails to trace and it runs un-jitted too
    z = dq.fixed_point(cell, P, X, Z0, solver=_python_warm_start)[0]
    np.testing.assert_allclose(z, dq.fixed_point(cell, P, X, Z0)[0], rtol=1e-3)


def test_closure_over_traced_array_still_raises():
    def loss(w):
        z, _ = dq.fixed_point(lambda p, x, z: jnp.tanh(z @ w.T + x + p), P["b"], X, Z0)
        return jnp.sum(z)

    with pytest.raises(ValueError, match="closes over traced array"):
        jax.grad(loss)(P["W"])


class _Unhashable:
    __hash__ = None

    def __init__(self, w):
        self.w = w

    def __call__(self, p, x, z):
        return jnp.tanh(z @ self.w.T + x + p)


class _Holder:
    """A plain object holding an array: it may be changed between calls, so it is not keyed."""

    def __init__(self, w):
        self.w = w


@pytest.mark.parametrize("kind", ["unhashable", "object_with_arrays"])
def test_unkeyable_function_runs_unjitted(kind):
    if kind == "unhashable":
        f = _Unhashable(P["W"])
    else:
        holder = _Holder(P["W"])

        def f(p, x, z):
            return jnp.tanh(z @ holder.w.T + x + p)

    with lookups() as keys:
        got = dq.fixed_point(f, P["b"], X, Z0)[0]
    assert keys == []  # run un-jitted: no program made or reused
    np.testing.assert_allclose(got, dq.fixed_point(cell, P, X, Z0)[0], rtol=1e-12)


def test_500_eager_gradients_stay_flat():
    call = grad_of()
    for _ in range(3):
        jax.block_until_ready(call())
    c0, m0 = _compiles[0], maps()
    for i in range(500):
        jax.block_until_ready(call())
        if i + 1 in (10, 50, 100, 250, 500):
            assert _compiles[0] == c0, f"compiled after {i + 1} repeated eager gradients"
            assert maps() - m0 <= MAPS_SLACK, f"{maps() - m0} new maps after {i + 1} gradients"


@pytest.mark.slow  # ~20 s of Haiku tracing on 2 CPU cores
def test_eager_apply_of_a_deq_compiles_once():
    """An eager ``apply`` of the same transformed model builds new modules and closures on every
    call; the solve's program is the same."""
    import haiku as hk

    def forward(x, is_training):
        cell = dq.nn.MLPCell(D, dropout_rate=0.1 if is_training else 0.0)
        return dq.nn.DEQ(cell)(x, is_training=is_training)[0]

    model = hk.transform(forward)
    xb = jnp.stack([X, -X])
    p = model.init(jax.random.PRNGKey(0), xb, True)
    key = jax.random.PRNGKey(1)
    assert_free(lambda: model.apply(p, None, xb, False))

    def loss(p, key):
        return jnp.sum(model.apply(p, key, xb, True) ** 2)

    keys = iter(jax.random.split(key, 10))
    assert_free(lambda: jax.grad(loss)(p, next(keys)))
    want = jax.jit(jax.grad(loss))(p, key)
    got = jax.grad(loss)(p, key)
    assert jax.tree_util.tree_all(
        jax.tree_util.tree_map(lambda a, b: np.allclose(a, b, rtol=1e-8), got, want)
    )


def test_python_loop_runs_unjitted_forward_and_backward():
    """``loop="python"`` asks for concrete values (prints, breakpoints): no compiled program."""
    concrete = []

    def f(p, x, z):
        concrete.append(not isinstance(z, jax.core.Tracer))
        return cell(p, x, z)

    python_loop = dq.solvers.FixedPointIteration(loop="python", max_steps=40)

    def loss(p):
        return jnp.sum(dq.fixed_point(f, p, X, Z0, solver=python_loop)[0] ** 2)

    with lookups() as keys:
        g = jax.grad(loss)(P)
    assert sum(concrete) > 3 and keys == []
    want = jax.grad(loss_of(solver=dq.solvers.FixedPointIteration(max_steps=40)))(P)
    np.testing.assert_allclose(g["W"], want["W"], rtol=1e-6)


def test_unkeyable_value_warns_once_naming_it():
    """A value that cannot be keyed by contents: the call runs un-jitted (fresh, never stale)
    and one warning names the value."""
    holder = _Holder(P["W"])

    def f(p, x, z):
        return jnp.tanh(z @ holder.w.T + x + p)

    compiled.clear()
    with pytest.warns(UserWarning, match=r"f -> holder\.w` .*holding arrays") as record:
        got = dq.fixed_point(f, P["b"], X, Z0)[0]
    assert len(record) == 1
    np.testing.assert_allclose(got, dq.fixed_point(cell, P, X, Z0)[0], rtol=1e-12)
    holder.w = 0.5 * P["W"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # warned once
        got = dq.fixed_point(f, P["b"], X, Z0)[0]
    want = dq.fixed_point(cell, {"W": 0.5 * P["W"], "b": P["b"]}, X, Z0)[0]
    np.testing.assert_allclose(got, want, rtol=1e-12)


_STEPS = 1


def _capped_iteration(f, z0):
    """A user's solver reading a global of its module."""
    return dq.solvers.FixedPointIteration(max_steps=_STEPS)(f, z0)


def test_users_solver_is_keyed_by_what_it_reads(monkeypatch):
    def solve():
        return float(dq.fixed_point(cell, P, X, Z0, solver=_capped_iteration)[0][0])

    compiled.clear()
    one_step = solve()
    monkeypatch.setattr(sys.modules[__name__], "_STEPS", 30)
    got = solve()
    compiled.clear()
    assert got == solve() != one_step  # a fresh computation
