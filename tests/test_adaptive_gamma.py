"""AdaptiveGamma: the controller of the Jacobian-regularization strength γ."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from deqjax.regularization import AdaptiveGamma, AdaptiveGammaState


def run_controller(ctrl, signals):
    state = ctrl.init()
    update = jax.jit(ctrl.update)
    gammas = []
    for s in signals:
        state = update(state, s)
        gammas.append(float(state.gamma))
    return state, np.asarray(gammas)


def test_controller_raises_holds_and_lowers():
    ctrl = AdaptiveGamma(
        init_gamma=1.0, target=1e-3, lower_ratio=0.5, increase=1.1, decrease=0.9, smoothing=0.0
    )
    # Above target: raised by exactly x1.1 per step.
    _, g = run_controller(ctrl, [2e-3] * 5)
    np.testing.assert_allclose(g, 1.1 ** np.arange(1, 6), rtol=1e-6)
    # In the dead band [0.5e-3, 1e-3]: unchanged.
    _, g = run_controller(ctrl, [0.7e-3] * 5)
    np.testing.assert_allclose(g, 1.0)
    # Comfortably below: lowered by x0.9 per step.
    _, g = run_controller(ctrl, [1e-4] * 3)
    np.testing.assert_allclose(g, 0.9 ** np.arange(1, 4), rtol=1e-6)


def test_controller_bounds_smoothing_and_nonfinite():
    ctrl = AdaptiveGamma(
        init_gamma=1.0,
        target=5.0,
        increase=2.0,
        decrease=0.5,
        min_gamma=0.25,
        max_gamma=4.0,
        smoothing=0.5,
    )
    state, g = run_controller(ctrl, [10.0] * 5)
    assert g[-1] == 4.0 and g.max() == 4.0  # clipped at max_gamma
    state, g = run_controller(ctrl, [0.1] * 6)
    assert g[-1] == 0.25  # clipped at min_gamma
    # EMA: first update sets it, then beta-mixing.
    state = ctrl.update(ctrl.init(), 4.0)
    state = ctrl.update(state, 8.0)
    np.testing.assert_allclose(state.signal, 6.0)
    assert int(state.count) == 2
    # A single spike after a calm history is smoothed away (EMA 4 -> 0.5*4+0.5*5.8 = 4.9 < 5).
    calm = ctrl.update(ctrl.update(ctrl.init(), 4.0), 4.0)
    spiked = ctrl.update(calm, 5.8)
    assert float(spiked.gamma) == float(calm.gamma)
    # A non-finite signal raises gamma and leaves the EMA and the count alone.
    nan_state = ctrl.update(calm, jnp.nan)
    assert float(nan_state.gamma) == 2 * float(calm.gamma)
    assert float(nan_state.signal) == float(calm.signal) and int(nan_state.count) == 2


def test_controller_on_synthetic_residual_sequence_tracks_target():
    # A toy plant: the solver's residual at its budget falls as gamma grows, r = 4e-3 / gamma,
    # and drifts up over time (the Jacobian "creeps up" under fixed gamma, JR paper App. B.3).
    ctrl = AdaptiveGamma(
        init_gamma=1.0, target=1e-3, lower_ratio=0.5, increase=1.05, decrease=0.98, smoothing=0.8
    )
    state = ctrl.init()
    update = jax.jit(ctrl.update)
    fixed, adaptive = [], []
    for t in range(600):
        drift = 1.0 + t / 200.0
        fixed.append(4e-3 * drift / 1.0)
        r = 4e-3 * drift / float(state.gamma)
        adaptive.append(r)
        state = update(state, jnp.asarray([r, r]))  # an array signal is averaged
    late = np.asarray(adaptive[300:])
    assert np.all(late < 1e-3 * 1.3) and np.all(late > 0.5e-3 * 0.7)
    assert fixed[-1] > 10e-3  # the fixed-gamma residual drifted far above the target
    assert float(state.gamma) > 4.0


def test_controller_state_is_a_pytree_and_bad_arguments():
    state = AdaptiveGamma(init_gamma=1.0, target=6.0).init()
    assert isinstance(state, AdaptiveGammaState)
    assert state.gamma.dtype == jnp.float32 and state.count.dtype == jnp.int32
    assert len(jax.tree_util.tree_leaves(state)) == 3
    for kwargs, match in [
        ({"init_gamma": 0.0, "target": 1.0}, "init_gamma"),
        ({"init_gamma": 1.0, "target": -1.0}, "target"),
        ({"init_gamma": 1.0, "target": 1.0, "increase": 0.9}, "increase"),
        ({"init_gamma": 1.0, "target": 1.0, "decrease": 1.1}, "decrease"),
        ({"init_gamma": 1.0, "target": 1.0, "lower_ratio": 2.0}, "lower_ratio"),
        ({"init_gamma": 10.0, "target": 1.0, "max_gamma": 5.0}, "init_gamma"),
        ({"init_gamma": 1.0, "target": 1.0, "smoothing": 1.0}, "smoothing"),
    ]:
        with pytest.raises(ValueError, match=match):
            AdaptiveGamma(**kwargs)
