"""The predicted critical scale: closed forms, and the radius reaching 1 there."""

import math

import numpy as np
import pytest

from deqjax import theory


def test_critical_scale():
    # Closed forms: linear 1 (GOE 1/2), relu sqrt(2) (GOE 1/sqrt(2)); one of each kind.
    assert float(theory.critical_scale("gaussian", "linear")) == pytest.approx(1.0, rel=1e-9)
    assert float(theory.critical_scale("goe", "relu")) == pytest.approx(math.sqrt(0.5), rel=1e-9)
    for ens in ("orthogonal", "goe"):
        c = float(theory.critical_scale(ens, "tanh"))
        assert float(theory.predicted_radius(c, ens, "tanh")) == pytest.approx(1.0, abs=1e-8)
        assert float(theory.predicted_radius(0.95 * c, ens, "tanh")) < 1.0
    assert float(theory.critical_scale("goe", "tanh")) < float(
        theory.critical_scale("orthogonal", "tanh")
    )
    assert np.isinf(theory.critical_scale("orthogonal", "tanh", max_scale=1.0))


def test_invalid_max_scale():
    with pytest.raises(ValueError, match="max_scale"):
        theory.critical_scale("goe", "tanh", max_scale=-1.0)
