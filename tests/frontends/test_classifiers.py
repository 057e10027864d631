"""deqjax.nnx.classifier_fns and deqjax.equinox.classifier_fns: given the Haiku classifier's
weights, the same loss (with the Jacobian regulariser), metrics, per-example evaluation and DEQ
diagnostics as dq.models.classifier_fns, with the same signatures (a training loop takes any of
the three); and the Gaussian / orthogonal / GOE initializers as each framework's initializers."""

import functools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import deqjax as dq
from tests.helpers import frontends as ref

P, WIDTH, CLASSES = 6, 5, 3
SOLVER = dq.solvers.Anderson(max_steps=30, tol=1e-5)
REG = dq.regularization.JacobianRegularizer(0.5, p=1.0)
BACKWARD = dq.solvers.Anderson(max_steps=30, tol=1e-6)
IMAGES = jax.random.normal(jax.random.PRNGKey(0), (4, 2, 3), jnp.float32)
LABELS = jnp.array([0, 1, 2, 0])
KEY = jax.random.PRNGKey(2)


def _fns(module, make):
    return module.classifier_fns(make, regularizer=REG, backward_solver=BACKWARD)


@functools.cache
def haiku():
    """The Haiku classifier's functions, its parameters as the front-ends' nested dicts."""
    make = functools.partial(dq.models.MLPClassifier, WIDTH, CLASSES, solver=SOLVER)
    fns = _fns(dq.models, make)
    params = fns.init(jax.random.PRNGKey(1), IMAGES)
    cell = ref.nested({k: v for k, v in params.items() if "mlp_cell" in k})
    head = dict(params["mlp_classifier/head"])
    return fns, params, cell, head


def nnx_fns_and_params():
    make = lambda p, rngs: dq.nnx.MLPClassifier(p, WIDTH, CLASSES, solver=SOLVER, rngs=rngs)  # noqa: E731
    _, _, cell, head = haiku()
    model = make(P, nnx.Rngs(0))
    nnx.update(model, {"deq": {"cell": {"params": cell}}, "head": head})
    return _fns(dq.nnx, make), nnx.state(model)


def equinox_fns_and_params():
    make = lambda p, key: dq.equinox.MLPClassifier(p, WIDTH, CLASSES, solver=SOLVER, key=key)  # noqa: E731
    _, _, cell, head = haiku()
    fns = _fns(dq.equinox, make)
    params = fns.init(jax.random.PRNGKey(0), IMAGES)
    params = eqx.tree_at(lambda m: (m.deq.cell.params, m.head), params, (cell, head))
    return fns, params


FRAMEWORKS = {"nnx": nnx_fns_and_params, "equinox": equinox_fns_and_params}


def assert_dicts_close(got, want, rtol=1e-5, atol=1e-6):
    assert set(got) == set(want)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=rtol, atol=atol, err_msg=name)


@pytest.mark.parametrize("framework", sorted(FRAMEWORKS))
def test_loss_and_evaluation_equal_haikus(framework):
    fns, params = FRAMEWORKS[framework]()
    h_fns, h_params, _, _ = haiku()
    loss, metrics = jax.jit(fns.loss)(params, IMAGES, LABELS, KEY, 0.5, 0)
    h_loss, h_metrics = jax.jit(h_fns.loss)(h_params, IMAGES, LABELS, KEY, 0.5, 0)
    np.testing.assert_allclose(loss, h_loss, rtol=1e-5)
    assert float(metrics["jr/frobenius_sq"]) > 0
    assert_dicts_close(metrics, h_metrics)
    got = jax.jit(fns.evaluate)(params, IMAGES, LABELS)
    assert_dicts_close(got, jax.jit(h_fns.evaluate)(h_params, IMAGES, LABELS))


@pytest.mark.slow  # the DEQ diagnostics compiled for three frameworks
@pytest.mark.parametrize("framework", sorted(FRAMEWORKS))
def test_diagnostics_equal_haikus(framework):
    fns, params = FRAMEWORKS[framework]()
    h_fns, h_params, _, _ = haiku()
    got = jax.jit(fns.diagnostics)(params, IMAGES, LABELS, KEY)
    want = jax.jit(h_fns.diagnostics)(h_params, IMAGES, LABELS, KEY)
    assert float(want["bwd_rel_residual"]) < 1e-3
    assert_dicts_close(got, want, rtol=1e-4)


FAMILIES = {"gaussian": dq.initializers.Gaussian, "orthogonal": dq.initializers.HaarOrthogonal}
FAMILIES["goe"] = dq.initializers.GOE


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_random_matrix_initializers_draw_each_frameworks_weights(family):
    init = FAMILIES[family](0.8)
    linear = nnx.Linear(6, 6, kernel_init=init, param_dtype=jnp.float64, rngs=nnx.Rngs(3))
    key = nnx.Rngs(3).params()  # the key nnx.Linear drew its kernel with
    np.testing.assert_array_equal(linear.kernel[...], init(key, (6, 6), jnp.float64))
    nnx_cell = dq.nnx.MLPCell(4, 6, form="single", w_init=init, rngs=nnx.Rngs(0))
    eqx_cell = dq.equinox.MLPCell(4, 6, form="single", w_init=init, key=jax.random.key(0))
    for w in (nnx_cell.params["W"][...], eqx_cell.params["W"]):
        assert w.shape == (6, 6) and w.dtype == jnp.float32
        if family == "orthogonal":  # 0.8 times an orthogonal matrix
            np.testing.assert_allclose(w @ w.T, 0.64 * np.eye(6), atol=1e-5)
        if family == "goe":  # symmetric
            np.testing.assert_allclose(w, w.T, atol=0)
