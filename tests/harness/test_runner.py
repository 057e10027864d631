"""The runner: flags, ``config.json`` (solver objects field by field), results and exit codes."""

from __future__ import annotations

import dataclasses
import json
import os

import pytest

from deqjax import harness, solvers, training


@dataclasses.dataclass(frozen=True)
class ToyConfig:
    """A toy experiment's configuration."""

    steps: harness.PositiveInt = 10  # steps to take
    sweep: harness.Switch = False  # the sweep mode
    run: harness.ResumableRunConfig = harness.ResumableRunConfig()


def _setup(c: ToyConfig):
    if c.steps == 7:
        raise harness.UsageError("--steps: 7 is unlucky")
    return {"n": c.steps}, {"solver": solvers.Anderson(max_steps=20, tol=0.5)}


def _run_task(c: ToyConfig, inputs, ctx):
    if c.steps == 13:
        raise training.NonFiniteError("diverged")
    return {"n": inputs["n"], "mode": ctx.mode, "out": ctx.out_dir, "interrupted": c.steps == 9}


TOY = harness.Experiment(
    name="toy",
    doc="A toy experiment.",
    config=ToyConfig(),
    setup=_setup,
    run=_run_task,
    smoke={"steps": 2},
    modes={"sweep": {"steps": 3}},
    safe_on_resume=("steps",),
)


def _exit(argv):
    with pytest.raises(SystemExit) as e:
        harness.run(TOY, argv)
    return e.value.code


def test_runner_flags_config_results_and_exit_codes(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = harness.run(TOY, ["--smoke"])  # smoke default out_dir and steps
    assert res["n"] == 2 and res["out"] == "runs/toy_smoke"
    config = json.load(open("runs/toy_smoke/config.json"))
    assert config["solver"] == {**config["solver"], "type": "Anderson", "max_steps": 20, "tol": 0.5}
    assert config["seed"] == 0 and config["smoke"] is True
    assert json.load(open("runs/toy_smoke/results.json"))["n"] == 2
    res = harness.run(TOY, ["--sweep", "--smoke", "--steps", "5"])  # explicit flags win
    assert res["n"] == 5 and res["mode"] == "sweep"
    assert os.path.exists("runs/toy_sweep_smoke/sweep_config.json")
    assert os.path.exists("runs/toy_sweep_smoke/sweep.json")
    assert _exit(["--smoke"]) == 2  # the folder holds a run
    assert "holds an earlier run" in capsys.readouterr().err
    assert _exit(["--smoke", "--resume", "--steps", "4"]) == 2  # a safe change needs --force
    assert harness.run(TOY, ["--smoke", "--resume", "--force", "--steps", "4"])["n"] == 4
    assert _exit(["--steps", "7", "--out_dir", "a"]) == 2
    assert "unlucky" in capsys.readouterr().err and not os.path.exists("a")
    assert _exit(["--steps", "13", "--out_dir", "b"]) == 3
    assert _exit(["--steps", "9", "--out_dir", "c"]) == 143
    assert "interrupted by SIGTERM" in capsys.readouterr().out
    assert _exit(["--steps", "0"]) == 2
    assert "--steps" in capsys.readouterr().err


def test_resume_refuses_changed_flags_and_accepts_safe_ones_with_force(tmp_path, capsys):
    out = str(tmp_path / "run")
    harness.run(TOY, ["--out_dir", out])
    saved = json.load(open(os.path.join(out, "config.json")))
    assert _exit(["--out_dir", out, "--resume", "--seed", "3"]) == 2
    err = capsys.readouterr().err
    assert "--seed: 0 in config.json, now 3" in err and "cannot change on resume" in err
    assert _exit(["--out_dir", out, "--resume", "--force", "--seed", "3"]) == 2
    assert json.load(open(os.path.join(out, "config.json"))) == saved  # nothing rewritten
    assert harness.run(TOY, ["--out_dir", out, "--resume", "--no_progress"])["n"] == 10


def test_config_json_round_trips_every_setting_and_solver_object(tmp_path):
    out = tmp_path / "run"
    harness.run(TOY, ["--out_dir", str(out), "--steps", "6", "--quiet"])
    config = json.loads((out / "config.json").read_text())
    assert config == json.loads(json.dumps(harness.to_python(config)))
    assert {k: config[k] for k in ("steps", "sweep", "seed", "progress")} == {
        "steps": 6,
        "sweep": False,
        "seed": 0,
        "progress": False,
    }
    anderson = solvers.Anderson(max_steps=20, tol=0.5)
    assert config["solver"] == harness.to_python(anderson)
    fields = {k: v for k, v in config["solver"].items() if k != "type"}
    assert solvers.Anderson(**fields) == anderson  # the object rebuilt from config.json


def _start_of(out: str) -> list[str]:
    """The lines a run printed first, up to the one naming the full configuration."""
    lines = out.splitlines()
    ends = [i for i, line in enumerate(lines) if line.startswith("full configuration: ")]
    assert ends, f"the run began with {len(lines[0])} characters: {lines[0][:100]}..."
    return lines[: ends[0] + 1]


def test_a_run_starts_with_a_few_short_lines_and_the_configuration_stays_in_its_file(
    tmp_path, capsys
):
    """Not the whole configuration on one line (about 2,000 characters for the main job)."""
    out = tmp_path / "run"
    harness.run(TOY, ["--out_dir", str(out), "--steps", "6", "--quiet"])
    start = _start_of(capsys.readouterr().out)
    assert len(start) <= 4 and all(len(line) <= 120 for line in start), start
    assert start[0] == f"toy: run folder {out}"
    assert start[1] == "settings changed from the defaults: steps=6, progress=False"
    assert start[-1] == f"full configuration: {out / 'config.json'}"
    assert json.loads((out / "config.json").read_text())["solver"]["type"] == "Anderson"
    harness.run(TOY, ["--out_dir", str(out), "--resume", "--force", "--steps", "8"])
    start = _start_of(capsys.readouterr().out)
    assert start[0] == f"toy (--resume): run folder {out}"
    assert start[1] == "settings changed from the defaults: steps=8, force=True"
    sweep = tmp_path / "sweep"
    harness.run(TOY, ["--out_dir", str(sweep), "--sweep", "--smoke"])
    start = _start_of(capsys.readouterr().out)
    assert start[0] == f"toy (--sweep, --smoke): run folder {sweep}"
    assert start[1] == "settings changed from the defaults: none"
    assert start[-1] == f"full configuration: {sweep / 'sweep_config.json'}"


def test_the_main_jobs_first_lines_are_short(tmp_path, capsys):
    from experiments import fashion_mnist

    exp = dataclasses.replace(fashion_mnist.EXPERIMENT, run=lambda config, inputs, ctx: {})
    out = tmp_path / "run"
    flags = ["--smoke", "--epochs", "3", "--no_jr", "--sweep_scales", "0.5,1,2,4,8,16,32,64"]
    harness.run(exp, ["--out_dir", str(out), "--compilation_cache", "", *flags])
    start = _start_of(capsys.readouterr().out)
    assert all(len(line) <= 120 for line in start), start
    assert start[0] == f"fashion_mnist (--smoke): run folder {out}"
    assert "epochs=3" in start[1] and "jr=False" in start[1] and "sweep_scales=0.5,1" in start[1]
    assert start[-1] == f"full configuration: {out / 'config.json'}"
    assert len(json.dumps(json.loads((out / "config.json").read_text()))) > 1000
