#!/usr/bin/env bash
# The GPU check: the core tests, then the solver, main-job and LM benchmarks, on this machine's GPU,
# within 8 minutes on one H100 (each part has a time limit; their sum is 470 s), so that a session
# with 15 minutes of device time can run it once and rerun a part.
#
#   bash benchmarks/gpu_check.sh [OUT_DIR [PART ...]]    # from the repository root
#
# OUT_DIR defaults to gpu_check; PARTs (default all, in this order): tests, loop_floor,
# solvers_default, solvers_highest, main_job, language_model; and, on a second call, main_job_wall
# (the whole main job twice: a first run and one that finds its programs in the compilation
# cache, against the CPU's 32 s and 25 s in BENCHMARKS.md). Needs the project installed with a CUDA build of
# jaxlib (pip install -e ".[test,experiments,bench]" plus "jax[cuda12]") and the Fashion-MNIST
# files of the main job (DESIGN.md, "Data"); on a machine that cannot download, the .gpu/ folder
# benchmarks/gpu_prepare.sh gathers (installed below). Writes one file per part to OUT_DIR; the tables go
# into BENCHMARKS.md beside the CPU ones, with the GPU's name and the matmul precision of each
# run. A part that fails or runs out of time does not stop the others; the script's status is
# the number of parts that did not finish.
set -uo pipefail
out=${1:-gpu_check}
shift || true
parts=("$@")
[ ${#parts[@]} -eq 0 ] && parts=(tests loop_floor solvers_default solvers_highest main_job language_model)
mkdir -p "$out"
# On a lent machine with nothing to download from: what benchmarks/gpu_prepare.sh put into .gpu/
# (the wheels the image lacks, installed beside it; the main job's Fashion-MNIST files where the
# loader looks), and `python` for an image that has only python3.
if [ -d .gpu ]; then
  if ! command -v python >/dev/null; then  # a shim, not a link: a venv's python3 finds its venv
    mkdir -p /tmp/gpu_bin && printf '#!/bin/sh\nexec %s "$@"\n' "$(command -v python3)" \
      >/tmp/gpu_bin/python && chmod +x /tmp/gpu_bin/python && export PATH=/tmp/gpu_bin:$PATH
  fi
  python -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/gpu_site .gpu/whl/*.whl || exit 1
  export PYTHONPATH=/tmp/gpu_site:$PWD${PYTHONPATH:+:$PYTHONPATH}
  fm=$(python -c "from deqjax._src.data.idx import DEFAULT_FASHION_MNIST_DIR as d; print(d)")
  ls "$fm"/*-idx?-ubyte* >/dev/null 2>&1 || { mkdir -p "$fm" && cp .gpu/fashion-mnist/* "$fm/"; } ||
    echo "could not copy .gpu/fashion-mnist to $fm: the main-job parts will fail" >&2
fi
python -c "import jax; print(jax.__version__, jax.devices())" | tee "$out/devices.txt"
# GPU_CHECK_ON_CPU=1 runs it anyway, to rehearse it on a CPU (its parts then run out of time).
if [ -z "${GPU_CHECK_ON_CPU:-}" ] && ! python -c "import jax, sys; sys.exit(jax.default_backend() != 'gpu')"; then
  echo "no GPU backend: this script checks the GPU path only" >&2
  exit 1
fi
failed=0
part() {  # part NAME SECONDS COMMAND...: runs COMMAND with a time limit, output to OUT/NAME.txt
  local name=$1 seconds=$2
  shift 2
  local t0=$SECONDS
  timeout "$seconds" "$@" >"$out/$name.txt" 2>&1
  local rc=$?
  echo "$name: exit $rc after $((SECONDS - t0)) s (limit $seconds s)" | tee -a "$out/parts.txt"
  [ "$rc" -eq 0 ] || failed=$((failed + 1))
}
# The loop-cost sizes of BENCHMARKS.md (d 512 batch 128, d 2048 batch 256) against the peers
# that run on the GPU (TorchDEQ's torch is a CPU build here), at JAX's default precision (TF32)
# and at full float32.
solvers=(python -m benchmarks.solvers --sizes 512x128 2048x256 --processes 1 --repeats 5
  --rows naive deqjax jaxopt optimistix)
for p in "${parts[@]}"; do
  case $p in
    # The core tests (the suite pins full-precision products in
    # tests/conftest.py; the precision tests run at JAX's default). Eight workers share the GPU:
    # none may take 75 % of its memory up front.
    tests) XLA_PYTHON_CLIENT_PREALLOCATE=false part tests 100 python -m pytest -q -n 8 \
      -m "not slow" tests/solvers tests/adjoints tests/test_fixed_point.py tests/test_precision.py \
      tests/test_compiled.py tests/nn ;;
    # What the loop itself costs: a static fori_loop, while_loops checked every 1/4/8 steps and
    # every solver at check_every 1/4/8, 24 evaluations each ("highest": no TF32 noise in it).
    loop_floor) part loop_floor 60 python -m benchmarks.solvers --loop_floor --check_every 1 4 8 \
      --sizes 512x128 2048x256 --processes 1 --repeats 10 --rows deqjax jaxopt \
      --precision highest --out "$out/loop_floor.md" ;;
    solvers_default) part solvers_default 90 "${solvers[@]}" --out "$out/solvers_default.md" ;;
    solvers_highest) part solvers_highest 90 "${solvers[@]}" --precision highest \
      --out "$out/solvers_highest.md" ;;
    # The main job's train step on the GPU (one device: the default backend), float32 and
    # bfloat16 (--dtype).
    main_job) part main_job 70 python -m benchmarks.training --skip_jr --devices 1 --repeats 20 \
      --dtypes float32,bfloat16 ;;
    language_model) part language_model 60 python -m benchmarks.language_model --depths 8 \
      --seq_lens 64,128 --repeats 5 ;;
    # Not in the default list: the main job's wall time, a first run (empty compilation cache)
    # and a second one (the same programs, loaded), each timed as a user runs it.
    main_job_wall) part main_job_wall 110 bash -c "rm -rf $out/mj_cache $out/mj_1 $out/mj_2 &&
      for i in 1 2; do TIMEFORMAT=\"run \$i: %R s wall\"; time python experiments/fashion_mnist.py \
      --no_progress --out_dir $out/mj_\$i --compilation_cache $out/mj_cache | tail -1; done" ;;
    *) echo "unknown part $p (tests, loop_floor, solvers_default, solvers_highest, main_job," \
      "language_model, main_job_wall)" >&2
      failed=$((failed + 1)) ;;
  esac
done
echo "done: $out ($failed part(s) did not finish)"
exit "$failed"
