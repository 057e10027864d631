# Shared by the CI lanes (.ci/run, .ci/lowest_jax, .ci/py313); sourced, not run.

# The entry tests every lane runs: the compiled entry and its function keys (with their slow
# eager-Haiku check: ENTRY_SLOW_TOO, run with the slow lane's tests as well; the keys read
# Python's code objects, which change with the Python version), dq.fixed_point (and its
# correction) and dq.nn.DEQ (Haiku).
ENTRY_SLOW_TOO=(tests/test_compiled.py tests/test_function_key.py)
ENTRY_TESTS=(tests/test_fixed_point.py tests/test_fixed_point_correction.py tests/nn/test_deq.py)
# The solvers' and adjoints' tests: JAX alone, no framework. The lowest lane runs them on its
# JAX; the newest lane's default suite runs them on the newest JAX, the one the 3.13 lane has.
JAX_TESTS=(tests/solvers tests/adjoints)
# The test tools a lane without the [test] extra installs (tyro: the solver registry's
# command-line round trip); scipy comes with JAX.
TEST_TOOLS=("pytest>=7" "pytest-xdist>=3" "hypothesis>=6" "tyro>=1.0,<2")

# An interpreter for Python $1 (X.Y): python$1 or python3 on PATH when it is that version, else
# pyenv's newest $1.* build. Fails naming what to install.
find_python() {
  local want=$1 cand found
  for cand in "python$want" python3; do
    found=$("$cand" -c "import sys; print(sys.executable if '%d.%d' % sys.version_info[:2] == '$want' else '')" 2>/dev/null) || true
    if [ -n "$found" ]; then
      echo "$found"
      return
    fi
  done
  cand=$(ls -d "${PYENV_ROOT:-$HOME/.pyenv}/versions/$want".*/bin/python3 2>/dev/null | sort -V | tail -n 1)
  if [ -n "$cand" ]; then
    echo "$cand"
    return
  fi
  echo "CI: no Python $want here (neither python$want nor pyenv's $want.*): pyenv install $want" >&2
  return 1
}

# A fresh virtual environment $1 from interpreter $2, activated, with the newest pip.
fresh_venv() {
  rm -rf "$1"
  "$2" -m venv "$1"
  # shellcheck disable=SC1091
  . "$1/bin/activate"
  python -m pip install -q --upgrade pip
}

# pytest with its arguments; "no tests collected" (exit code 5) is not a failure.
run_pytest() {
  local rc=0
  python -m pytest "$@" || rc=$?
  if [ "$rc" -ne 5 ]; then return "$rc"; fi
}

# Fails unless each named distribution is the newest release the registry serves this Python:
# a lane that claims the newest must not pass on an older release pip backtracked to.
require_newest() {
  local name installed newest
  for name in "$@"; do
    installed=$(python -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$name")
    newest=$(python -m pip index versions "$name" 2>/dev/null | sed -n '1s/^[^ ]* (\(.*\))$/\1/p')
    if [ "$installed" != "$newest" ]; then
      echo "CI: $name $installed is installed but the registry's newest is ${newest:-unknown}" >&2
      return 1
    fi
  done
}

# One line: lane $1's Python and versions, and its wall time since $2 (bash's SECONDS), of which
# installing took until $3. Appended to $CI_SUMMARY too, where .ci/run collects the lanes' lines.
lane_report() {
  python - "$1" "$((SECONDS - $2))" "$(($3 - $2))" <<'EOF' | tee -a "${CI_SUMMARY:-/dev/null}"
import importlib.metadata as metadata
import platform
import sys


def version(name):
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "-"


def minutes(seconds):
    return f"{int(seconds) // 60}:{int(seconds) % 60:02d}"


lane, wall, install = sys.argv[1], sys.argv[2], sys.argv[3]
names = ["jax", "jaxlib", "dm-haiku", "optax", "equinox", "flax", "numpy", "scipy"]
print(
    f"lane {lane}: python {platform.python_version()}, "
    + ", ".join(f"{name} {version(name)}" for name in names)
    + f"; wall {minutes(wall)} (install {minutes(install)})"
)
EOF
}
