"""The main job's model section: the classifier's functions, on batches, and the init sweep."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from deqjax import harness


@pytest.mark.slow  # compiles the classifier's loss (seconds alone, a minute on a loaded machine)
def test_functions_on_batches_train_and_evaluate():
    model = harness.MLPClassifierConfig(width=8, diag_power_steps=2)
    solver = harness.SolverConfig(max_steps=4, bwd_max_steps=4)
    fns = model.fns(solver, harness.JRConfig(gamma=0.5))
    on_batches = harness.batch_fns(fns, 0.5)
    batch = {"image": np.ones((4, 6), np.float32), "label": np.arange(4, dtype=np.int32) % 2}
    with jax.numpy_dtype_promotion("standard"):
        params = fns.init(jax.random.PRNGKey(0), jnp.asarray(batch["image"][:1]))
        loss, metrics = on_batches.loss(params, batch, jax.random.PRNGKey(1), (), 0)
        per_example = on_batches.evaluate(params, batch)
    assert np.isfinite(float(loss)) and "jr/penalty" in metrics
    assert per_example["accuracy"].shape == (4,)


def test_declared_curves_and_resume_settings():
    model = harness.MLPClassifierConfig()
    assert "loss" in model.CURVES and model.SAFE_ON_RESUME == ("diag_power_steps",)
    assert "diag_power_steps" in harness.flat_dict(model)


def test_init_sweep_runs():
    sweep = harness.InitSweepConfig(sweep_families=("goe",), sweep_scales=(0.5, 1.0))
    assert sweep.runs() == [{"family": "goe", "scale": 0.5, "seed": s} for s in (0, 1, 2)] + [
        {"family": "goe", "scale": 1.0, "seed": s} for s in (0, 1, 2)
    ]
