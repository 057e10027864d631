"""The Jacobian-regularisation section: the regulariser and the adaptive controller."""

from deqjax import harness


def test_off_fixed_and_adaptive():
    assert harness.JRConfig(jr=False).build(tol=1e-3) == (None, None)
    reg, ctrl = harness.JRConfig(gamma=2.0, jr_p=0.4, jr_samples=3).build(tol=1e-3)
    assert (reg.gamma, reg.p, reg.num_samples) == (2.0, 0.4, 3) and ctrl is None
    c = harness.JRConfig(gamma=30.0, adaptive_gamma=True, gamma_min=0.1, gamma_max=20.0)
    _, ctrl = c.build(tol=1e-3)
    assert ctrl.init_gamma == 30.0 and ctrl.target == 1e-3  # --gamma_target 0: the tolerance
    assert (ctrl.min_gamma, ctrl.max_gamma) == (0.1, 30.0)  # the range holds the initial gamma
    _, ctrl = harness.JRConfig(adaptive_gamma=True, gamma_target=0.5).build(tol=1e-3)
    assert ctrl.target == 0.5
