"""The fully connected DEQ cell as pure functions of a parameter pytree (init paper §4.1; JR paper
§5.1), the one definition every framework's ``MLPCell`` computes with.

Three forms of ``f_θ(z; x)`` with input injection ``u = x U + b`` (see ``dq.nn.MLPCell``)::

    "resnet"     f(z; x) = LN₃(φ(z + LN₂(u + W₂ᵀ h))),  h = drop(LN₁(φ(W₁ᵀ z)))
    "single"     f(z; x) = drop(φ(Wᵀ z + u))
    "two_layer"  f(z; x) = W₂ᵀ drop(φ(W₁ᵀ z + u))

Parameters (the names of the Haiku cell's): ``U`` ``[Dx, D]`` (``[Dx, H]`` for ``"two_layer"``),
``b``, the recurrent ``W`` ``[D, D]`` or ``W1`` ``[D, H]`` and ``W2`` ``[H, D]`` (each an array, or
``{"v", "g"}`` when weight-normalised), and ``ln1``, ``ln2``, ``ln3`` (``{"scale", "offset"}``) for
``"resnet"``. :func:`prepare` computes once per forward pass what does not depend on ``z`` (the
injection, the normalised weights, the dropout mask); :func:`step` is one evaluation.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from deqjax._src import checks
from deqjax._src.cells import layers

FORMS = ("resnet", "single", "two_layer")
Params = dict[str, Any]
LayerNorm = Callable[[str, jax.Array], jax.Array]  # (name, x) -> normalised x
Dropout = Callable[[jax.Array], jax.Array]


def check_settings(
    hidden_size: int | None,
    form: str,
    activation: Any,
    dropout_rate: float,
    initializers: dict[str, Any],
) -> float:
    """The ``dropout_rate`` of a cell's settings, checked.

    Raises:
      ValueError: naming the argument, for an unknown ``form``, a bad ``hidden_size`` (or one
        with ``"single"``), a non-callable ``activation`` or initializer (given by name), or a
        ``dropout_rate`` outside ``[0, 1)``.
    """
    if form not in FORMS:
        raise ValueError(f"form must be one of {FORMS}, got {form!r}.")
    if hidden_size is not None:
        checks.check_positive_int(hidden_size, "hidden_size")
    if hidden_size is not None and form == "single":
        raise ValueError("hidden_size must be None for form='single' (W is [D, D]).")
    for name, value in initializers.items():
        if value is not None and not callable(value):
            raise ValueError(f"{name} must be callable, got {value!r}.")
    if not callable(activation):
        raise ValueError(f"activation must be callable, got {activation!r}.")
    return layers.check_rate(dropout_rate, "dropout_rate")


def weight_names(form: str) -> tuple[str, ...]:
    """The recurrent weights of ``form``."""
    return ("W",) if form == "single" else ("W1", "W2")


def init(
    key: jax.Array,
    in_features: int,
    features: int,
    *,
    hidden_size: int | None = None,
    form: str = "resnet",
    w_init: layers.Initializer | None = None,
    u_init: layers.Initializer | None = None,
    with_bias: bool = True,
    weight_norm: bool = False,
    dtype: Any = jnp.float32,
) -> Params:
    """The cell's parameters for ``x: [B, in_features]`` and ``z: [B, features]``.

    ``w_init`` draws the recurrent weights and ``u_init`` the injection ``U``, each called as
    JAX's ``init(key, shape, dtype)`` (any ``dq.initializers`` object or ``jax.nn.initializers``
    function; ``None``: the truncated normal of variance ``1/fan_in``, ``hk.Linear``'s default).
    ``hidden_size`` ``None`` is ``features``.
    """
    if form not in FORMS:
        raise ValueError(f"form must be one of {FORMS}, got {form!r}.")
    d = features
    h = d if hidden_size is None else hidden_size
    w_init = w_init or layers.lecun_truncated_normal
    u_init = u_init or layers.lecun_truncated_normal
    shapes = {"W": (d, d)} if form == "single" else {"W1": (d, h), "W2": (h, d)}
    k_u, *k_w = jax.random.split(key, 1 + len(shapes))
    params: Params = {"U": u_init(k_u, (in_features, h if form == "two_layer" else d), dtype)}
    if with_bias:
        params["b"] = jnp.zeros((params["U"].shape[1],), dtype)
    for k, (name, shape) in zip(k_w, shapes.items()):
        params[name] = layers.weight_param(k, shape, dtype, w_init, weight_norm=weight_norm)
    if form == "resnet":
        sizes = {"ln1": h, "ln2": d, "ln3": d}
        params.update({name: layers.layer_norm_params(n, dtype) for name, n in sizes.items()})
    return params


def build(
    key: jax.Array,
    in_features: int,
    features: int,
    *,
    activation: Callable[[jax.Array], jax.Array],
    dropout_rate: float,
    **settings: Any,
) -> tuple[Params, float]:
    """A front-end cell's construction: the settings checked (:func:`check_settings`, and
    positive ``in_features``, ``features``), then ``(init(key, ...), dropout_rate)``; ``settings``
    are :func:`init`'s keywords."""
    checks.check_positive_int(in_features, "in_features")
    checks.check_positive_int(features, "features")
    initializers = {name: settings.get(name) for name in ("w_init", "u_init")}
    rate = check_settings(
        settings.get("hidden_size"),
        settings.get("form", "resnet"),
        activation,
        dropout_rate,
        initializers,
    )
    return init(key, in_features, features, **settings), rate


