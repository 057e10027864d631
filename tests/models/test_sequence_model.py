"""dq.models.SequenceModel: embeddings, a sequence backbone with memory, a linear head."""

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import deqjax as dq

B, T, D, VOCAB = 2, 4, 8, 11


@pytest.mark.parametrize("cell", ["transformer", "trellis"])
def test_logits_and_aux_of_a_weight_tied_model(cell):
    def forward(tokens, mems):
        model = dq.models.SequenceModel(VOCAB, "tied", cell, d_model=D, num_heads=2, depth=2)
        return model(tokens, mems, is_training=False)

    t = hk.without_apply_rng(hk.transform(forward))
    tokens = jnp.arange(B * T).reshape(B, T) % VOCAB
    mems = dq.models.initial_memory("tied", batch_size=B, memory_length=3, d_model=D, depth=2)
    params = t.init(jax.random.PRNGKey(0), tokens, mems)
    head = params["sequence_model/linear"]["w"]
    assert head.shape == ((D // 2 if cell == "trellis" else D), VOCAB)  # trellis: h of [h; c]
    logits, aux = t.apply(params, tokens, mems)
    assert logits.shape == (B, T, VOCAB) and np.all(np.isfinite(np.asarray(logits)))
    assert aux["new_mems"].shape == (2, B, T, D)
    assert float(aux["z_rms"]) > 0 and float(aux["nfe"]) == 2.0


def test_tokens_must_be_two_dimensional():
    t = hk.transform(
        lambda x: dq.models.SequenceModel(VOCAB, "deq", d_model=D)(x, is_training=True)
    )
    with pytest.raises(ValueError, match="tokens"):
        t.init(jax.random.PRNGKey(0), jnp.zeros((T,), jnp.int32))
