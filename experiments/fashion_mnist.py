"""Main job: a fully connected DEQ on Fashion-MNIST (init paper §4.1) and its init sweep (Fig. 5).

Model (init paper §4.1): flatten → a fully connected ResNet-style DEQ layer → dense logits. The
DEQ layer is ``dq.nn.MLPCell`` (``form="resnet"``: ``f(z; x) = LN(φ(z + LN(u + W₂ LN(φ(W₁ z)))))``
with ``u = U x + b``), solved by ``dq.nn.DEQ`` with Anderson acceleration forward and implicit
differentiation backward (DEQ paper, Theorem 1). Recurrent weights are initialised Haar-orthogonal
(``dq.initializers``, the init paper's recommendation). Training: Adam and the Bernoulli-gated
Jacobian regulariser ``τ γ ‖J_f(z*)‖²_F / d`` (JR paper, Eq. 4), optionally with adaptive ``γ``.

Logged every ``--log_every`` steps (JSONL + progress bar): loss, cross entropy, accuracy, forward
NFE and relative residual (batch mean and ``*_max``), converged fraction, JR term and ``γ``; every
``--diagnostics_every`` steps: the backward-solve residual and steps (``dq.jacobian.
backward_convergence``), a Hutchinson ``‖J_f(z*)‖_F`` estimate and the power-method spectral radius
``ρ(J_f(z*))``; at every epoch end the test accuracy, NFE and residuals (printed). Outputs in
``--out_dir`` (default ``runs/fashion_mnist``): ``config.json``, ``metrics.jsonl``, ``ckpt/``
(orbax, every ``--checkpoint_every`` steps; ``--resume`` continues), ``curves.png``,
``results.json``. An ``--out_dir`` holding an earlier run is refused unless ``--resume`` (which
checks that the flags match ``config.json``) or ``--overwrite``. A non-finite loss or gradient
skips its update; ``--max_nonfinite_steps`` in a row stop the run (exit status 3).

``--sweep`` reproduces the init paper's Fig. 5 (test error vs initialisation scale for Gaussian,
Haar-orthogonal and GOE recurrent weights, several seeds each; median and mean per family) at a
reduced cost: ``sweep.csv`` (one row per run), ``sweep_summary.csv`` and ``sweep.png``.

Usage:
  python experiments/fashion_mnist.py                       # the main job (README's first command)
  python experiments/fashion_mnist.py --epochs 1 --no_jr    # quicker, no Jacobian regularisation
  python experiments/fashion_mnist.py --resume              # continue a killed run
  python experiments/fashion_mnist.py --sweep               # Fig. 5 at reduced cost
  python experiments/fashion_mnist.py --smoke --dataset digits   # 1-3 minutes; used by tests
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import functools
import json
import math
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import optax
import tqdm

import deqjax as dq
from deqjax import data, training
from deqjax import initializers as dqinit
from deqjax import jacobian as dqjac
from deqjax import nn as dqnn
from deqjax import regularization as dqreg
from deqjax import solvers as dqsolvers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import plot_metrics  # noqa: E402

NUM_CLASSES = 10
FAMILIES = {
    "gaussian": dqinit.Gaussian,
    "orthogonal": dqinit.HaarOrthogonal,
    "goe": dqinit.GOE,
}
CURVE_METRICS = (
    "loss",
    "accuracy",
    "nfe",
    "rel_residual",
    "rel_residual_max",
    "jr/penalty",
    "jr/gamma",
    "bwd_rel_residual",
    "jac_frobenius",
    "spectral_radius",
    "skipped_updates",
)


# --------------------------------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------------------------------


def load_data(
    dataset: str = "fashion_mnist",
    *,
    data_dir: str | None = None,
    train_size: int = 0,
    test_size: int = 0,
    seed: int = 0,
) -> tuple[dict, dict, str]:
    """Train and test sets as ``{"image": float32 [N, P] standardised, "label": int32 [N]}``.

    Args:
      dataset: ``"fashion_mnist"`` (idx files in ``data_dir``, default
        ``/usr/share/datasets/fashion-mnist``) or ``"digits"`` (scikit-learn's 8×8 digits, for
        tests).
      data_dir: folder of the idx files (Fashion-MNIST only).
      train_size, test_size: keep a random subset of this many examples (0: all).
      seed: seed of the subsets.

    Returns:
      ``(train, test, source)`` with ``source`` a human-readable description.

    Raises:
      deqjax.data.DataNotFoundError: if the Fashion-MNIST files are missing (names the paths).
      ValueError: for an unknown ``dataset``.
    """
    if dataset == "fashion_mnist":
        train = data.load_fashion_mnist(data_dir, split="train")
        test = data.load_fashion_mnist(data_dir, split="test")
        source = f"Fashion-MNIST idx files in {data_dir or data.DEFAULT_FASHION_MNIST_DIR}"
    elif dataset == "digits":
        train = data.load_digits(split="train")
        test = data.load_digits(split="test")
        source = "scikit-learn digits (8x8)"
    else:
        raise ValueError(f"dataset must be 'fashion_mnist' or 'digits', got {dataset!r}.")
    rng = np.random.default_rng(seed)

    def prep(split: dict, size: int) -> dict:
        n = split["label"].shape[0]
        idx = np.sort(rng.permutation(n)[:size]) if 0 < size < n else np.arange(n)
        image = np.asarray(split["image"])[idx].reshape(idx.shape[0], -1).astype(np.float32)
        return {"image": image, "label": np.asarray(split["label"])[idx].astype(np.int32)}

    train, test = prep(train, train_size), prep(test, test_size)
    if dataset == "fashion_mnist":  # uint8 pixels -> [0, 1] (digits already are)
        train["image"] /= 255.0
        test["image"] /= 255.0
    mean, std = float(train["image"].mean()), float(train["image"].std()) + 1e-6
    for split in (train, test):
        split["image"] = ((split["image"] - mean) / std).astype(np.float32)
    return train, test, source


# --------------------------------------------------------------------------------------------------
# Model
# --------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Hyper-parameters of the DEQ classifier (static: closed over by the jitted functions).

    Attributes:
      width: state size ``D`` of the DEQ layer.
      hidden: hidden size ``H`` of the ResNet cell (``None``: ``D``; GOE needs ``H = D``).
      cell_form: ``dq.nn.MLPCell`` form: ``"resnet"`` (init paper §4.1) or ``"single"``
        (``φ(W z + U x)``, the init paper's theory model).
      max_steps, tol, anderson_m: forward Anderson solver (training and evaluation).
      stop_mode: ``"rel"`` or ``"abs"`` residual for the stopping test.
      bwd_max_steps, bwd_tol: the implicit backward solve (Anderson).
      diag_power_steps: power iterations of the spectral-radius monitor.
      diag_probes: Hutchinson probes of the ``‖J‖_F`` monitor.
    """

    width: int = 128
    hidden: int | None = None
    cell_form: str = "resnet"
    max_steps: int = 20
    tol: float = 1e-3
    anderson_m: int = 5
    stop_mode: str = "rel"
    bwd_max_steps: int = 20
    bwd_tol: float = 1e-3
    diag_power_steps: int = 30
    diag_probes: int = 2

    def __post_init__(self):
        for name in ("width", "max_steps", "anderson_m", "bwd_max_steps", "diag_power_steps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}.")
        if self.cell_form not in ("resnet", "single"):
            raise ValueError(f"cell_form must be 'resnet' or 'single', got {self.cell_form!r}.")
        if self.stop_mode not in ("rel", "abs"):
            raise ValueError(f"stop_mode must be 'rel' or 'abs', got {self.stop_mode!r}.")

    def forward_solver(self):
        return functools.partial(
            dqsolvers.anderson,
            max_steps=self.max_steps,
            tol=self.tol,
            m=self.anderson_m,
            stop_mode=self.stop_mode,
        )

    def backward_solver(self):
        return functools.partial(
            dqsolvers.anderson,
            max_steps=self.bwd_max_steps,
            tol=self.bwd_tol,
            m=self.anderson_m,
            stop_mode=self.stop_mode,
        )


