"""Flag groups the experiments share, and the objects built from them.

Each ``add_*_flags(parser, **defaults)`` adds one argparse group with the same flag names and
meanings in every experiment (REPRODUCTION.md and BENCHMARKS.md commands rely on them); the
matching ``*_from_flags(args)`` builds what the flags describe: the optimizer and its schedule,
the Anderson forward/backward solvers, the Jacobian regulariser, the ``fit`` keywords.
"""

from __future__ import annotations

import argparse
from typing import Any

import optax

from deqjax import solvers as solver_objects
from deqjax._src import adaptive_gamma, adjoints, jacobian_regularization
from deqjax._src.training.optimizer import make_optimizer, make_schedule
from deqjax._src.training.run_dir import (
    nonnegative_float,
    nonnegative_int,
    positive_float,
    positive_int,
)


def add_optimization_flags(
    p: argparse.ArgumentParser,
    *,
    epochs: int = 4,
    batch_size: int = 128,
    eval_batch_size: int = 1000,
    lr: float = 1e-3,
    warmup_steps: int = 0,
    clip_norm: float = 1.0,
) -> None:
    """``--epochs --steps --batch_size --eval_batch_size --lr --schedule --warmup_steps
    --clip_norm --max_nonfinite_steps``."""
    g = p.add_argument_group("optimisation")
    g.add_argument("--epochs", type=positive_int, default=epochs, help="passes over the data")
    g.add_argument(
        "--steps", type=nonnegative_int, default=0, help="total steps (0: epochs x steps/epoch)"
    )
    g.add_argument("--batch_size", type=positive_int, default=batch_size, help="global batch")
    g.add_argument(
        "--eval_batch_size", type=positive_int, default=eval_batch_size, help="evaluation batch"
    )
    g.add_argument("--lr", type=positive_float, default=lr, help="peak Adam learning rate")
    g.add_argument(
        "--schedule",
        default="cosine",
        choices=("constant", "cosine", "linear"),
        help="learning-rate decay after the warmup",
    )
    g.add_argument(
        "--warmup_steps", type=nonnegative_int, default=warmup_steps, help="linear warmup from 0"
    )
    g.add_argument(
        "--clip_norm",
        type=nonnegative_float,
        default=clip_norm,
        help="global-norm gradient clipping (0: off)",
    )
    g.add_argument(
        "--max_nonfinite_steps",
        type=positive_int,
        default=10,
        help="non-finite loss/gradient updates are skipped (counted as skipped_updates);\n"
        "stop with an error after this many in a row",
    )


def num_steps_from_flags(args: argparse.Namespace, steps_per_epoch: int) -> int:
    """``--steps``, or ``--epochs`` x ``steps_per_epoch`` when it is 0."""
    return args.steps if args.steps else args.epochs * steps_per_epoch


def optimizer_from_flags(
    args: argparse.Namespace, num_steps: int
) -> tuple[optax.Schedule, optax.GradientTransformation]:
    """``(schedule, Adam with clipping)`` from the optimisation flags."""
    schedule = make_schedule(
        learning_rate=args.lr,
        schedule=args.schedule,
        warmup_steps=min(args.warmup_steps, max(num_steps - 1, 0)),
        total_steps=num_steps if args.schedule != "constant" else None,
    )
    opt = make_optimizer(learning_rate=schedule, clip_norm=args.clip_norm or None)
    return schedule, opt


def add_logging_flags(
    p: argparse.ArgumentParser,
    *,
    log_every: int = 50,
    diagnostics_every: int = 200,
    checkpoint_every: int = 500,
) -> None:
    """``--log_every --eval_every --diagnostics_every --checkpoint_every --keep_checkpoints``."""
    g = p.add_argument_group("logging and checkpoints")
    g.add_argument(
        "--log_every", type=positive_int, default=log_every, help="steps between metric records"
    )
    g.add_argument("--eval_every", type=nonnegative_int, default=0, help="0: at each epoch end")
    g.add_argument(
        "--diagnostics_every",
        type=nonnegative_int,
        default=diagnostics_every,
        help="steps between backward/Jacobian diagnostics (0 disables)",
    )
    g.add_argument(
        "--checkpoint_every",
        type=nonnegative_int,
        default=checkpoint_every,
        help="0: only at the end",
    )
    g.add_argument(
        "--keep_checkpoints", type=positive_int, default=3, help="newest checkpoints kept on disk"
    )


