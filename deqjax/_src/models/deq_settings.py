"""The JR penalty of a model's DEQ as entries of the model's ``aux`` dict (JR paper Eq. 4)."""

from __future__ import annotations

import haiku as hk
import jax
import jax.numpy as jnp

from deqjax._src import jacobian_regularization as jr_lib
from deqjax._src import tree
from deqjax._src.nn import deq as deq_lib

KEYS = ("jr", "jr/frobenius_sq", "jr/applied")


def check_regularizer(regularizer: object) -> None:
    """Raises ``ValueError`` unless ``regularizer`` is a ``JacobianRegularizer`` or ``None``."""
    if regularizer is not None and not isinstance(regularizer, jr_lib.JacobianRegularizer):
        raise ValueError(
            f"regularizer must be a dq.regularization.JacobianRegularizer or None, got "
            f"{regularizer!r}."
        )


def jr_terms(
    regularizer: jr_lib.JacobianRegularizer | None,
    out: deq_lib.DEQOutput,
    is_training: bool,
    step: jax.Array | None,
) -> dict[str, jax.Array]:
    """``{"jr": τ γ ‖J_f(z*)‖²_F / d, "jr/frobenius_sq": estimate, "jr/applied": τ}`` of
    ``regularizer`` at this forward pass's ``z*`` (call inside ``hk.transform``; the key is
    ``hk.next_rng_key()``); zeros without a regularizer or when not ``is_training``.

    The gate ``τ ~ Bernoulli(p)`` is drawn in-graph (one compiled step for both outcomes).
    """
    if regularizer is None or not is_training:
        zero = jnp.zeros((), tree.reduction_dtype(out.z_star))
        return dict.fromkeys(KEYS, zero)
    term, metrics = regularizer.penalty(out.cell_fn, out.z_star, hk.next_rng_key(), step)
    return {
        "jr": term,
        "jr/frobenius_sq": metrics["jr/frobenius_sq"],
        "jr/applied": metrics["jr/applied"],
    }
