"""``--dtype``: the model computes in bfloat16 or float16 with float32 parameters (a jmp policy),
the solvers keep float32 bookkeeping, a tolerance flag not given takes one the dtype resolves,
and a tolerance given that the dtype cannot resolve is refused."""

from __future__ import annotations

import dataclasses
import functools
import json

import jax
import jax.numpy as jnp
import jmp
import numpy as np
import pytest

import deqjax as dq
from deqjax import harness


def test_a_tolerance_the_dtype_cannot_resolve_is_refused_naming_both():
    bf16 = harness.DtypeConfig("bfloat16")
    message = bf16.check_tol(tol=1e-3, bwd_tol=1e-2)
    assert "--tol 0.001" in message and "--dtype bfloat16" in message
    assert "7.8e-03" in message and "--tol 0.01" in message  # eps, and what would do
    assert bf16.check_tol(tol=1e-2, bwd_tol=1e-2) is None
    assert "--bwd_tol 0.0001" in harness.DtypeConfig("float16").check_tol(tol=1e-3, bwd_tol=1e-4)
    assert harness.DtypeConfig().check_tol(tol=1e-6) is None


@dataclasses.dataclass(frozen=True)
class DtypeToy:
    """An experiment with a solver and a compute dtype."""

    solver: harness.SolverConfig = harness.SolverConfig()
    compute: harness.DtypeConfig = harness.DtypeConfig()
    run: harness.RunConfig = harness.RunConfig()


TOY = harness.Experiment(
    name="dtype_toy",
    doc="A toy experiment.",
    config=DtypeToy(),
    setup=lambda c: ((), {}),
    run=lambda c, inputs, ctx: {"tol": c.solver.tol, "bwd_tol": c.solver.bwd_tol},
    check=lambda c: c.compute.check_tol(tol=c.solver.tol, bwd_tol=c.solver.bwd_tol),
)


def _picked_lines(out: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith("--dtype")]


def test_a_dtype_alone_picks_tolerances_it_resolves_says_so_and_records_them(tmp_path, capsys):
    out = tmp_path / "bf16"
    assert harness.run(TOY, ["--dtype", "bfloat16", "--out_dir", str(out)]) == {
        "tol": 0.01,
        "bwd_tol": 0.01,
    }
    config = json.loads((out / "config.json").read_text())
    assert (config["dtype"], config["tol"], config["bwd_tol"]) == ("bfloat16", 0.01, 0.01)
    assert _picked_lines(capsys.readouterr().out) == [
        "--dtype bfloat16 picks --tol 0.01 (default 0.001) and --bwd_tol 0.01 (default 0.001), "
        "above its machine epsilon 7.8e-03"
    ]
    # A tolerance given is kept (the others picked); the note names only the picked ones.
    out = tmp_path / "given"
    argv = ["--dtype", "bfloat16", "--tol", "0.05", "--out_dir", str(out)]
    assert harness.run(TOY, argv) == {"tol": 0.05, "bwd_tol": 0.01}
    assert _picked_lines(capsys.readouterr().out) == [
        "--dtype bfloat16 picks --bwd_tol 0.01 (default 0.001), above its machine epsilon 7.8e-03"
    ]
    argv = ["--dtype", "bfloat16", "--tol", "0.01", "--bwd_tol", "0.02", "--out_dir"]
    assert harness.run(TOY, [*argv, str(tmp_path / "both")]) == {"tol": 0.01, "bwd_tol": 0.02}
    assert _picked_lines(capsys.readouterr().out) == []
    # float16 resolves the defaults (eps 9.8e-4 < 1e-3), float32 too: nothing picked, no note.
    for dtype in ("float16", "float32"):
        argv = ["--dtype", dtype, "--out_dir", str(tmp_path / dtype)]
        assert harness.run(TOY, argv) == {"tol": 1e-3, "bwd_tol": 1e-3}
        assert _picked_lines(capsys.readouterr().out) == []


def test_a_tolerance_given_below_what_the_dtype_resolves_is_still_refused(tmp_path, capsys):
    out = tmp_path / "o"
    for argv in (["--tol", "1e-3"], ["--bwd_tol", "0.005", "--tol", "0.01"]):
        with pytest.raises(SystemExit) as stop:
            harness.run(TOY, ["--dtype", "bfloat16", *argv, "--out_dir", str(out)])
        assert stop.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "below what --dtype bfloat16 resolves" in err[0]
        assert f"--{argv[0][2:]} {float(argv[1]):g}" in err[0]
        assert not out.exists()