def fit_kwargs_from_flags(args: argparse.Namespace) -> dict[str, Any]:
    """The :func:`~deqjax.training.fit` keywords the optimisation and logging flags set."""
    return {
        "log_every": args.log_every,
        "eval_every": args.eval_every or None,
        "eval_batch_size": args.eval_batch_size,
        "checkpoint_every": args.checkpoint_every or None,
        "keep_checkpoints": args.keep_checkpoints,
        "max_nonfinite_steps": args.max_nonfinite_steps,
        "diagnostics_every": args.diagnostics_every or None,
    }


def add_solver_flags(
    p: argparse.ArgumentParser, *, max_steps: int = 20, tol: float = 1e-3, bwd_tol: float = 1e-3
) -> None:
    """``--max_steps --tol --anderson_m --stop_mode --bwd_max_steps --bwd_tol --adjoint
    --adjoint_steps``."""
    g = p.add_argument_group("solvers")
    g.add_argument("--max_steps", type=positive_int, default=max_steps, help="forward steps")
    g.add_argument("--tol", type=positive_float, default=tol, help="forward tolerance")
    g.add_argument("--anderson_m", type=positive_int, default=5, help="Anderson memory")
    g.add_argument(
        "--stop_mode",
        default="rel",
        choices=("rel", "abs"),
        help="stop on the relative or the absolute residual",
    )
    g.add_argument(
        "--bwd_max_steps", type=positive_int, default=max_steps, help="backward Anderson steps"
    )
    g.add_argument(
        "--bwd_tol", type=positive_float, default=bwd_tol, help="backward (implicit) tolerance"
    )
    g.add_argument(
        "--adjoint",
        default="implicit",
        choices=GRADIENTS,
        help="gradient through z*: implicit (Anderson backward), phantom, one_step, unrolled, "
        "shine (Broyden forward, its inverse estimate backward) or reversible (reversible "
        "forward, exact reversal backward)",
    )
    g.add_argument(
        "--adjoint_steps",
        type=nonnegative_int,
        default=None,
        help="phantom: damped steps (default 5); shine: refinement steps (default 0)",
    )


# The gradient strategies selectable by name (``--adjoint``), README's table of gradients.
GRADIENTS = ("implicit", "phantom", "one_step", "unrolled", "shine", "reversible")


def backward_solver_from_flags(args: argparse.Namespace) -> solver_objects.Anderson:
    """The Anderson backward solver of ``--bwd_max_steps --bwd_tol`` (implicit adjoint, and the
    backward-convergence diagnostic of every gradient)."""
    return solver_objects.Anderson(
        max_steps=args.bwd_max_steps, tol=args.bwd_tol, m=args.anderson_m, stop_mode=args.stop_mode
    )


