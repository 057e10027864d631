#!/usr/bin/env bash
# The GPU check: the core tests, then the solver, LM and main-job benchmarks, on this machine's GPU.
#
#   bash benchmarks/gpu_check.sh [OUT_DIR]     # from the repository root; default OUT_DIR gpu_check
#
# Needs the project installed with a CUDA build of jaxlib (pip install -e ".[test,experiments]"
# plus "jax[cuda12]") and the Fashion-MNIST files of the main job (DESIGN.md, "Data"). Writes one
# file per step to OUT_DIR; the tables go into BENCHMARKS.md beside the CPU ones, with the GPU's
# name and the matmul precision of each run. A failing test does not stop the benchmarks.
set -uo pipefail
out=${1:-gpu_check}
mkdir -p "$out"
python -c "import jax; print(jax.__version__, jax.devices())" | tee "$out/devices.txt"
if ! python -c "import jax, sys; sys.exit(jax.default_backend() != 'gpu')"; then
  echo "no GPU backend: this script checks the GPU path only" >&2
  exit 1
fi
# Core tests (the suite pins full-precision matmuls in tests/conftest.py, as CPU float32 is).
python -m pytest -q -n 8 tests/solvers tests/adjoints tests/test_fixed_point.py \
  tests/test_precision.py tests/test_compiled.py tests/nn tests/training 2>&1 | tee "$out/tests.txt"
# Loop cost against the floor, with the peers, at JAX's default GPU precision (TF32-class) and at
# full float32 (the sizes of BENCHMARKS.md, "Loop cost": d 512 and 2048, batch 128 and 256).
for precision in default highest; do
  python -m benchmarks.solvers --dims 512 2048 --batches 128 256 --processes 1 \
    --precision "$precision" --out "$out/solvers_$precision.md"
done
python -m benchmarks.language_model --depths 8 --seq_lens 64,128 --repeats 5 >"$out/language_model.md"
python -m benchmarks.training --skip_jr --devices 1 --repeats 20 >"$out/main_job.md"
python -m benchmarks.eager_and_compile >"$out/eager_and_compile.md"
echo "done: $out"
