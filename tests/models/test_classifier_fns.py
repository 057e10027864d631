"""dq.models.classifier_fns: the loss (with the Jacobian regulariser), per-example evaluation and
the DEQ diagnostics of a classifier, as pure functions."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import deqjax as dq


@pytest.mark.slow  # four compiled functions of a DEQ classifier
def test_loss_evaluation_and_diagnostics():
    images = jax.random.normal(jax.random.PRNGKey(0), (4, 6))
    labels = jnp.array([0, 1, 2, 0])
    make = functools.partial(
        dq.models.MLPClassifier, 6, 3, solver=dq.solvers.Anderson(max_steps=30, tol=1e-5)
    )
    reg = dq.regularization.JacobianRegularizer(0.5, p=1.0)
    fns = dq.models.classifier_fns(
        make, regularizer=reg, backward_solver=dq.solvers.Anderson(max_steps=30, tol=1e-6)
    )
    params = fns.init(jax.random.PRNGKey(1), images)
    loss, metrics = jax.jit(fns.loss)(params, images, labels, jax.random.PRNGKey(2), 0.5, 0)
    assert float(loss) == pytest.approx(
        float(metrics["cross_entropy"]) + 0.5 * float(metrics["jr/frobenius_sq"]), rel=1e-5
    )
    assert {"accuracy", "nfe", "rel_residual", "jr/applied"} <= set(metrics)
    per_example = jax.jit(fns.evaluate)(params, images, labels)
    assert all(v.shape == (4,) for v in per_example.values())
    assert set(np.unique(np.asarray(per_example["accuracy"]))) <= {0.0, 1.0}
    diag = jax.jit(fns.diagnostics)(params, images, labels, jax.random.PRNGKey(3))
    assert float(diag["bwd_rel_residual"]) < 1e-3
    assert np.isfinite(float(diag["spectral_radius"])) and float(diag["spectral_radius"]) > 0
    np.testing.assert_allclose(
        diag["jac_frobenius"] ** 2, diag["jac_frobenius_sq_per_dim"] * 6, rtol=1e-5
    )
