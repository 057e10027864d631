"""The ensemble names every theory function accepts, and their validation."""

import jax
import pytest

from deqjax import theory


def test_ensemble_names():
    assert theory.ENSEMBLES == ("gaussian", "orthogonal", "goe")


def test_unknown_ensembles_raise():
    with pytest.raises(ValueError, match="ensemble"):
        theory.linear_second_moment(0.5, "wishart")
    with pytest.raises(ValueError, match="ensemble"):
        theory.spectral_radius(0.5, "Gaussian", 1.0, "tanh")
    with pytest.raises(ValueError, match="ensemble"):
        theory.sample_matrix(jax.random.key(0), 4, 0.5, "haar")
