#!/usr/bin/env bash
# Run here (with network), at the repo root: Ray for the GPU host, whose Python 3.12 lacks it.
# Ray's wheel (~79 MB) is larger than what one device call carries (64 MiB), so .gpu-ray/ (git-ignored)
# gets a copy without the parts a Python-only run never loads: the Java jars and the rllib, data,
# serve, tune, train and llm libraries (40 MiB), plus Ray's small dependencies. On the GPU host,
# carry [".gpu", ".gpu-ray"] and run `bash scripts/gpu/ray_install.sh` after `source scripts/gpu/setup.sh`.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-.venv/bin/python}
VER=${RAY_VERSION:-2.60.0}
grep -qx "/.gpu-ray/" .git/info/exclude 2>/dev/null || echo "/.gpu-ray/" >> .git/info/exclude
rm -rf .gpu-ray && mkdir -p .gpu-ray/deps
tmp=$(mktemp -d)
plat=(--only-binary=:all: --no-deps --python-version 3.12 --implementation cp --platform manylinux2014_x86_64
      --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64)
"$PY" -m pip download -q "${plat[@]}" -d "$tmp" "ray==$VER" 2>&1 | grep -v '^WARNING: Location' || true
"$PY" -m pip download -q "${plat[@]}" -d .gpu-ray/deps click msgpack protobuf jsonschema jsonschema-specifications \
  referencing rpds-py attrs 2>&1 | grep -v '^WARNING: Location' || true
"$PY" scripts/gpu/trim_wheel.py "$tmp"/ray-*.whl .gpu-ray ray/jars ray/rllib ray/data ray/serve ray/tune ray/train ray/llm
rm -rf "$tmp"
du -sh .gpu-ray
