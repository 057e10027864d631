"""The Transformer-XL relative attention behind dq.nn.TransformerCell."""

import jax.numpy as jnp
import numpy as np
import pytest

from deqjax._src.cells import relative_attention as ra
from tests.helpers.sequence_cells import normal as _normal


def test_rel_shift_reindexes_distance_to_key():
    t, m = 4, 3
    scores = _normal(0, (2, t, t + m))
    out = ra.rel_shift(scores)
    for i in range(t):
        for j in range(m + i + 1):  # every causal entry
            np.testing.assert_array_equal(out[:, i, j], scores[:, i, j + t - 1 - i])


def test_relative_attention_matches_explicit_formula():
    t, m, h, dh = 3, 2, 2, 4
    q, k, v = _normal(0, (t, h, dh)), _normal(1, (t + m, h, dh)), _normal(2, (t + m, h, dh))
    r, u, w = _normal(3, (t + m, h, dh)), _normal(4, (h, dh)), _normal(5, (h, dh))
    got = ra.relative_attention(q, k, v, r, u, w)  # r[p] has distance K-1-p
    want = np.zeros((t, h, dh))
    for hh in range(h):
        for i in range(t):
            dist = [m + i - j for j in range(m + i + 1)]  # causal keys only
            s = [
                (q[i, hh] + u[hh]) @ k[j, hh] + (q[i, hh] + w[hh]) @ r[t + m - 1 - dist[j], hh]
                for j in range(m + i + 1)
            ]
            a = np.exp(np.array(s) / np.sqrt(dh) - np.max(np.array(s) / np.sqrt(dh)))
            want[i, hh] = (a / a.sum()) @ np.asarray(v[: m + i + 1, hh])
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_sinusoidal_embedding_bad_dim():
    with pytest.raises(ValueError, match="dim"):
        ra.sinusoidal_embedding(jnp.arange(3.0), 5)
