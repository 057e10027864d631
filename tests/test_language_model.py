"""``experiments/language_model.py`` (issue 8): Transformer-XL memory of the shared backbone, and
smoke runs.

The memory tests call ``experiments/_seq_common.backbone`` in-process on tiny sizes (float64, the
suite's strict promotion). The smoke runs are subprocesses (``_run_experiment.run_smoke``); their
outputs are checked for the data-source label and finite metrics.
"""

from __future__ import annotations

import math
import sys

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _run_experiment import ROOT, run_smoke

sys.path.insert(0, str(ROOT / "experiments"))
import _seq_common as common  # noqa: E402

B, T, M, D, DEPTH = 2, 4, 3, 8, 3


def _model(kind: str, depth: int = DEPTH) -> hk.Transformed:
    def forward(x, mems):
        return common.backbone(
            x,
            mems,
            kind=kind,
            cell="transformer",
            d_model=D,
            num_heads=2,
            depth=depth,
            pre_ln=False,
            max_steps=6,
            tol=1e-4,
            is_training=False,
        )

    model = hk.without_apply_rng(hk.transform(forward))
    return hk.Transformed(jax.jit(model.init), jax.jit(model.apply))


def _normal(key: int, shape) -> jax.Array:
    return jax.random.normal(jax.random.PRNGKey(key), shape, jnp.float64)


@pytest.fixture(scope="module")
def tied():
    model = _model("tied")
    x = _normal(0, (B, T, D))
    mems = _normal(1, (DEPTH, B, M, D))
    params = model.init(jax.random.PRNGKey(2), x, mems)
    return model, params, x, mems


def test_explicit_per_layer_memory_holds_each_layers_input(tied):
    model, params, x, mems = tied
    z, aux = model.apply(params, x, mems)
    assert z.shape == (B, T, D)
    new = aux["new_mems"]
    assert new.shape == (DEPTH, B, T, D)  # one memory per layer: depth x the DEQ's
    np.testing.assert_array_equal(new[0], 0.0)  # layer 0's input is z^[0] = 0
    assert float(jnp.min(jnp.linalg.norm(new[1:], axis=-1))) > 0.1
    # The tied model shares its weights at every depth, so a 1- and 2-layer model with the same
    # parameters reproduce the first layers: new_mems[l] is the state entering layer l.
    z1, _ = _model("tied", depth=1).apply(params, x, mems[:1])
    np.testing.assert_allclose(new[1], z1, rtol=1e-12, atol=1e-12)
    z2, _ = _model("tied", depth=2).apply(params, x, mems[:2])
    np.testing.assert_allclose(new[2], z2, rtol=1e-12, atol=1e-12)
    # Without memory, no memory comes back.
    _, aux_none = model.apply(params, x, None)
    assert "new_mems" not in aux_none


def test_explicit_memory_is_used_per_layer(tied):
    model, params, x, mems = tied
    z_mem, _ = model.apply(params, x, mems)
    z_none, _ = model.apply(params, x, None)
    assert float(jnp.max(jnp.abs(z_mem - z_none))) > 1e-5
    # Layer l reads mems[l]: changing only the last layer's memory changes the output, and a
    # memory shared by all layers (the old last-layer simplification) is a different model.
    z_last, _ = model.apply(params, x, mems.at[DEPTH - 1].set(_normal(3, (B, M, D))))
    assert float(jnp.max(jnp.abs(z_last - z_mem))) > 1e-5
    z_shared, _ = model.apply(params, x, mems[-1])
    assert float(jnp.max(jnp.abs(z_shared - z_mem))) > 1e-5
    with pytest.raises(ValueError, match="depth=3"):
        model.apply(params, x, mems[:2])


