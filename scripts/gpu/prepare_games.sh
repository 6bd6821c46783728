#!/usr/bin/env bash
# Run here, at the repo root: TextArena 0.7.4 and what `import textarena` and its two-player games load that the
# GPU image lacks (chess, nltk, websockets, python-dotenv, defusedxml; the image has requests, rich, regex, click,
# joblib, tqdm), as Python 3.12 wheels in .gpu-games/ (git-ignored, ~5 MB). There, in the call that carries
# [".gpu-games"]: python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpu-games/*.whl
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-.venv/bin/python}
grep -qx "/.gpu-games/" .git/info/exclude 2>/dev/null || echo "/.gpu-games/" >> .git/info/exclude
mkdir -p .gpu-games
for p in textarena==0.7.4 chess nltk websockets python-dotenv defusedxml; do
  "$PY" -m pip download -q --only-binary=:all: --no-deps --python-version 3.12 --implementation cp \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
    -d .gpu-games "$p"
done
du -sh .gpu-games
