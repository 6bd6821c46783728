#!/usr/bin/env bash
# Run here (with network), at the repo root: Ray for the GPU host, whose Python 3.12 lacks it.
# Ray's wheel (~79 MB) is larger than what one device call carries (64 MiB), so it goes in two
# halves, .gpu-ray-1/ and .gpu-ray-2/ (git-ignored), with Ray's small dependencies in .gpu-ray-2/.
# There, two calls in a row while the machine stays warm (it keeps /tmp between calls):
#   call 1, carry [".gpu", ".gpu-ray-1"]:  bash scripts/gpu_ray_install.sh 1
#   call 2, carry [".gpu", ".gpu-ray-2"]:  bash scripts/gpu_ray_install.sh 2 && source scripts/gpu_setup.sh && ...
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
VER=${RAY_VERSION:-2.60.0}
for d in .gpu-ray-1 .gpu-ray-2; do grep -qx "/$d/" .git/info/exclude 2>/dev/null || echo "/$d/" >> .git/info/exclude; done
rm -rf .gpu-ray-1 .gpu-ray-2 && mkdir -p .gpu-ray-1 .gpu-ray-2/deps
tmp=$(mktemp -d)
"$PY" -m pip download -q --only-binary=:all: --no-deps --python-version 3.12 --implementation cp \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
  -d "$tmp" "ray==$VER" 2>&1 | grep -v '^WARNING: Location' || true
"$PY" -m pip download -q --only-binary=:all: --no-deps --python-version 3.12 --implementation cp \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
  -d .gpu-ray-2/deps click msgpack protobuf jsonschema jsonschema-specifications referencing rpds-py attrs \
  2>&1 | grep -v '^WARNING: Location' || true
whl=$(ls "$tmp"/ray-*.whl)
basename "$whl" > .gpu-ray-2/name
split -n 2 -d "$whl" part.
mv part.00 .gpu-ray-1/ && mv part.01 .gpu-ray-2/
sha256sum "$whl" | cut -d' ' -f1 > .gpu-ray-2/sha256
rm -rf "$tmp"
du -sh .gpu-ray-1 .gpu-ray-2