def injection(params: Params, x: jax.Array) -> jax.Array:
    """``u = x U + b``: ``[B, D]`` (``[B, H]`` for ``"two_layer"``)."""
    u = x.astype(params["U"].dtype) @ params["U"]
    if "b" in params:
        u = u + params["b"][None, :]
    return u


def prepare(
    params: Params,
    x: jax.Array,
    *,
    form: str,
    dropout_rate: float = 0.0,
    key: jax.Array | None = None,
) -> dict[str, Any]:
    """The per-forward-pass context: the injection ``u``, the recurrent weights (normalised when
    weight-normalised) and the dropout mask (``None`` when ``dropout_rate`` is 0).

    Raises:
      ValueError: if ``x`` is not ``[B, Dx]``, or ``dropout_rate > 0`` and no ``key`` is given.
    """
    if x.ndim != 2:
        raise ValueError(f"MLPCell expects x [B, Dx], got shape {x.shape}.")
    u = injection(params, x)
    weights = {name: layers.weight(params[name]) for name in weight_names(form)}
    mask = None
    if dropout_rate > 0.0:
        if key is None:
            raise ValueError("MLPCell with dropout_rate > 0 needs a key when training.")
        width = u.shape[1] if form != "resnet" else weights["W1"].shape[1]
        mask = layers.dropout_mask(key, (x.shape[0], width), dropout_rate, u.dtype)
    return {"u": u, "w": weights, "mask": mask}


def equations(
    form: str,
    activation: Callable[[jax.Array], jax.Array],
    z: jax.Array,
    u: jax.Array,
    w: dict[str, jax.Array],
    ln: LayerNorm,
    drop: Dropout,
) -> jax.Array:
    """One application ``f_θ(z; x)`` of ``form`` (module docstring), given the injection ``u``,
    the weights ``w``, the layer norms ``ln(name, x)`` and the dropout ``drop`` of the
    framework: ``z [B, D]`` to ``[B, D]``."""
    phi = activation
    if form == "single":
        return drop(phi(z @ w["W"] + u))  # [B, D]
    if form == "two_layer":
        return drop(phi(z @ w["W1"] + u)) @ w["W2"]  # [B, H] -> [B, D]
    hid = drop(ln("ln1", phi(z @ w["W1"])))  # [B, H]
    return ln("ln3", phi(z + ln("ln2", u + hid @ w["W2"])))  # [B, D]


def step(
    params: Params,
    ctx: dict[str, Any],
    z: jax.Array,
    *,
    form: str,
    activation: Callable[[jax.Array], jax.Array] = jax.nn.relu,
) -> jax.Array:
    """One evaluation ``f_θ(z; x)`` from :func:`prepare`'s ``ctx``.

    Raises:
      ValueError: if ``z`` is not ``[B, D]``.
    """
    if z.ndim != 2:
        raise ValueError(f"MLPCell expects z [B, D], got shape {z.shape}.")
    mask = ctx["mask"]
    return equations(
        form,
        activation,
        z,
        ctx["u"],
        ctx["w"],
        lambda name, v: layers.layer_norm(v, params[name]["scale"], params[name]["offset"]),
        (lambda v: v) if mask is None else (lambda v: v * mask),
    )
