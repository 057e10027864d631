"""The main job's model section: the classifier's functions, on batches."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from deqjax import harness
from experiments.parts.mlp_classifier_config import MLPClassifierConfig, batch_fns


@pytest.mark.slow  # compiles the classifier's loss (seconds alone, a minute on a loaded machine)
def test_functions_on_batches_train_and_evaluate():
    model = MLPClassifierConfig(width=8, diag_power_steps=2)
    solver = harness.SolverConfig(max_steps=4, bwd_max_steps=4)
    fns = model.fns(solver, harness.JRConfig(gamma=0.5))
    on_batches = batch_fns(fns, 0.5)
    batch = {"image": np.ones((4, 6), np.float32), "label": np.arange(4, dtype=np.int32) % 2}
    with jax.numpy_dtype_promotion("standard"):
        params = fns.init(jax.random.PRNGKey(0), jnp.asarray(batch["image"][:1]))
        loss, metrics = on_batches.loss(params, batch, jax.random.PRNGKey(1), (), 0)
        per_example = on_batches.evaluate(params, batch)
    assert np.isfinite(float(loss)) and "jr/penalty" in metrics
    assert per_example["accuracy"].shape == (4,)


def test_declared_curves_and_resume_settings():
    model = MLPClassifierConfig()
    assert "loss" in model.CURVES and model.SAFE_ON_RESUME == ("diag_power_steps",)
    assert "diag_power_steps" in harness.flat_dict(model)