def make_w_init(family: str, scale: float) -> hk.initializers.Initializer:
    """The recurrent-weight initializer: ``family`` in ``gaussian | orthogonal | goe`` at ``scale``.

    Raises:
      ValueError: for an unknown family or an invalid scale.
    """
    if family not in FAMILIES:
        raise ValueError(f"init family must be one of {sorted(FAMILIES)}, got {family!r}.")
    return FAMILIES[family](scale)


class Model(NamedTuple):
    """The pure functions of the classifier, all ``(params, ...)`` (no Haiku state, no rng).

    ``init(key, images) -> params``; ``train(params, images, labels, jr_key, gamma, step) ->
    (loss, metrics)``; ``evaluate(params, images, labels) -> {name: per-example [B]}``;
    ``diagnostics(params, images, labels, key) -> {name: scalar}``.
    """

    init: Callable[..., Any]
    train: Callable[..., Any]
    evaluate: Callable[..., Any]
    diagnostics: Callable[..., Any]


class _Head(hk.Module):
    """Dense logits ``z W + b`` with the weights exposed (for the backward-solve cotangent)."""

    def weights(self, d: int, dtype) -> tuple[jax.Array, jax.Array]:
        w_init = hk.initializers.VarianceScaling(1.0, "fan_in", "truncated_normal")
        w = hk.get_parameter("w", [d, NUM_CLASSES], dtype, init=w_init)
        b = hk.get_parameter("b", [NUM_CLASSES], dtype, init=jnp.zeros)
        return w, b


def _logits(z: jax.Array, w: jax.Array, b: jax.Array) -> jax.Array:
    return z @ w + b[None, :]  # [B, C]


def _cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels)  # [B]


