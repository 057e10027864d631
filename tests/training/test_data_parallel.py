"""Data parallelism two ways (``jax.jit`` + ``jax.shard_map``, and ``jax.pmap``): the same numbers
as one device, each device's solver loops its own (no collective inside a loop), placement."""

import ast
import json
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from deqjax._src.training.data_parallel import (
    PER_DEVICE,
    REPLICATED,
    SHARDED,
    Pmapped,
    Sharded,
    data_parallel,
)
from tests.helpers.checked_shard_map_worker import CASES
from tests.helpers.train_worker import REPO_ROOT, worker_env

WORKER = ["-m", "tests.helpers.parallel_worker"]  # run from the repository root


@pytest.fixture(scope="module")
def four_devices(tmp_path_factory):
    out = tmp_path_factory.mktemp("dp") / "out.json"
    proc = subprocess.run(
        [sys.executable, *WORKER, str(out), "--steps", "3"],
        env=worker_env(4),
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(out.read_text())


def _edits_sys_path(path: pathlib.Path) -> bool:
    """Whether a module changes ``sys.path`` (a call on it, or an assignment to it or its items)."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        target = (
            node.func.value if isinstance(node, ast.Call) and hasattr(node.func, "value") else None
        )
        if isinstance(node, ast.Assign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            target = next((getattr(t, "value", t) for t in targets), None)
        if target is not None and ast.unparse(target) == "sys.path":
            return True
    return False


def test_the_worker_scripts_run_as_modules_and_leave_sys_path_alone(tmp_path):
    helpers = sorted(pathlib.Path(REPO_ROOT, "tests", "helpers").glob("*.py"))
    assert not [p.name for p in helpers if _edits_sys_path(p)]
    edits = tmp_path / "edits.py"
    edits.write_text("import sys\nsys.path.insert(0, '..')\n")
    assert _edits_sys_path(edits)  # the check sees an edit
    proc = subprocess.run(
        [sys.executable, *WORKER, "--help"], cwd=REPO_ROOT, capture_output=True, text=True
    )
    assert proc.returncode == 0 and "--resume" in proc.stdout, proc.stderr[-2000:]


@pytest.mark.parametrize("mode", ["sharded", "pmap"])
def test_four_devices_train_like_one_with_the_gmres_fallback(four_devices, mode):
    one, many = four_devices["one"], four_devices[mode]
    assert four_devices["num_devices"] == 4
    assert one["fallback_rates"] == [1.0] * 3 and many["fallback_rates"] == [1.0] * 3
    np.testing.assert_allclose(many["losses"], one["losses"], rtol=1e-6)
    np.testing.assert_allclose(many["grad_norms"], one["grad_norms"], rtol=1e-5)
    for name, value in one["params"].items():
        np.testing.assert_allclose(many["params"][name], value, rtol=1e-5, atol=1e-6)
    # nfe_max is reduced with pmax: the most over the global batch, however it is split.
    assert many["nfe_max"] == one["nfe_max"]


@pytest.mark.parametrize("mode", ["sharded", "pmap"])
def test_no_collective_inside_a_solver_loop_and_one_gradient_average(four_devices, mode):
    counts = four_devices[mode]["collectives"]
    assert counts["loops"] >= 2  # the forward solve and the backward's
    assert counts["in_loops"] == 0
    assert counts["outside"] >= 1


@pytest.mark.parametrize("mode", ["sharded", "pmap"])
def test_each_device_iterates_as_long_as_its_own_shard_needs(four_devices, mode):
    nfe = four_devices[mode]["nfe"]
    assert nfe["per_device"] == nfe["alone"]
    assert len(set(nfe["per_device"])) > 1  # the shards differ in difficulty, so do their loops


def test_modes_and_devices_are_checked():
    with pytest.raises(ValueError, match="parallel must be one of"):
        data_parallel("dp")
    with pytest.raises(ValueError, match="devices is empty"):
        data_parallel("sharded", [])
    assert isinstance(data_parallel(), Sharded)
    assert isinstance(data_parallel("pmap"), Pmapped)


@pytest.mark.parametrize("mode", ["sharded", "pmap"])
def test_placed_values_come_back_as_they_went(mode):
    parallel = data_parallel(mode, jax.devices()[:1])
    tree = {"r": np.arange(3.0), "s": np.arange(8.0).reshape(4, 2), "p": np.ones((1, 5))}
    kinds = {"r": REPLICATED, "s": SHARDED, "p": PER_DEVICE}
    back = parallel.get(parallel.put(tree, kinds), kinds)
    for name, value in tree.items():
        np.testing.assert_array_equal(back[name], value)
    with pytest.raises(ValueError, match="divisible"):
        parallel.put(np.float32(1.0), SHARDED)


def test_a_per_device_value_mapped_as_replicated_is_refused():
    """The sharded path's shard_map is checked (check_vma=True): a result that differs by device
    cannot be declared REPLICATED (unchecked, each device's own value came back as "the" value)."""
    parallel = data_parallel("sharded", jax.devices()[:1])
    rows = parallel.put(np.arange(4.0), SHARDED)
    with pytest.raises(ValueError, match="out_specs"):
        parallel.map(jnp.sum, (SHARDED,), REPLICATED)(rows)
    total = parallel.map(lambda x: jax.lax.psum(jnp.sum(x), "batch"), (SHARDED,), REPLICATED)
    assert parallel.get(total(rows), REPLICATED) == 6.0


CHECKED_WORKER = ["-m", "tests.helpers.checked_shard_map_worker"]


def _checked_cases(tmp_path, devices, cases=None):
    """The checked worker's output on ``devices`` fake devices (all its cases by default)."""
    args = [tmp_path / f"checked{devices}.json"] + (
        [] if cases is None else ["--cases", ",".join(cases)]
    )
    result = _run(args, devices, worker=CHECKED_WORKER, timeout=1200)
    assert result["num_devices"] == devices
    return result["cases"]


def _assert_checked_gives_todays_numbers(cases):
    """Checked == unchecked bit for bit (pcast moves no data), == pmap within rounding, and no
    collective inside a solver loop."""
    for name, case in cases.items():
        checked, unchecked, pmapped = case["checked"], case["unchecked"], case["pmap"]
        assert checked["metrics"] == unchecked["metrics"], name
        assert checked["params"] == unchecked["params"], name
        for key, value in pmapped["metrics"].items():
            np.testing.assert_allclose(checked["metrics"][key], value, rtol=1e-6, err_msg=name)
        for key, value in pmapped["params"].items():
            np.testing.assert_allclose(checked["params"][key], value, rtol=1e-6, atol=1e-7)
        counts = checked["collectives"]
        assert counts["loops"] >= 2 and counts["in_loops"] == 0, (name, counts)
        assert checked["metrics"]["bwd_steps"] >= 0.0 and np.isfinite(checked["metrics"]["loss"])


@pytest.mark.slow  # two devices in a subprocess; tests/test_vma.py checks the typing on one
def test_two_devices_checked_step_as_unchecked_through_chunks_and_reversal(tmp_path):
    """A checked solve from zeros: Anderson read every 3 steps (chunks with optimization
    barriers), and the reversible solver, whose backward returns a cotangent for z0."""
    cases = _checked_cases(tmp_path, 2, ["anderson_every3/implicit", "reversible/reversible"])
    _assert_checked_gives_todays_numbers(cases)


# Broyden + SHINE hangs on several fake CPU devices whether sharded or pmapped, checked or not (and
# before check_vma): one device only.
MANY_DEVICE_CASES = [name for name in CASES if "shine" not in name]


@pytest.mark.slow  # every solver and gradient, three ways: minutes per device count
@pytest.mark.parametrize("devices", [1, 2, 4])
def test_every_solver_and_adjoint_steps_checked_as_unchecked_and_pmapped(tmp_path, devices):
    cases = _checked_cases(tmp_path, devices, None if devices == 1 else MANY_DEVICE_CASES)
    assert set(cases) == set(CASES if devices == 1 else MANY_DEVICE_CASES)
    _assert_checked_gives_todays_numbers(cases)


def _run(args, devices, *, worker=WORKER, timeout=300):
    """The JSON written to ``args[0]`` by ``worker`` run with ``args`` on ``devices`` devices."""
    proc = subprocess.run(
        [sys.executable, *worker, *map(str, args)],
        env=worker_env(devices),
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(pathlib.Path(args[0]).read_text())


@pytest.mark.slow
def test_a_sharded_checkpoint_resumes_bit_exact_on_four_devices_and_on_two(tmp_path):
    """orbax writes the sharded state's global arrays; they restore onto the layout of the run
    that resumes: the same 4 devices (bit for bit) or 2."""
    straight = _run([tmp_path / "straight.json", "--save", tmp_path / "s", "--steps", 3], 4)
    _run([tmp_path / "first.json", "--save", tmp_path / "ckpt", "--steps", 2], 4)
    same = _run([tmp_path / "same.json", "--resume", tmp_path / "ckpt", "--steps", 3], 4)
    two = _run([tmp_path / "two.json", "--resume", tmp_path / "ckpt", "--steps", 3], 2)
    assert same["losses"] == straight["losses"][2:]
    assert same["params"] == straight["params"]
    np.testing.assert_allclose(two["losses"], straight["losses"][2:], rtol=1e-6)
    for name, value in straight["params"].items():
        np.testing.assert_allclose(two["params"][name], value, rtol=1e-5, atol=1e-6)
