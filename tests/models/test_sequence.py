"""``dq.models.SequenceBackbone`` (DEQ, weight-tied and untied, with memory), and smoke runs of
``experiments/language_model.py`` and ``experiments/repro_lm_init.py``.

The backbone tests run in-process on tiny sizes (float64, the suite's strict promotion). The smoke
runs are subprocesses (``tests.helpers.run_experiment.run_smoke``).
"""

from __future__ import annotations

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import deqjax as dq

B, T, M, D, DEPTH = 2, 4, 3, 8, 3


def _model(kind: str, depth: int = DEPTH, cell: str = "transformer") -> hk.Transformed:
    def forward(x, mems):
        return dq.models.SequenceBackbone(
            kind,
            cell,
            d_model=D,
            num_heads=2,
            depth=depth,
            deq=dq.models.DEQSettings(dq.solvers.Anderson(max_steps=6, tol=1e-4, m=5)),
        )(x, mems, is_training=False)

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
    _, aux_none = model.apply(params, x, None)  # without memory, no memory comes back
    assert "new_mems" not in aux_none


def test_explicit_memory_is_used_per_layer(tied):
    model, params, x, mems = tied
    z_mem, _ = model.apply(params, x, mems)
    z_none, _ = model.apply(params, x, None)
    assert float(jnp.max(jnp.abs(z_mem - z_none))) > 1e-5
    # Layer l reads mems[l]: changing only the last layer's memory changes the output, and a
    # memory shared by all layers is a different model.
    z_last, _ = model.apply(params, x, mems.at[DEPTH - 1].set(_normal(3, (B, M, D))))
    assert float(jnp.max(jnp.abs(z_last - z_mem))) > 1e-5
    z_shared, _ = model.apply(params, x, mems[-1])
    assert float(jnp.max(jnp.abs(z_shared - z_mem))) > 1e-5
    with pytest.raises(ValueError, match="depth=3"):
        model.apply(params, x, mems[:2])


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["untied", "deq"])
def test_memory_shapes_and_stop_gradient(kind):
    """Shapes per kind; gradients do not flow into the previous segment through the memory."""
    model = _model(kind)
    x1, x2 = _normal(4, (B, T, D)), _normal(5, (B, T, D))
    shape = dq.models.initial_memory(
        kind, batch_size=B, memory_length=M, d_model=D, depth=DEPTH
    ).shape
    assert shape == ((B, M, D) if kind == "deq" else (DEPTH, B, M, D))
    mems = _normal(6, shape)
    params = model.init(jax.random.PRNGKey(7), x1, mems)
    z, aux = model.apply(params, x1, mems)
    assert aux["new_mems"].shape == ((B, T, D) if kind == "deq" else (DEPTH, B, T, D))
    if kind == "deq":  # the DEQ's memory is its equilibrium
        np.testing.assert_array_equal(aux["new_mems"], z)

    def two_segments(x1, x2):
        _, aux1 = model.apply(params, x1, mems)
        z2, _ = model.apply(params, x2, dq.models.next_memory(aux1["new_mems"], M))
        return jnp.sum(jnp.sin(z2))

    g1, g2 = jax.grad(two_segments, argnums=(0, 1))(x1, x2)
    np.testing.assert_array_equal(g1, 0.0)  # stop-gradient through the carried memory
    assert float(jnp.max(jnp.abs(g2))) > 1e-5
    # ... while the memory does reach the output (a different previous segment changes z2).
    _, aux_b = model.apply(params, x2, mems)
    z_a, _ = model.apply(params, x2, dq.models.next_memory(aux["new_mems"], M))
    z_b, _ = model.apply(params, x2, dq.models.next_memory(aux_b["new_mems"], M))
    assert float(jnp.max(jnp.abs(z_a - z_b))) > 1e-5


def test_backbone_bad_arguments():
    bad = hk.transform(lambda x: dq.models.SequenceBackbone("deep", d_model=D)(x, is_training=True))
    with pytest.raises(ValueError, match="kind"):
        bad.init(jax.random.PRNGKey(0), _normal(0, (B, T, D)))
    with pytest.raises(ValueError, match="mems of the DEQ"):
        _model("deq").init(jax.random.PRNGKey(0), _normal(0, (B, T, D)), _normal(1, (1, B, M, D)))


@pytest.mark.parametrize("kind", ["deq", "untied"])
def test_ffn_init_and_width_reach_the_cell(kind):
    """``ffn_init``/``d_ff`` (init paper §4.3): the FFN weights are drawn from the ensemble
    (GOE: symmetric, semicircle edge 2σ) at width ``d_ff``; attention keeps the paper init."""
    sigma = 2.0

    def forward(x):
        return dq.models.SequenceBackbone(
            kind,
            d_model=D,
            num_heads=2,
            depth=2,
            d_ff=D,
            ffn_init=dq.initializers.GOE(sigma),
            deq=dq.models.DEQSettings(dq.solvers.Anderson(max_steps=4, tol=1e-4)),
        )(x, is_training=False)

    params = hk.transform(forward).init(jax.random.PRNGKey(0), _normal(0, (B, T, D)))
    ffn = [p["v"] for m, p in params.items() if m.split("/")[-1] in ("w_ff1", "w_ff2")]
    assert len(ffn) == (2 if kind == "deq" else 4)  # v of w_ff1, w_ff2 per cell (weight norm)
    for w in ffn:
        assert w.shape == (D, D)
        np.testing.assert_allclose(w, w.T)  # GOE
        assert 0.5 * sigma < float(jnp.max(jnp.abs(jnp.linalg.eigvalsh(w)))) < 4 * sigma
    w_q = [p["v"] for m, p in params.items() if m.endswith("/w_q")][0]
    assert float(jnp.std(w_q)) < 0.05  # N(0, 0.01), the JR paper's, untouched

    trellis = hk.transform(
        lambda x: dq.models.SequenceBackbone("deq", "trellis", d_model=D, d_ff=D)(
            x, is_training=True
        )
    )
    with pytest.raises(ValueError, match="transformer-cell options"):
        trellis.init(jax.random.PRNGKey(0), _normal(0, (B, T, D)))