def solver_and_adjoint(
    name: str,
    *,
    max_steps: int,
    tol: float,
    stop_mode: str = "rel",
    m: int = 5,
    backward: solver_objects.Solver | None = None,
    steps: int | None = None,
    tau: float = 0.5,
) -> tuple[solver_objects.Solver, adjoints.Adjoint]:
    """``(forward solver, adjoint)`` for the gradient named ``name`` (one of :data:`GRADIENTS`).

    Two gradients need their own forward solver, built with the same ``max_steps``, ``tol`` and
    ``stop_mode``: ``"shine"`` runs Broyden with ``return_inverse=True`` (SHINE reuses its
    inverse estimate, no fallback: the estimate's gradient as it is, refined by ``steps``
    adjoint iterations), ``"reversible"`` runs the reversible solver (its ``max_steps`` counts
    ``f`` evaluations, two per step of the paper). The others use Anderson with memory ``m``;
    ``"implicit"`` solves the backward with ``backward`` (None: the forward's kind),
    ``"phantom"`` differentiates ``steps`` (default 5) damped steps of damping ``tau``.

    Raises:
      ValueError: if ``name`` is not one of :data:`GRADIENTS`.
    """
    common = {"max_steps": max_steps, "tol": tol, "stop_mode": stop_mode}
    if name == "shine":
        broyden = solver_objects.Broyden(return_inverse=True, **common)
        return broyden, adjoints.ShineAdjoint(refine_steps=steps or 0, fallback=None)
    if name == "reversible":
        return solver_objects.Reversible(**common), adjoints.ReversibleAdjoint()
    anderson = solver_objects.Anderson(m=m, **common)
    if name == "implicit":
        return anderson, adjoints.ImplicitAdjoint(solver=backward)
    if name == "phantom":
        return anderson, adjoints.PhantomAdjoint(steps=5 if steps is None else steps, tau=tau)
    if name == "one_step":
        return anderson, adjoints.OneStepAdjoint()
    if name == "unrolled":
        return anderson, adjoints.UnrolledAdjoint()
    raise ValueError(f"adjoint must be one of {GRADIENTS}, got {name!r}.")


def solvers_from_flags(
    args: argparse.Namespace,
) -> tuple[solver_objects.Solver, adjoints.Adjoint]:
    """``(forward solver, adjoint)`` of ``--adjoint`` (:func:`solver_and_adjoint`) from the solver
    flags; the implicit backward is :func:`backward_solver_from_flags`."""
    return solver_and_adjoint(
        getattr(args, "adjoint", "implicit"),
        max_steps=args.max_steps,
        tol=args.tol,
        stop_mode=args.stop_mode,
        m=args.anderson_m,
        backward=backward_solver_from_flags(args),
        steps=getattr(args, "adjoint_steps", None),
    )


def add_jr_flags(p: argparse.ArgumentParser, *, jr: bool = True, gamma: float = 1.0) -> None:
    """``--jr/--no_jr --gamma --jr_p --jr_samples --adaptive_gamma --gamma_target --gamma_min
    --gamma_max`` (JR paper Eq. 4, optionally with an adaptive γ)."""
    g = p.add_argument_group("Jacobian regularisation (JR paper Eq. 4)")
    g.add_argument("--jr", dest="jr", action="store_true", default=jr, help="on")
    g.add_argument("--no_jr", dest="jr", action="store_false", help="no Jacobian regularisation")
    g.add_argument("--gamma", type=nonnegative_float, default=gamma, help="JR strength gamma")
    g.add_argument("--jr_p", type=float, default=0.5, help="Bernoulli gate probability p")
    g.add_argument("--jr_samples", type=positive_int, default=1, help="Hutchinson probes M")
    g.add_argument("--adaptive_gamma", action="store_true", help="adapt gamma to the residual")
    g.add_argument(
        "--gamma_target", type=nonnegative_float, default=0.0, help="target residual (0: --tol)"
    )
    g.add_argument("--gamma_min", type=nonnegative_float, default=1e-2, help="adaptive floor")
    g.add_argument("--gamma_max", type=nonnegative_float, default=20.0, help="adaptive ceiling")


def jr_from_flags(
    args: argparse.Namespace,
) -> tuple[jacobian_regularization.JacobianRegularizer | None, Any]:
    """``(regulariser or None, AdaptiveGamma controller or None)`` from the JR flags."""
    if not args.jr:
        return None, None
    reg = jacobian_regularization.JacobianRegularizer(
        args.gamma, p=args.jr_p, num_samples=args.jr_samples
    )
    ctrl = None
    if args.adaptive_gamma:
        ctrl = adaptive_gamma.AdaptiveGamma(
            init_gamma=args.gamma,
            target=args.gamma_target or args.tol,
            min_gamma=min(args.gamma_min, args.gamma),
            max_gamma=max(args.gamma_max, args.gamma),
        )
    return reg, ctrl