def test_policy_and_loss_scale():
    policy = harness.DtypeConfig("bfloat16").policy()
    assert policy.param_dtype == jnp.float32 and policy.output_dtype == jnp.float32
    assert policy.compute_dtype == jnp.bfloat16
    assert isinstance(harness.DtypeConfig("bfloat16").loss_scale(), jmp.NoOpLossScale)
    scale = harness.DtypeConfig("float16").loss_scale()
    assert isinstance(scale, jmp.StaticLossScale) and float(scale.loss_scale) == 2.0**10


def _classifier(dtype):
    """The main job's classifier (``dq.models.classifier_fns`` of an ``MLPClassifier``) with every
    function under ``dtype``'s policy."""
    solver = harness.SolverConfig(max_steps=6, tol=1e-2, bwd_max_steps=6, bwd_tol=1e-2)
    forward, adjoint = solver.solver_and_adjoint()
    model = functools.partial(dq.models.MLPClassifier, 16, solver=forward, adjoint=adjoint)
    fns = dq.models.classifier_fns(model, backward_solver=solver.backward(), diag_power_steps=3)
    return harness.DtypeConfig(dtype).apply_each(dq.models.MLPClassifier, fns)


HALF = ["bfloat16", pytest.param("float16", marks=pytest.mark.slow)]  # float16: the slow lane


@pytest.mark.parametrize("dtype", HALF)
def test_the_classifier_computes_in_the_dtype_with_float32_parameters(dtype):
    fns = _classifier(dtype)
    images = jnp.asarray(np.random.default_rng(0).uniform(size=(8, 4, 4)), jnp.float32)
    labels = jnp.arange(8, dtype=jnp.int32) % 3
    params = fns.init(jax.random.PRNGKey(0), images)
    assert {a.dtype for a in jax.tree_util.tree_leaves(params)} == {jnp.dtype(jnp.float32)}

    def loss(p):
        return fns.loss(p, images, labels, jax.random.PRNGKey(1), jnp.float32(0.0), 0)

    with jax.numpy_dtype_promotion("standard"), jax.numpy_rank_promotion("allow"):
        text = jax.jit(jax.grad(loss, has_aux=True)).lower(params).as_text()
        grads, metrics = jax.jit(jax.grad(loss, has_aux=True))(params)
    half = {"bfloat16": "bf16", "float16": "f16"}[dtype]
    # The DEQ's cell (its 16x16 recurrent products), forward and backward, in the dtype.
    cell_dots = [line for line in text.splitlines() if "dot_general" in line and "16x16x" in line]
    assert cell_dots and all(f"16x16x{half}>" in line for line in cell_dots)
    assert {g.dtype for g in jax.tree_util.tree_leaves(grads)} == {jnp.dtype(jnp.float32)}
    assert all(np.isfinite(g).all() for g in jax.tree_util.tree_leaves(grads))
    assert metrics["rel_residual"].dtype == jnp.float32  # bookkeeping in float32


def test_float32_is_unchanged():
    fn = lambda x: x  # noqa: E731
    assert harness.DtypeConfig().apply(dq.models.MLPClassifier, fn) is fn


@pytest.mark.parametrize("dtype", HALF)
def test_the_sequence_model_keeps_float32_parameters(dtype):
    """Every parameter float32 under the policy, the weight-normalised ones too (their norm is
    computed in the compute dtype; float16 parameters would break the float16 loss scale)."""
    config = harness.SequenceModelConfig(d_model=16, num_heads=2, max_steps=3, tol=1e-2)
    model = config.transform(50, "deq", compute=harness.DtypeConfig(dtype))
    tokens = jnp.zeros((2, 8), jnp.int32)
    params = model.init(jax.random.PRNGKey(0), tokens, None, True)
    assert {a.dtype for a in jax.tree_util.tree_leaves(params)} == {jnp.dtype(jnp.float32)}
    logits, aux = model.apply(params, None, tokens, None, False)
    assert logits.dtype == jnp.float32 and np.isfinite(np.asarray(logits)).all()