def build_model(
    cfg: ModelConfig,
    *,
    w_init: hk.initializers.Initializer | None = None,
    regularizer: dqreg.JacobianRegularizer | None = None,
) -> Model:
    """Builds the §4.1 classifier: flatten → DEQ(MLPCell) → dense logits.

    Args:
      cfg: model hyper-parameters.
      w_init: initializer of the cell's recurrent weights (``None``: Haar-orthogonal at 1.0).
        Only ``init`` depends on it: the other functions are the same for every initializer.
      regularizer: the Jacobian regulariser added to the training loss (``None``: none).

    Returns:
      A :class:`Model`.
    """
    w_init = dqinit.HaarOrthogonal(1.0) if w_init is None else w_init
    solver = cfg.forward_solver()
    adjoint = dq.ImplicitAdjoint(solver=cfg.backward_solver())
    width = cfg.width

    def core(images: jax.Array):
        x = images.reshape(images.shape[0], -1).astype(jnp.float32)  # [B, P]
        cell = dqnn.MLPCell(cfg.hidden, form=cfg.cell_form, w_init=w_init)
        deq = dqnn.DEQ(
            cell,
            solver=solver,
            adjoint=adjoint,
            init_state=lambda x_: jnp.zeros((x_.shape[0], width), x_.dtype),
            name="deq",
        )
        out = deq.solve(x)  # z_star [B, D]
        w, b = _Head(name="head").weights(width, out.z_star.dtype)
        return out, w, b

    def solver_metrics(sol) -> dict[str, jax.Array]:
        nfe = sol.num_steps.astype(jnp.float32)  # [B]
        rel = sol.rel_residual.astype(jnp.float32)  # [B]
        return {
            "nfe": jnp.mean(nfe),
            "nfe_max": jnp.max(nfe),
            "rel_residual": jnp.mean(rel),
            "rel_residual_max": jnp.max(rel),
            "abs_residual": jnp.mean(sol.abs_residual.astype(jnp.float32)),
            "converged": jnp.mean((sol.status == dqsolvers.CONVERGED).astype(jnp.float32)),
        }

    def init_fn(images):
        out, w, b = core(images)
        return _logits(out.z_star, w, b)

    def train_fn(images, labels, jr_key, gamma, step):
        out, w, b = core(images)
        logits = _logits(out.z_star, w, b)
        ce = jnp.mean(_cross_entropy(logits, labels))
        metrics = {
            "cross_entropy": ce,
            "accuracy": jnp.mean(
                (jnp.argmax(logits, -1).astype(labels.dtype) == labels).astype(jnp.float32)
            ),
            **solver_metrics(out.solution),
        }
        loss = ce
        if regularizer is not None:
            term, jr_metrics = regularizer.penalty(
                out.cell_fn, out.z_star, jr_key, step, gamma=gamma
            )
            loss = loss + term.astype(ce.dtype)
            metrics.update(jr_metrics)
        return loss, metrics

    def eval_fn(images, labels):
        out, w, b = core(images)
        logits = _logits(out.z_star, w, b)
        sol = out.solution
        rel = sol.rel_residual.astype(jnp.float32)
        return {
            "accuracy": (jnp.argmax(logits, -1).astype(labels.dtype) == labels).astype(jnp.float32),
            "loss": _cross_entropy(logits, labels).astype(jnp.float32),
            "nfe": sol.num_steps.astype(jnp.float32),
            "nfe_max": sol.num_steps.astype(jnp.float32),
            "rel_residual": rel,
            "rel_residual_max": rel,
            "converged": (sol.status == dqsolvers.CONVERGED).astype(jnp.float32),
        }

    def diagnostics_fn(images, labels, key):
        out, w, b = core(images)
        z = jax.lax.stop_gradient(out.z_star)
        g = jax.grad(lambda z_: jnp.mean(_cross_entropy(_logits(z_, w, b), labels)))(z)
        bwd = dqjac.backward_convergence(
            lambda p, x, z_: out.cell_fn(z_), (), (), z, g, solver=cfg.backward_solver()
        )
        k_fro, k_rho = jax.random.split(key)
        fro_sq = dqjac.frobenius_sq(out.cell_fn, z, k_fro, num_samples=cfg.diag_probes)
        rho = dqjac.spectral_radius(out.cell_fn, z, k_rho, num_steps=cfg.diag_power_steps)
        return {
            "bwd_rel_residual": bwd.rel_residual.astype(jnp.float32),
            "bwd_abs_residual": bwd.abs_residual.astype(jnp.float32),
            "bwd_nfe": bwd.num_steps.astype(jnp.float32),
            # per-example ‖J_f(z*)‖_F (root mean square over the batch) and ‖J‖²_F / d
            "jac_frobenius": jnp.sqrt(fro_sq * width).astype(jnp.float32),
            "jac_frobenius_sq_per_dim": fro_sq.astype(jnp.float32),
            "spectral_radius": rho.astype(jnp.float32),  # max over the batch's examples
        }

    init_t = hk.without_apply_rng(hk.transform(init_fn))
    train_t = hk.without_apply_rng(hk.transform(train_fn))
    eval_t = hk.without_apply_rng(hk.transform(eval_fn))
    diag_t = hk.without_apply_rng(hk.transform(diagnostics_fn))
    return Model(
        init=init_t.init, train=train_t.apply, evaluate=eval_t.apply, diagnostics=diag_t.apply
    )


