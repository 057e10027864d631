"""The cells of the sequence models, built by name, and the trellis cell's reach."""

import haiku as hk
import jax.numpy as jnp
import pytest

from deqjax import nn
from deqjax._src.models import sequence_cells


def test_trellis_reach_is_k_minus_one_positions_per_evaluation():
    assert sequence_cells.trellis_reach(5, 2) == 5
    assert sequence_cells.trellis_reach(4, 3) == 8


def test_cells_by_name_and_their_inputs():
    def build():
        transformer = sequence_cells.sequence_cell("transformer", d_model=8, num_heads=2)
        trellis = sequence_cells.sequence_cell("trellis", d_model=8, trellis_kernel=3)
        return transformer, trellis

    transformer, trellis = hk.transform(build).apply({}, None)
    assert isinstance(transformer, nn.TransformerCell) and transformer.settings.d_ff == 16
    assert isinstance(trellis, nn.TrellisCell) and trellis.hidden_size == 4
    assert trellis.kernel_size == 3
    x, mems = jnp.zeros((2, 5, 8)), jnp.ones((2, 3, 8))
    assert sequence_cells.cell_input("transformer", x, mems) == nn.TransformerInput(x, mems)
    history = sequence_cells.cell_input("trellis", x, mems).history
    assert history.shape == (2, 1, 8)  # the memory's last position
    assert sequence_cells.cell_input("trellis", x, None).history is None
    with pytest.raises(ValueError, match="cell must be one of"):
        hk.transform(lambda: sequence_cells.sequence_cell("lstm", d_model=8)).init(None)
