"""The section of the sequence models: width, heads, cell options, the DEQ's solve and penalty.

Flags ``--d_model --num_heads --pre_ln --d_ff --ffn_init --ffn_scale --max_steps --tol --adjoint
--jr_gamma`` (the copy-memory task and the language model); :meth:`SequenceModelConfig.transform`
builds the :class:`deqjax.models.SequenceModel` they describe as a Haiku transform.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Literal

import haiku as hk

from deqjax._src.harness.dtype_config import FLOAT32, DtypeConfig
from deqjax._src.harness.flag_types import (
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
)
from deqjax._src.harness.solver_config import Gradient, solver_and_adjoint
from deqjax._src.jacobian_regularization import JacobianRegularizer
from deqjax._src.models.deq_settings import DEQSettings
from deqjax._src.models.mlp_classifier import INIT_FAMILIES, recurrent_init
from deqjax._src.models.sequence_model import SequenceModel

# The FFN weights' initialisation: the model's own ("paper"), or an ensemble of the init paper.
FfnInit = Literal[("paper", *INIT_FAMILIES)]


@dataclasses.dataclass(frozen=True)
class SequenceModelConfig:
    """Sequence model: width, heads, transformer cell, the DEQ's solve, gradient and penalty."""

    # Its tolerance flags: a --dtype that cannot resolve their defaults picks ones it can.
    TOLERANCES: ClassVar[tuple[str, ...]] = ("tol",)

    # Its settings under --smoke: a tiny model (the experiment's own smoke settings win).
    SMOKE: ClassVar[dict[str, Any]] = {"d_model": 16, "num_heads": 2, "max_steps": 4}

    d_model: PositiveInt = 64  # model width
    num_heads: PositiveInt = 4  # attention heads
    pre_ln: bool = False  # pre-layer-norm transformer cells (default post-LN)
    d_ff: NonNegativeInt = 0  # FFN width; 0: 2 d_model
    ffn_init: FfnInit = "paper"  # FFN weights' initialisation (an ensemble: the init paper's)
    ffn_scale: float = 1.0  # ensemble scale of --ffn_init
    max_steps: PositiveInt = 12  # DEQ Anderson steps
    tol: PositiveFloat = 1e-3  # forward solver tolerance
    adjoint: Gradient = "implicit"  # DEQ gradient (phantom: damping 0.8)
    jr_gamma: NonNegativeFloat = 0.0  # JR weight, JR paper Eq. 4 with one probe (0: off)

    def model_kwargs(self) -> dict[str, Any]:
        """The :class:`deqjax.models.SequenceModel` arguments these flags set: width, heads,
        cell options and the DEQ's :class:`~deqjax.models.DEQSettings` (the solver and adjoint
        of ``--adjoint``, :func:`solver_and_adjoint`, phantom damping 0.8, and the Jacobian
        regulariser)."""
        solver, adjoint = solver_and_adjoint(
            self.adjoint, max_steps=self.max_steps, tol=self.tol, tau=0.8
        )
        if self.ffn_init == "paper":
            ffn_init = None
        else:
            ffn_init = recurrent_init(self.ffn_init, self.ffn_scale)
        jr = JacobianRegularizer(self.jr_gamma) if self.jr_gamma > 0 else None
        return {
            "d_model": self.d_model,
            "num_heads": self.num_heads,
            "pre_ln": self.pre_ln,
            "d_ff": self.d_ff or None,
            "ffn_init": ffn_init,
            "deq": DEQSettings(solver, adjoint=adjoint, regularizer=jr),
        }

    def transform(
        self,
        vocab_size: int,
        kind: str,
        cell: str = "transformer",
        *,
        compute: DtypeConfig = FLOAT32,
        **model_kwargs: Any,
    ) -> hk.Transformed:
        """``apply(params, rng, *inputs, is_training) -> (logits, aux)`` of the
        :class:`deqjax.models.SequenceModel` of ``kind`` (``deq``, ``tied``, ``untied``) and
        ``cell``, with :meth:`model_kwargs` and ``model_kwargs`` (e.g. ``depth``), computing in
        ``compute``'s dtype (``--dtype``; float32 parameters)."""
        kwargs = self.model_kwargs() | model_kwargs

        def forward(*args: Any) -> Any:
            *inputs, is_training = args
            model = SequenceModel(vocab_size, kind, cell, **kwargs)
            return model(*inputs, is_training=is_training)

        model = hk.transform(forward)
        apply = compute.apply(SequenceModel, model.apply)
        return hk.Transformed(compute.apply(SequenceModel, model.init), apply)
