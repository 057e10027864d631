"""dq.nn.TrellisCell: shapes, weight norm, causality, history padding, the gated equations,
initializers, configuration errors, and the cell inside dq.nn.DEQ."""

import functools

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from deqjax import initializers
from deqjax.nn import TrellisCell, TrellisInput
from tests.helpers.sequence_cells import (
    BIG,
    DIL,
    DX,
    FAMILIES,
    HS,
    B,
    K,
    T,
    check_causal,
    check_deq_gradient_and_fixed_masks,
    check_dropout_only_when_training,
    check_family,
    check_weight_norm_invariance,
    normal,
    trellis,
    trellis_inputs,
)


@pytest.mark.parametrize("with_history", [False, True])
def test_trellis_shapes_and_jit(with_history):
    x, z = trellis_inputs(with_history)
    f = trellis()
    params = f.init(jax.random.PRNGKey(0), z, x)
    out = f.apply(params, z, x)
    assert out.shape == (B, T, 2 * HS) and out.dtype == jnp.float64
    if with_history:
        np.testing.assert_allclose(jax.jit(f.apply)(params, z, x), out, rtol=1e-12, atol=1e-12)
    p = jax.tree_util.tree_map(jnp.shape, params)
    assert p["trellis_cell/w_z"] == {"v": (K, HS, 4 * HS), "g": (1, 1, 4 * HS)}
    assert p["trellis_cell"]["w_x"] == (K, DX, 4 * HS)
    assert TrellisCell.hidden(out).shape == (B, T, HS)


@pytest.mark.slow
def test_weight_norm_forward_invariant_to_rescaling_v():
    x, z = trellis_inputs(True)
    check_weight_norm_invariance(trellis(**BIG), x, z, num_normed=1)


@pytest.mark.parametrize("with_history", [False, True])
def test_trellis_causal(with_history):
    x, z = trellis_inputs(with_history)
    f = trellis(**BIG)
    params = f.init(jax.random.PRNGKey(0), z, x)
    apply = functools.partial(f.apply, params)
    x_array = x.x if with_history else x
    rebuild = (lambda xa: x._replace(x=xa)) if with_history else (lambda xa: xa)
    for t0 in (0, 2):
        check_causal(apply, z, x_array, rebuild, t0)


def test_trellis_history_padding_continues_the_sequence():
    """Applying the cell to [first; second] equals applying it to `second` with the history of
    the last (k-1)s states and inputs of `first`: exact sequence continuity."""
    p = (K - 1) * DIL
    x_full, z_full = normal(8, (B, 2 * T, DX)), normal(9, (B, 2 * T, 2 * HS))
    f = trellis(**BIG)
    params = f.init(jax.random.PRNGKey(0), z_full, x_full)
    full = f.apply(params, z_full, x_full)
    second = f.apply(
        params,
        z_full[:, T:],
        TrellisInput(x_full[:, T:], z_full[:, T - p : T], x_full[:, T - p : T]),
    )
    np.testing.assert_allclose(second, full[:, T:], rtol=1e-12, atol=1e-12)
    zero_hist = f.apply(params, z_full[:, T:], x_full[:, T:])
    assert np.max(np.abs(zero_hist[:, 0] - full[:, T])) > 1e-3


def test_trellis_matches_the_gated_equations():
    """A per-time-step loop of DEQ paper §4 / TrellisNet's LSTM gating, from the cell's params."""
    x, z = trellis_inputs(True)
    f = trellis(**BIG)
    params = f.init(jax.random.PRNGKey(0), z, x)
    got = np.asarray(f.apply(params, z, x))
    prm = jax.tree_util.tree_map(np.asarray, params)
    v, g = prm["trellis_cell/w_z"]["v"], prm["trellis_cell/w_z"]["g"]
    w_z = v * g / np.sqrt(np.sum(v**2, axis=(0, 1), keepdims=True))  # [k, H, 4H]
    w_x, b_x = prm["trellis_cell"]["w_x"], prm["trellis_cell"]["b_x"]
    z, hist = np.asarray(z), np.asarray(x.history)
    h_all = np.concatenate([hist[..., :HS], z[..., :HS]], axis=1)  # [B, P+T, H]
    x_all = np.concatenate([np.asarray(x.x_history), np.asarray(x.x)], axis=1)  # [B, P+T, Dx]
    sig = lambda a: 1.0 / (1.0 + np.exp(-a))  # noqa: E731
    p = (K - 1) * DIL
    want = np.zeros_like(got)
    for b in range(B):
        for t in range(T):
            # tap j reads time t - (K-1-j)*DIL, i.e. index p + t - (K-1-j)*DIL of the padded arrays
            idx = [p + t - (K - 1 - j) * DIL for j in range(K)]
            pre = sum(h_all[b, i] @ w_z[j] + x_all[b, i] @ w_x[j] for j, i in enumerate(idx))
            gi, go, gg, gf = np.split(pre + b_x, 4)
            c_prev = hist[b, -1, HS:] if t == 0 else z[b, t - 1, HS:]
            c = sig(gf) * c_prev + sig(gi) * np.tanh(gg)
            want[b, t] = np.concatenate([sig(go) * np.tanh(c), c])
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_w_init_family(family):
    xr, zr = trellis_inputs(False)
    rp = trellis(w_init=FAMILIES[family]).init(jax.random.PRNGKey(0), zr, xr)
    blocks = [
        rp["trellis_cell/w_z"]["v"][j, :, g * HS : (g + 1) * HS] for j in range(K) for g in range(4)
    ]
    for w in blocks:
        check_family(w, family)
    # blocks are independent draws, not one matrix repeated
    assert np.max(np.abs(blocks[0] - blocks[1])) > 1e-3


@pytest.mark.parametrize(
    "kwargs, arg",
    [
        ({"hidden_size": 0}, "hidden_size"),
        ({"hidden_size": 4, "kernel_size": 1}, "kernel_size"),
        ({"hidden_size": 4, "dilation": 0}, "dilation"),
        ({"hidden_size": 4, "dropout": -0.1}, "dropout"),
        ({"hidden_size": 4, "weight_norm": None}, "weight_norm"),
        ({"hidden_size": 4, "inject_w_init": "normal"}, "inject_w_init"),
    ],
)
def test_trellis_bad_config(kwargs, arg):
    hidden = kwargs.pop("hidden_size")
    with pytest.raises(ValueError, match=arg):
        hk.transform(lambda: TrellisCell(hidden, **kwargs)).init(None)


def test_bad_shapes_raise():
    xr, zr = trellis_inputs(True)
    with pytest.raises(ValueError, match="history"):
        trellis().init(jax.random.PRNGKey(0), zr, xr._replace(history=xr.history[:, :1]))


@pytest.mark.slow
def test_deq_gradient_matches_unrolled_and_masks_are_fixed():
    def make_cell():
        return TrellisCell(
            HS,
            kernel_size=K,
            dilation=DIL,
            dropout=0.2,
            w_init=initializers.Gaussian(1.0),
            inject_w_init=hk.initializers.RandomNormal(1.0),
        )

    check_deq_gradient_and_fixed_masks(make_cell, trellis_inputs(True)[0], compare_unrolled=True)


def test_dropout_only_when_training():
    x, z = trellis_inputs(False)
    check_dropout_only_when_training(lambda: TrellisCell(HS, dropout=0.5), x, z)