def make_loss_fn(model: Model, *, gamma: float = 0.0, adaptive: bool = False):
    """``loss_fn(params, batch, key, reg_state, step)`` for :func:`deqjax.training.fit`.

    ``gamma`` is used when ``adaptive`` is False; otherwise ``reg_state.gamma``
    (``dq.regularization.AdaptiveGammaState``).
    """

    def loss_fn(params, batch, key, reg_state, step):
        g = reg_state.gamma if adaptive else jnp.asarray(gamma, jnp.float32)
        return model.train(params, batch["image"], batch["label"], key, g, step)

    return loss_fn


def make_eval_fn(model: Model):
    """``eval_fn(params, batch) -> {name: per-example [B]}`` for :func:`deqjax.training.fit`."""
    return lambda params, batch: model.evaluate(params, batch["image"], batch["label"])


def make_diagnostics_fn(model: Model):
    """``diagnostics_fn(params, batch, key, reg_state)`` for :func:`deqjax.training.fit`."""
    return lambda params, batch, key, reg_state: model.diagnostics(
        params, batch["image"], batch["label"], key
    )


def init_params(model: Model, seed: int, example_images: np.ndarray):
    """Parameters from ``model.init`` (eagerly: no compilation for a one-off call)."""
    return model.init(jax.random.PRNGKey(seed), jnp.asarray(example_images[:1], jnp.float32))


def make_jr(args) -> tuple[dqreg.JacobianRegularizer | None, dqreg.AdaptiveGamma | None]:
    """The regulariser and (with ``--adaptive_gamma``) the γ controller from the flags."""
    if not args.jr:
        return None, None
    reg = dqreg.JacobianRegularizer(args.gamma, p=args.jr_p, num_samples=args.jr_samples)
    ctrl = None
    if args.adaptive_gamma:
        ctrl = dqreg.AdaptiveGamma(
            init_gamma=args.gamma,
            target=args.gamma_target if args.gamma_target else args.tol,
            min_gamma=min(args.gamma_min, args.gamma),
            max_gamma=max(args.gamma_max, args.gamma),
        )
    return reg, ctrl


def model_config(args) -> ModelConfig:
    return ModelConfig(
        width=args.width,
        hidden=args.hidden or None,
        cell_form=args.cell_form,
        max_steps=args.max_steps,
        tol=args.tol,
        anderson_m=args.anderson_m,
        stop_mode=args.stop_mode,
        bwd_max_steps=args.bwd_max_steps,
        bwd_tol=args.bwd_tol,
        diag_power_steps=args.diag_power_steps,
    )


def make_schedule_and_optimizer(args, num_steps: int):
    schedule = training.make_schedule(
        learning_rate=args.lr,
        schedule=args.schedule,
        warmup_steps=min(args.warmup_steps, max(num_steps - 1, 0)),
        total_steps=num_steps if args.schedule != "constant" else None,
    )
    opt = training.make_optimizer(
        learning_rate=schedule, clip_norm=args.clip_norm if args.clip_norm > 0 else None
    )
    return schedule, opt


# --------------------------------------------------------------------------------------------------
# The main job
# --------------------------------------------------------------------------------------------------


def _write_json(path: str, obj: Mapping[str, Any]) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(training.to_python(dict(obj)), f, indent=2, sort_keys=True)
    os.replace(tmp, path)


