"""The sequence models' section: the model it describes, and its smoke settings."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

import deqjax as dq
from deqjax import harness


def test_model_arguments():
    c = harness.SequenceModelConfig(d_model=8, num_heads=2, max_steps=3, adjoint="phantom")
    kwargs = c.model_kwargs()
    deq = kwargs["deq"]  # the model's one DEQ keyword
    assert isinstance(deq, dq.models.DEQSettings)
    assert deq.solver == dq.solvers.Anderson(max_steps=3, tol=1e-3)
    assert (deq.adjoint.tau, deq.regularizer, kwargs["ffn_init"]) == (0.8, None, None)
    kwargs = harness.SequenceModelConfig(jr_gamma=0.5, ffn_init="goe", d_ff=64).model_kwargs()
    assert kwargs["deq"].regularizer.gamma == 0.5 and kwargs["d_ff"] == 64
    assert kwargs["ffn_init"] is not None
    assert harness.SequenceModelConfig.SMOKE == {"d_model": 16, "num_heads": 2, "max_steps": 4}


@pytest.mark.slow  # compiles a DEQ-Transformer (seconds alone, a minute on a loaded machine)
def test_transform_builds_the_sequence_model():
    c = harness.SequenceModelConfig(d_model=8, num_heads=2, max_steps=3)
    model = c.transform(11, "deq", depth=1)
    tokens = jnp.zeros((2, 5), jnp.int32)
    with jax.numpy_dtype_promotion("standard"):
        params = model.init(jax.random.PRNGKey(0), tokens, None, True)
        logits, _ = model.apply(params, None, tokens, None, False)
    assert logits.shape == (2, 5, 11)
