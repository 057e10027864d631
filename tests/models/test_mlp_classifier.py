"""dq.models.MLPClassifier (the init paper's §4.1 classifier) and its recurrent initialisation."""

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import deqjax as dq


def test_recurrent_init_families():
    assert dq.models.INIT_FAMILIES == ("gaussian", "orthogonal", "goe")
    draw = hk.transform(lambda: dq.models.recurrent_init("orthogonal", 0.5)((6, 6), jnp.float64))
    w = draw.apply({}, jax.random.PRNGKey(0))
    np.testing.assert_allclose(w @ w.T, 0.25 * np.eye(6), atol=1e-12)
    assert isinstance(dq.models.recurrent_init("goe", 1.0), dq.initializers.GOE)
    with pytest.raises(ValueError, match="init family"):
        dq.models.recurrent_init("uniform", 1.0)


def _classifier(per_example):
    def forward(images):
        model = dq.models.MLPClassifier(
            6, 3, solver=dq.solvers.Anderson(max_steps=100, tol=1e-6), per_example=per_example
        )
        logits, out = model(images)
        return logits, out.z_star, out.solution, out.f_star, out.cell_fn(out.z_star)

    return hk.without_apply_rng(hk.transform(forward))


def test_logits_and_per_example_or_whole_batch_statistics():
    images = jax.random.normal(jax.random.PRNGKey(0), (4, 2, 3))  # flattened to [B, 6]
    per_example, whole = _classifier(True), _classifier(False)
    params = per_example.init(jax.random.PRNGKey(1), images)
    cell = {k for k in params if k.startswith("mlp_classifier/deq/lifted/mlp_classifier/mlp_cell")}
    assert cell and set(params) == cell | {"mlp_classifier/head"}
    logits, z_star, sol, f_star, f_of_z_star = jax.jit(per_example.apply)(params, images)
    logits_whole, _, sol_whole, _, _ = jax.jit(whole.apply)(params, images)
    assert logits.shape == (4, 3) and logits.dtype == jnp.float32
    assert z_star.shape == (4, 6) and sol.num_steps.shape == (4,)
    assert sol_whole.num_steps.shape == ()
    np.testing.assert_allclose(logits, logits_whole, atol=1e-4)
    np.testing.assert_allclose(f_star, f_of_z_star, atol=1e-5)


def test_bad_arguments_raise():
    images = jnp.zeros((2, 6))
    for kw, match in ((dict(width=0), "width"), (dict(cell_form="deep"), "cell_form")):
        t = hk.transform(lambda x, kw=kw: dq.models.MLPClassifier(**kw)(x))
        with pytest.raises(ValueError, match=match):
            t.init(jax.random.PRNGKey(0), images)