def train(args, train_set: dict, test_set: dict, source: str) -> dict:
    """One training run (the main job); returns the summary written to ``results.json``."""
    t_start = time.perf_counter()
    cfg = model_config(args)
    reg, ctrl = make_jr(args)
    model = build_model(cfg, w_init=make_w_init(args.init, args.init_scale), regularizer=reg)
    it = data.ShuffledBatches(train_set, batch_size=args.batch_size, seed=args.seed)
    num_steps = args.steps if args.steps else args.epochs * it.steps_per_epoch
    schedule, opt = make_schedule_and_optimizer(args, num_steps)
    reg_state, update = (), None
    if ctrl is not None:
        reg_state = ctrl.init()
        update = lambda rs, m, step: ctrl.update(rs, m["rel_residual"])  # noqa: E731
    config = vars(args) | {"data_source": source, "num_steps": num_steps}
    is_main = jax.process_index() == 0
    out_dir = args.out_dir
    if is_main:
        print(
            f"data: {source}; train {train_set['label'].shape[0]}, test "
            f"{test_set['label'].shape[0]}; {num_steps} steps of batch {args.batch_size} on "
            f"{jax.device_count()} device(s)"
        )

    def print_fn(line: str) -> None:
        tqdm.tqdm.write(line)  # keeps the progress bar intact

    result = training.fit(
        params=init_params(model, args.seed, train_set["image"]),
        loss_fn=make_loss_fn(model, gamma=args.gamma, adaptive=ctrl is not None),
        optimizer=opt,
        train_data=it,
        num_steps=num_steps,
        rng=jax.random.PRNGKey(args.seed),
        reg_state=reg_state,
        update_reg_state=update,
        learning_rate_fn=schedule,
        per_device_rng=False,  # the JR gate is one coin for the whole global batch
        eval_fn=make_eval_fn(model),
        eval_data=test_set,
        eval_batch_size=args.eval_batch_size,
        eval_every=args.eval_every or None,
        diagnostics_fn=make_diagnostics_fn(model) if args.diagnostics_every else None,
        diagnostics_every=args.diagnostics_every or None,
        log_every=args.log_every,
        checkpoint_dir=os.path.abspath(os.path.join(out_dir, "ckpt")),
        checkpoint_every=args.checkpoint_every or None,
        keep_checkpoints=args.keep_checkpoints,
        resume=args.resume,
        overwrite=args.overwrite,
        max_nonfinite_steps=args.max_nonfinite_steps,
        metrics_path=os.path.join(out_dir, "metrics.jsonl"),
        config=config,
        progress=args.progress,
        desc="fashion_mnist" if args.dataset == "fashion_mnist" else args.dataset,
        print_fn=print_fn,
    )
    wall = time.perf_counter() - t_start
    evals = [r for r in result.history if r["split"] == "eval"]
    final = evals[-1] if evals else {}
    summary = {
        "data_source": source,
        "num_steps": num_steps,
        "final_step": int(result.state.step),
        "interrupted": result.interrupted,
        "restored_step": result.restored_step,
        "test": final,
        "wall_seconds": wall,
    }
    if is_main:
        records = training.read_jsonl(os.path.join(out_dir, "metrics.jsonl"))
        png = os.path.join(out_dir, "curves.png")
        names = plot_metrics.plot(
            records, png, metrics=CURVE_METRICS, title=f"DEQ on {args.dataset} ({source})"
        )
        summary["curves_png"] = png
        summary["curves"] = names
        _write_json(os.path.join(out_dir, "results.json"), summary)
        fmt = training.format_value
        nan = float("nan")
        if result.interrupted:
            print(
                f"interrupted by SIGTERM at step {summary['final_step']} of {num_steps}: "
                f"checkpoint saved; continue with --resume. Outputs so far in {out_dir}"
            )
        elif final:
            print(
                f"final test accuracy {fmt(final.get('accuracy', nan), '.4f')}, "
                f"NFE {fmt(final.get('nfe', nan), '.2f')}, rel residual "
                f"{fmt(final.get('rel_residual', nan), '.2e')} (max "
                f"{fmt(final.get('rel_residual_max', nan), '.2e')}); wall {wall:.1f} s; "
                f"outputs in {out_dir}"
            )
    return summary


# --------------------------------------------------------------------------------------------------
# The init sweep (init paper Fig. 5)
# --------------------------------------------------------------------------------------------------


def _floats(text: str) -> list[float]:
    return [float(v) for v in text.split(",") if v.strip()]


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v.strip()]


