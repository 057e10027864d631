"""Optimizer and learning-rate schedule from a few keyword arguments (optax combinators)."""

from __future__ import annotations

import optax

_SCHEDULES = ("constant", "cosine", "linear")
_OPTIMIZERS = ("adam", "adamw", "sgd")


def make_schedule(
    *,
    learning_rate: float,
    schedule: str = "constant",
    warmup_steps: int = 0,
    total_steps: int | None = None,
    end_factor: float = 0.0,
) -> optax.Schedule:
    """A learning-rate schedule: linear warmup from 0, then constant, cosine or linear decay.

    Args:
      learning_rate: the peak rate (reached at the end of warmup), ``> 0``.
      schedule: ``"constant"``, ``"cosine"`` (cosine decay to ``end_factor * learning_rate`` at
        ``total_steps``) or ``"linear"`` (linear decay to the same end value).
      warmup_steps: steps of linear warmup from 0 (``>= 0``).
      total_steps: total training steps, required for ``"cosine"`` and ``"linear"``; must exceed
        ``warmup_steps``.
      end_factor: final rate as a fraction of ``learning_rate``, in ``[0, 1]``.

    Returns:
      ``step -> learning rate``.

    Raises:
      ValueError: naming the first invalid argument.
    """
    if not learning_rate > 0:
        raise ValueError(f"learning_rate must be > 0, got {learning_rate}.")
    if schedule not in _SCHEDULES:
        raise ValueError(f"schedule must be one of {_SCHEDULES}, got {schedule!r}.")
    if warmup_steps < 0:
        raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps}.")
    if not 0.0 <= end_factor <= 1.0:
        raise ValueError(f"end_factor must be in [0, 1], got {end_factor}.")
    if schedule != "constant" and (total_steps is None or total_steps <= warmup_steps):
        raise ValueError(
            f"total_steps must be given and > warmup_steps ({warmup_steps}) for schedule "
            f"{schedule!r}, got {total_steps}."
        )
    lr = float(learning_rate)
    if schedule == "constant":
        main = optax.constant_schedule(lr)
    elif schedule == "cosine":
        main = optax.cosine_decay_schedule(lr, total_steps - warmup_steps, alpha=end_factor)
    else:
        main = optax.linear_schedule(lr, lr * end_factor, total_steps - warmup_steps)
    if warmup_steps == 0:
        return main
    warmup = optax.linear_schedule(0.0, lr, warmup_steps)
    return optax.join_schedules([warmup, main], [warmup_steps])


def make_optimizer(
    *,
    learning_rate: float | optax.Schedule,
    optimizer: str = "adam",
    clip_norm: float | None = None,
    weight_decay: float = 0.0,
    momentum: float = 0.9,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
) -> optax.GradientTransformation:
    """Global-norm clipping (optional) chained with Adam, AdamW or SGD with momentum.

    Args:
      learning_rate: a float or a schedule (e.g. from :func:`make_schedule`).
      optimizer: ``"adam"``, ``"adamw"`` (decoupled ``weight_decay``) or ``"sgd"`` (``momentum``).
      clip_norm: if given, gradients are rescaled to global norm at most ``clip_norm`` (``> 0``).
      weight_decay: AdamW's decoupled decay (``>= 0``; only with ``"adamw"``).
      momentum: SGD momentum in ``[0, 1)`` (0: plain SGD).
      b1, b2, eps: Adam's moment decays and epsilon.

    Raises:
      ValueError: naming the first invalid argument.

    Example:
      >>> schedule = make_schedule(learning_rate=1e-3, schedule="cosine", warmup_steps=100,
      ...                          total_steps=5000)
      >>> opt = make_optimizer(learning_rate=schedule, clip_norm=1.0)
    """
    if optimizer not in _OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {_OPTIMIZERS}, got {optimizer!r}.")
    if not callable(learning_rate) and not learning_rate > 0:
        raise ValueError(f"learning_rate must be > 0 or a schedule, got {learning_rate}.")
    if clip_norm is not None and not clip_norm > 0:
        raise ValueError(f"clip_norm must be > 0 or None, got {clip_norm}.")
    if weight_decay < 0:
        raise ValueError(f"weight_decay must be >= 0, got {weight_decay}.")
    if weight_decay and optimizer != "adamw":
        raise ValueError(f"weight_decay is only used by optimizer='adamw', got {optimizer!r}.")
    if not 0.0 <= momentum < 1.0:
        raise ValueError(f"momentum must be in [0, 1), got {momentum}.")
    if optimizer == "adam":
        opt = optax.adam(learning_rate, b1=b1, b2=b2, eps=eps)
    elif optimizer == "adamw":
        opt = optax.adamw(learning_rate, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay)
    else:
        opt = optax.sgd(learning_rate, momentum=momentum or None)
    if clip_norm is None:
        return opt
    return optax.chain(optax.clip_by_global_norm(clip_norm), opt)
