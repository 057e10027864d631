"""The experiment runner: flags, config and results files, exit codes (moves with the runner to
the harness)."""

import dataclasses
import json
import os

import pytest

from deqjax import training


@dataclasses.dataclass(frozen=True)
class _Solver:
    max_steps: int = 20
    tol: float = 1e-3


def _add_flags(p):
    p.add_argument("--steps", type=training.positive_int, default=10)
    p.add_argument("--sweep", action="store_true")


def _setup(args):
    if args.steps == 7:
        raise training.UsageError("--steps: 7 is unlucky")
    return {"n": args.steps}, {"solver": _Solver(tol=0.5)}


def _run_task(args, inputs, ctx):
    if args.steps == 13:
        raise training.NonFiniteError("diverged")
    return {"n": inputs["n"], "mode": ctx.mode, "out": ctx.out_dir, "interrupted": args.steps == 9}


TOY = training.Experiment(
    name="toy",
    doc="A toy experiment.",
    add_flags=_add_flags,
    setup=_setup,
    run=_run_task,
    smoke={"steps": 2},
    modes={"sweep": {"steps": 3}},
    safe_on_resume=("steps",),
)


def _exit(argv):
    with pytest.raises(SystemExit) as e:
        training.run(TOY, argv)
    return e.value.code


def test_runner_flags_config_results_and_exit_codes(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = training.run(TOY, ["--smoke"])  # smoke default out_dir and steps
    assert res["n"] == 2 and res["out"] == "runs/toy_smoke"
    config = json.load(open("runs/toy_smoke/config.json"))
    assert config["solver"] == {"type": "_Solver", "max_steps": 20, "tol": 0.5}
    assert config["seed"] == 0 and config["smoke"] is True
    assert json.load(open("runs/toy_smoke/results.json"))["n"] == 2
    res = training.run(TOY, ["--sweep", "--smoke", "--steps", "5"])  # explicit flags win
    assert res["n"] == 5 and res["mode"] == "sweep"
    assert os.path.exists("runs/toy_sweep_smoke/sweep_config.json")
    assert os.path.exists("runs/toy_sweep_smoke/sweep.json")
    assert _exit(["--smoke"]) == 2  # the folder holds a run
    assert "holds an earlier run" in capsys.readouterr().err
    assert _exit(["--smoke", "--resume", "--steps", "4"]) == 2  # a safe change needs --force
    assert training.run(TOY, ["--smoke", "--resume", "--force", "--steps", "4"])["n"] == 4
    assert _exit(["--steps", "7", "--out_dir", "a"]) == 2
    assert "unlucky" in capsys.readouterr().err and not os.path.exists("a")
    assert _exit(["--steps", "13", "--out_dir", "b"]) == 3
    assert _exit(["--steps", "9", "--out_dir", "c"]) == 143
    assert _exit(["--steps", "0"]) == 2
    assert "--steps" in capsys.readouterr().err