def sweep(args, train_set: dict, test_set: dict, source: str) -> dict:
    """Test error vs init scale for each family and seed (no JR unless ``--jr``).

    One train step, one eval step compiled once and reused for every run (only the initial
    parameters differ). A run whose training loss turns non-finite stops early and is evaluated as
    it stands (non-finite logits count as wrong: error near 0.9).
    """
    families = [f.strip() for f in args.sweep_families.split(",") if f.strip()]
    for fam in families:
        if fam not in FAMILIES:
            raise ValueError(f"--sweep_families: unknown family {fam!r} (use {sorted(FAMILIES)}).")
    scales, seeds = _floats(args.sweep_scales), _ints(args.sweep_seeds)
    cfg = model_config(args)
    reg, ctrl = make_jr(args)
    if ctrl is not None:
        raise ValueError("--adaptive_gamma is not supported with --sweep.")
    apply_model = build_model(cfg, regularizer=reg)
    devices = jax.local_devices()
    it0 = data.ShuffledBatches(train_set, batch_size=args.batch_size, seed=0)
    num_steps = args.steps if args.steps else args.epochs * it0.steps_per_epoch
    schedule, opt = make_schedule_and_optimizer(args, num_steps)
    step_fn = training.make_train_step(
        make_loss_fn(apply_model, gamma=args.gamma),
        opt,
        per_device_rng=False,
        devices=devices,
    )
    eval_step = training.make_eval_step(make_eval_fn(apply_model), devices=devices)
    rows: list[dict] = []
    runs = [(f, s, seed) for f in families for s in scales for seed in seeds]
    bar = training.progress_bar(total=len(runs), enabled=args.progress, desc="sweep")
    t_sweep = time.perf_counter()
    for family, scale, seed in runs:
        t0 = time.perf_counter()
        init_model = build_model(cfg, w_init=make_w_init(family, scale))
        params = init_params(init_model, seed, train_set["image"])
        state = training.replicate(
            training.create_train_state(params, opt, jax.random.PRNGKey(seed)), devices
        )
        it = data.ShuffledBatches(train_set, batch_size=args.batch_size, seed=seed)
        diverged, losses = False, []
        for step in range(num_steps):
            state, metrics = step_fn(state, training.shard(next(it), devices))
            if (step + 1) % args.log_every == 0 or step + 1 == num_steps:
                m = training.unreplicate(metrics)
                loss = float(m["loss"])
                losses.append(loss)
                if not math.isfinite(loss):
                    diverged = True
                    break
        last = {k: float(v) for k, v in training.unreplicate(metrics).items()}
        ev = training.evaluate(
            eval_step,
            state.params,
            data.eval_batches(test_set, batch_size=args.eval_batch_size),
            devices=devices,
        )
        acc = ev["accuracy"] if math.isfinite(ev["accuracy"]) else 0.0
        row = {
            "family": family,
            "scale": scale,
            "seed": seed,
            "test_error": 1.0 - acc,
            "test_nfe": ev["nfe"],
            "test_rel_residual": ev["rel_residual"],
            "test_converged": ev["converged"],
            "train_loss_last": last["loss"],
            "train_nfe_last": last["nfe"],
            "train_rel_residual_last": last["rel_residual"],
            "diverged": diverged,
            "steps_run": step + 1,
            "seconds": time.perf_counter() - t0,
        }
        rows.append(row)
        bar.update(1)
        bar.set_postfix_str(f"{family} {scale:g} s{seed}: err {row['test_error']:.3f}")
        if not args.progress:
            print(
                f"{family:>10} scale {scale:<5g} seed {seed}: test error {row['test_error']:.4f} "
                f"NFE {row['test_nfe']:.1f} rel res {row['test_rel_residual']:.1e}"
                + (" DIVERGED" if diverged else ""),
                flush=True,
            )
    bar.close()
    summary_rows = []
    for family in families:
        for scale in scales:
            errs = np.array(
                [r["test_error"] for r in rows if r["family"] == family and r["scale"] == scale]
            )
            nfes = [r["test_nfe"] for r in rows if r["family"] == family and r["scale"] == scale]
            summary_rows.append(
                {
                    "family": family,
                    "scale": scale,
                    "n": int(errs.size),
                    "median_error": float(np.median(errs)),
                    "mean_error": float(np.mean(errs)),
                    "min_error": float(np.min(errs)),
                    "max_error": float(np.max(errs)),
                    "mean_test_nfe": float(np.mean(nfes)),
                }
            )
    out_dir = args.out_dir
    _write_csv(os.path.join(out_dir, "sweep.csv"), rows)
    _write_csv(os.path.join(out_dir, "sweep_summary.csv"), summary_rows)
    png = os.path.join(out_dir, "sweep.png")
    plot_sweep(summary_rows, png, title=f"{source}: {num_steps} steps, {len(seeds)} seed(s)")
    result = {
        "data_source": source,
        "num_steps": num_steps,
        "runs": rows,
        "summary": summary_rows,
        "wall_seconds": time.perf_counter() - t_sweep,
        "png": png,
    }
    _write_json(os.path.join(out_dir, "sweep.json"), result)
    print(_summary_table(summary_rows))
    print(f"sweep: {len(rows)} runs in {result['wall_seconds']:.1f} s; outputs in {out_dir}")
    return result


