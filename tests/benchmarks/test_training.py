"""``benchmarks/training.py`` measures the backend a user would train on."""

from benchmarks import training


def test_one_device_is_the_default_backend_several_are_fake_cpu_devices():
    environ = {"XLA_FLAGS": "--xla_gpu_autotune_level=0"}
    # One device: whatever backend JAX picks (the GPU where there is one), as the caller set it.
    assert training.worker_env(1, environ) == environ
    assert training.worker_env(1, {"JAX_PLATFORMS": "cuda"})["JAX_PLATFORMS"] == "cuda"
    two = training.worker_env(2, environ)
    assert two["JAX_PLATFORMS"] == "cpu"
    assert two["XLA_FLAGS"].split() == [
        "--xla_gpu_autotune_level=0",
        "--xla_force_host_platform_device_count=2",
    ]


def test_the_gpu_check_fits_in_eight_minutes():
    """``benchmarks/gpu_check.sh`` bounds every part with a time limit; together they leave a
    15-minute device session room to run it once and rerun a part."""
    import pathlib
    import re

    script = (pathlib.Path(__file__).parents[2] / "benchmarks" / "gpu_check.sh").read_text()
    limits = dict(re.findall(r"\bpart (\w+) (\d+) ", script))
    default = re.search(r"parts=\((tests [\w ]+)\)", script).group(1).split()
    assert len(default) == 6 and set(default) < set(limits)
    assert sum(int(limits[p]) for p in default) <= 8 * 60
    # The part run on a second call fits in what a session has left after the first.
    assert int(limits["main_job_wall"]) <= 120


def test_what_gpu_prepare_gathers_is_what_gpu_check_installs_and_git_ignores():
    """``gpu_prepare.sh`` puts 30 MB of wheels and data where ``gpu_check.sh`` looks for them,
    and git ignores that folder (it travels to a device machine only when carried)."""
    import pathlib
    import re
    import shutil
    import subprocess

    root = pathlib.Path(__file__).parents[2]
    prepare = (root / "benchmarks" / "gpu_prepare.sh").read_text()
    check = (root / "benchmarks" / "gpu_check.sh").read_text()
    folder = re.search(r"^here=(\S+)$", prepare, re.M).group(1)
    assert f"if [ -d {folder} ]" in check
    assert f"{folder}/whl/*.whl" in check and f"{folder}/fashion-mnist/" in check
    assert f'carry [\\"{folder}\\"]' in prepare
    if shutil.which("git") is None or not (root / ".git").exists():
        return
    paths = [f"{folder}/whl/a.whl", f"{folder}/fashion-mnist/x.gz"]
    ignored = subprocess.run(
        ["git", "check-ignore", *paths], cwd=root, capture_output=True, text=True, check=False
    )
    assert ignored.stdout.split() == paths