@pytest.mark.parametrize("kind", ["untied", "deq"])
def test_memory_shapes_and_stop_gradient(kind):
    """Shapes per kind; gradients do not flow into the previous segment through the memory."""
    model = _model(kind)
    x1, x2 = _normal(4, (B, T, D)), _normal(5, (B, T, D))
    mem_shape = (B, M, D) if kind == "deq" else (DEPTH, B, M, D)
    mems = _normal(6, mem_shape)
    params = model.init(jax.random.PRNGKey(7), x1, mems)
    z, aux = model.apply(params, x1, mems)
    assert aux["new_mems"].shape == ((B, T, D) if kind == "deq" else (DEPTH, B, T, D))
    if kind == "deq":  # the DEQ's memory is its equilibrium
        np.testing.assert_array_equal(aux["new_mems"], z)

    def two_segments(x1, x2):
        _, aux1 = model.apply(params, x1, mems)
        z2, _ = model.apply(params, x2, aux1["new_mems"][..., -M:, :])
        return jnp.sum(jnp.sin(z2))

    g1, g2 = jax.grad(two_segments, argnums=(0, 1))(x1, x2)
    np.testing.assert_array_equal(g1, 0.0)  # stop-gradient through the carried memory
    assert float(jnp.max(jnp.abs(g2))) > 1e-5
    # ... while the memory does reach the output (a different previous segment changes z2).
    _, aux_b = model.apply(params, x2, mems)
    z_a, _ = model.apply(params, x2, aux["new_mems"][..., -M:, :])
    z_b, _ = model.apply(params, x2, aux_b["new_mems"][..., -M:, :])
    assert float(jnp.max(jnp.abs(z_a - z_b))) > 1e-5


@pytest.mark.slow  # ~20 s alone, ~60 s on a loaded 2-core machine
def test_language_model_smoke(tmp_path):
    summary = run_smoke("language_model.py", tmp_path, "--models", "deq,tied", "--jr_gamma", "0.1")
    assert summary["data_source"]  # printed and stored; offline this is the labelled stand-in
    assert summary["is_standin"] == summary["data_source"].startswith("STAND-IN: ")
    deq, tied = summary["results"]
    assert (deq["model"], tied["model"]) == ("deq", "tied")
    # The explicit model is unrolled to the DEQ's measured forward NFE.
    assert tied["depth_or_max_steps"] == max(1, round(deq["forward_nfe_train"]))
    assert deq["params"] == tied["params"]  # same weight-tied cell, same embeddings/head
    for r in (deq, tied):
        # A vocabulary of 300 pieces: an untrained model sits near ppl 300, never at 1 or inf.
        assert 20 < r["valid_ppl"] < 3000
        assert r["train_step_s_median"] > 0 and r["tokens_per_s"] > 0
        assert r["compiled_temp_bytes"] is None or r["compiled_temp_bytes"] > 0
        assert len(r["history"]["nll"]) == 3
    # The DEQ reports its forward residual (explicit models: NaN) and the JR estimate.
    assert 0 < deq["forward_rel_residual_eval"] < 1
    assert math.isnan(tied["forward_rel_residual_eval"])
    assert deq["jac_fro_sq_train_last"] > 0
    # Carried memory: one [B, M, D] equilibrium vs one state per explicit layer.
    depth = tied["depth_or_max_steps"]
    assert deq["carried_memory_shape"] == [4, 16, 16]  # smoke: B=4, M=T=16, D=16
    assert tied["carried_memory_shape"] == [depth, 4, 16, 16]
    assert tied["carried_memory_bytes"] == depth * deq["carried_memory_bytes"] == depth * 4096


@pytest.mark.slow
def test_language_model_smoke_untied_no_memory_pre_ln(tmp_path):
    summary = run_smoke(
        "language_model.py", tmp_path, "--models", "deq,untied", "--no-memory", "--pre_ln"
    )
    deq, untied = summary["results"]
    assert untied["params"] > deq["params"]
    assert all(math.isfinite(r["valid_ppl"]) for r in summary["results"])
    assert deq["carried_memory_bytes"] == untied["carried_memory_bytes"] == 0