def _write_csv(path: str, rows: Sequence[Mapping[str, Any]]) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def _summary_table(summary_rows: Sequence[Mapping[str, Any]]) -> str:
    lines = [
        "| family | scale | median error | mean error | min | max | test NFE |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in summary_rows:
        lines.append(
            f"| {r['family']} | {r['scale']:g} | {r['median_error']:.4f} | {r['mean_error']:.4f} "
            f"| {r['min_error']:.4f} | {r['max_error']:.4f} | {r['mean_test_nfe']:.1f} |"
        )
    return "\n".join(lines)


def plot_sweep(summary_rows: Sequence[Mapping[str, Any]], path: str, *, title: str = "") -> None:
    """Median (solid) and mean (dashed) test error vs init scale, one colour per family."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    families = list(dict.fromkeys(r["family"] for r in summary_rows))
    for i, family in enumerate(families):
        rs = sorted((r for r in summary_rows if r["family"] == family), key=lambda r: r["scale"])
        scales = [r["scale"] for r in rs]
        color = f"C{i}"
        ax.plot(
            scales, [r["median_error"] for r in rs], "-o", color=color, label=f"{family} median"
        )
        ax.plot(scales, [r["mean_error"] for r in rs], "--", color=color, label=f"{family} mean")
    if all(r["scale"] > 0 for r in summary_rows):
        ax.set_xscale("log", base=2)
    ax.set_xlabel("initialisation scale σ")
    ax.set_ylabel("test error")
    ax.set_yscale("log")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    if title:
        ax.set_title(title, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --------------------------------------------------------------------------------------------------
# Flags
# --------------------------------------------------------------------------------------------------

# --sweep and --smoke change defaults only; flags given explicitly win.
SWEEP_DEFAULTS = {
    "out_dir": "runs/fashion_mnist_sweep",
    "jr": False,
    "train_size": 20000,
    "test_size": 5000,
    "epochs": 2,
    "log_every": 20,
}
SMOKE_DEFAULTS = {
    "width": 32,
    "max_steps": 8,
    "bwd_max_steps": 8,
    "diag_power_steps": 5,
    "batch_size": 32,
    "eval_batch_size": 128,
    "steps": 40,
    "lr": 1e-2,
    "warmup_steps": 0,
    "train_size": 640,
    "test_size": 128,
    "log_every": 10,
    "diagnostics_every": 20,
    "checkpoint_every": 20,
    "sweep_scales": "0.5,1.5",
    "sweep_seeds": "0",
    "sweep_families": "gaussian,orthogonal",
}


def build_parser() -> argparse.ArgumentParser:
    pos_int, nonneg_int = training.positive_int, training.nonnegative_int
    pos_float, nonneg_float = training.positive_float, training.nonnegative_float
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    g = p.add_argument_group("data")
    g.add_argument(
        "--dataset",
        default="fashion_mnist",
        choices=("fashion_mnist", "digits"),
        help="Fashion-MNIST idx files, or scikit-learn's 8x8 digits (bundled; for tests)",
    )
    g.add_argument(
        "--data_dir",
        default=None,
        help=f"Fashion-MNIST idx folder (default {data.DEFAULT_FASHION_MNIST_DIR});\n"
        "only with --dataset fashion_mnist",
    )
    g.add_argument("--train_size", type=nonneg_int, default=0, help="training subset (0: all)")
    g.add_argument("--test_size", type=nonneg_int, default=0, help="random test subset (0: all)")
    g = p.add_argument_group("model")
    g.add_argument("--width", type=pos_int, default=128, help="DEQ state size D")
    g.add_argument("--hidden", type=nonneg_int, default=0, help="cell hidden size (0: = width)")
    g.add_argument(
        "--cell_form",
        default="resnet",
        choices=("resnet", "single"),
        help="resnet: the init paper's section 4.1 cell; single: phi(W z + U x)",
    )
    g.add_argument(
        "--init",
        default="orthogonal",
        choices=sorted(FAMILIES),
        help="random-matrix family of the recurrent weights",
    )
    g.add_argument(
        "--init_scale", type=nonneg_float, default=1.0, help="scale sigma of the recurrent weights"
    )
    g = p.add_argument_group("solvers")
    g.add_argument("--max_steps", type=pos_int, default=20, help="forward Anderson steps")
    g.add_argument("--tol", type=pos_float, default=1e-3, help="forward tolerance")
    g.add_argument("--anderson_m", type=pos_int, default=5, help="Anderson memory (past iterates)")
    g.add_argument(
        "--stop_mode",
        default="rel",
        choices=("rel", "abs"),
        help="stop on the relative or the absolute residual",
    )
    g.add_argument("--bwd_max_steps", type=pos_int, default=20, help="backward Anderson steps")
    g.add_argument("--bwd_tol", type=pos_float, default=1e-3, help="backward (implicit) tolerance")
    g = p.add_argument_group("Jacobian regularisation (JR paper Eq. 4)")
    g.add_argument("--jr", dest="jr", action="store_true", default=True, help="on (default)")
    g.add_argument("--no_jr", dest="jr", action="store_false", help="no Jacobian regularisation")
    g.add_argument("--gamma", type=nonneg_float, default=1.0, help="JR strength gamma")
    g.add_argument("--jr_p", type=float, default=0.5, help="Bernoulli gate probability p")
    g.add_argument("--jr_samples", type=pos_int, default=1, help="Hutchinson probes M")
    g.add_argument("--adaptive_gamma", action="store_true", help="adapt gamma to the residual")
    g.add_argument(
        "--gamma_target", type=nonneg_float, default=0.0, help="target residual (0: --tol)"
    )
    g.add_argument("--gamma_min", type=nonneg_float, default=1e-2, help="adaptive gamma floor")
    g.add_argument("--gamma_max", type=nonneg_float, default=20.0, help="adaptive gamma ceiling")
    g = p.add_argument_group("optimisation")
    g.add_argument("--seed", type=int, default=0, help="seed of init, data subset and order")
    g.add_argument("--epochs", type=pos_int, default=4, help="passes over the training set")
    g.add_argument(
        "--steps", type=nonneg_int, default=0, help="total steps (0: epochs x steps/epoch)"
    )
    g.add_argument("--batch_size", type=pos_int, default=128, help="global batch size")
    g.add_argument("--eval_batch_size", type=pos_int, default=1000, help="evaluation batch size")
    g.add_argument("--lr", type=pos_float, default=2e-3, help="peak Adam learning rate")
    g.add_argument(
        "--schedule",
        default="cosine",
        choices=("constant", "cosine", "linear"),
        help="learning-rate decay after the warmup",
    )
    g.add_argument(
        "--warmup_steps", type=nonneg_int, default=100, help="linear warmup steps from 0"
    )
    g.add_argument(
        "--clip_norm", type=nonneg_float, default=1.0, help="global-norm gradient clipping (0: off)"
    )
    g.add_argument(
        "--max_nonfinite_steps",
        type=pos_int,
        default=10,
        help="non-finite loss/gradient updates are skipped (counted as skipped_updates);\n"
        "stop with an error after this many in a row",
    )
    g = p.add_argument_group("logging and checkpoints")
    g.add_argument(
        "--out_dir",
        default="runs/fashion_mnist",
        help="output folder (--smoke: runs/fashion_mnist_smoke, --sweep: _sweep)",
    )
    g.add_argument("--log_every", type=pos_int, default=50, help="steps between metric records")
    g.add_argument("--eval_every", type=nonneg_int, default=0, help="0: at each epoch end")
    g.add_argument(
        "--diagnostics_every",
        type=nonneg_int,
        default=200,
        help="steps between backward/Jacobian diagnostics (0 disables)",
    )
    g.add_argument(
        "--diag_power_steps", type=pos_int, default=30, help="power iterations of rho(J)"
    )
    g.add_argument("--checkpoint_every", type=nonneg_int, default=500, help="0: only at the end")
    g.add_argument(
        "--keep_checkpoints", type=pos_int, default=3, help="newest checkpoints kept on disk"
    )
    g.add_argument("--no_progress", dest="progress", action="store_false", help="no progress bar")
    training.add_run_flags(p)
    g = p.add_argument_group("modes")
    g.add_argument(
        "--smoke",
        action="store_true",
        help="tiny run for tests (1-3 minutes on 2 CPU cores with --dataset digits)",
    )
    g.add_argument("--sweep", action="store_true", help="init paper Fig. 5 sweep")
    g.add_argument(
        "--sweep_families",
        default="gaussian,orthogonal,goe",
        help="comma-separated init families of the sweep",
    )
    g.add_argument("--sweep_scales", default="0.25,0.5,1,2,4,8", help="comma-separated init scales")
    g.add_argument("--sweep_seeds", default="0,1,2", help="comma-separated seeds per point")
    training.add_distributed_flags(p)
    return p


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = build_parser()
    known, _ = p.parse_known_args(argv)
    defaults: dict[str, Any] = {}
    if known.sweep:
        defaults.update(SWEEP_DEFAULTS)
    if known.smoke:
        defaults.update(SMOKE_DEFAULTS)
        if known.sweep:
            defaults["out_dir"] = "runs/fashion_mnist_sweep_smoke"
        else:
            defaults["out_dir"] = "runs/fashion_mnist_smoke"
    p.set_defaults(**defaults)
    return p.parse_args(argv)


# Flags a resumed run can absorb (accepted with --resume --force); any other change is refused.
SAFE_ON_RESUME = (
    "epochs",
    "steps",
    "log_every",
    "eval_every",
    "eval_batch_size",
    "diagnostics_every",
    "diag_power_steps",
    "checkpoint_every",
    "keep_checkpoints",
    "max_nonfinite_steps",
    "devices",
)
OUTPUTS = ("curves.png", "sweep.csv", "sweep_summary.csv", "sweep.png", "sweep.json")


def _fail(message: str, code: int) -> None:
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(code)


def main(argv: Sequence[str] | None = None) -> dict:
    """Runs the main job (or the sweep); exits 2 on a usage error, 3 on a failed run.

    Exit statuses: 0 done; 2 bad flags, missing or unreadable data, an ``--out_dir`` that holds
    another run or a ``--resume`` that cannot continue (nothing in the folder is changed then);
    3 training stopped on non-finite values or a checkpoint failed to write; 143 SIGTERM (a
    checkpoint was saved: ``--resume`` continues).
    """
    parser = build_parser()
    args = parse_args(argv)
    if args.dataset == "digits" and args.data_dir is not None:
        parser.error("--data_dir is only read with --dataset fashion_mnist (digits are bundled).")
    if args.sweep and args.resume:
        parser.error("--resume is not supported with --sweep.")
    training.initialize_distributed(args.coordinator_address, args.num_processes, args.process_id)
    try:
        train_set, test_set, source = load_data(
            args.dataset,
            data_dir=args.data_dir,
            train_size=args.train_size,
            test_size=args.test_size,
            seed=args.seed,
        )
    except (data.DataNotFoundError, data.DataFormatError) as e:
        _fail(str(e), 2)
    config = vars(args) | {"data_source": source, "devices": jax.device_count()}
    is_main = jax.process_index() == 0
    try:
        training.prepare_run_dir(
            args.out_dir,
            config,
            resume=args.resume,
            overwrite=args.overwrite,
            force=args.force,
            safe_keys=SAFE_ON_RESUME,
            outputs=OUTPUTS,
            config_name="sweep_config.json" if args.sweep else "config.json",
        )
    except training.RunDirError as e:
        _fail(str(e), 2)
    if is_main:
        print("config:", json.dumps(training.to_python(config), sort_keys=True))
    if args.sweep:
        return sweep(args, train_set, test_set, source)
    try:
        summary = train(args, train_set, test_set, source)
    except (training.RestoreError, FileExistsError) as e:
        _fail(str(e), 2)
    except (training.NonFiniteError, training.CheckpointError) as e:
        _fail(str(e), 3)
    if summary["interrupted"]:
        sys.exit(143)
    return summary


if __name__ == "__main__":
    main()
