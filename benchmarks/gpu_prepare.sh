#!/usr/bin/env bash
# Before a session on a lent GPU machine (no network there): puts into .gpu/ what that machine's
# image lacks, so that one call of the device tool runs the GPU check.
#
#   bash benchmarks/gpu_prepare.sh         # here, from the repository root, with pip and the data
#
# .gpu/ (ignored by git, about 32 MB) then holds
#   whl/            the wheels of the packages the image ('cuda': JAX, optax, orbax, equinox, flax,
#                   optimistix, but no Haiku) lacks, for its Python 3.12, without their needs
#                   (each need is named below, and the image has the rest);
#   fashion-mnist/  the main job's idx files (DESIGN.md, "Data": dataset-fashion-mnist).
# benchmarks/gpu_check.sh installs both when it finds .gpu/. The device command is then
#   bash benchmarks/gpu_check.sh /tmp/gc; tar -C /tmp -czf "$OUT/gc.tgz" gc
# with carry [".gpu"] and timeout_s 600 (the parts' limits sum to 470 s; the tarball comes back as
# one file, as the tool returns at most 8).
set -euo pipefail
here=.gpu
data=${FASHION_MNIST_DIR:-/usr/share/datasets/fashion-mnist}
# The versions CI's newest lane installed on 2026-11-29; the only needs of theirs the image lacks are
# docstring-parser and typeguard (tyro's).
wheels=(dm-haiku==0.0.17 jmp==0.0.4 tyro==1.0.17 docstring-parser==0.18.0 typeguard==4.6.1
  jaxopt==0.8.5 tensorboardX==2.6.5)
rm -rf "$here/whl"
mkdir -p "$here/whl" "$here/fashion-mnist"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d "$here/whl" "${wheels[@]}"
if ! ls "$data"/*-idx?-ubyte* >/dev/null 2>&1; then
  echo "no Fashion-MNIST idx files in $data (apt-get install -y dataset-fashion-mnist)" >&2
  exit 1
fi
cp "$data"/*-idx?-ubyte* "$here/fashion-mnist/"
du -sh "$here"
echo "device command (carry [\".gpu\"], timeout_s 600):"
echo "  bash benchmarks/gpu_check.sh /tmp/gc; tar -C /tmp -czf \"\$OUT/gc.tgz\" gc"
