#!/usr/bin/env bash
# Run here, at the repo root: vLLM 0.24.0 (it pins torch 2.11.0, the device image's) and the Python 3.12 wheels it
# needs that the image lacks, packed by scripts/gpu/pack_parts.sh into .gpu-vllm/NN/ (seven parts of about 54 MB:
# the working tree also counts toward a call's 64 MiB) for scripts/gpu/vllm_install.sh on a GPU host with no
# network.
# The wheel set: what `from vllm import LLM`, the V1 engine and LoRARequest import (found by importing them with
# only these on the path), and what the engine loads when it runs (blake3 for prefix-cache hashes, setproctitle
# and pyzmq for its core process, msgspec and cbor2 for its messages). FlashInfer, Ray and the server's
# OpenTelemetry are left out: vLLM's default FlashAttention backend and the offline engine need none of them.
# model-hosting-container-standards (with jmespath and supervisor) is what vLLM's OpenAI server imports, which verl's
# rollout runs (issue 74: found missing on the H100).
# llguidance 1.7 (vLLM's pin) is not on this registry for Python 3.12: 1.6.1 is taken; xgrammar 0.2.2 is the
# newest that accepts vLLM's apache-tvm-ffi 0.1.9. Installed and run on an H100 (verl's rollout server, 2026-12-07).
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-.venv/bin/python}
PART_MB=${PART_MB:-54}
source scripts/gpu/host_wheels.sh
start_wheels .gpu-vllm
get vllm==0.24.0
for p in cbor2 pyzmq openai-harmony msgspec pybase64 cachetools "llguidance<1.8" xgrammar==0.2.2 \
         apache-tvm-ffi==0.1.9 "fastapi>=0.133,<0.137" "starlette>=1.0.1" partial-json-parser "openai>=2,<3" jiter \
         distro sniffio blake3 setproctitle watchfiles python-json-logger ijson prometheus-fastapi-instrumentator \
         lm-format-enforcer==0.11.3 interegular mistral-common pycountry depyf==0.20.0 astor dill jsonschema \
         jsonschema-specifications referencing rpds-py compressed-tensors==0.17.0 outlines_core==0.2.14 lark==1.2.2 \
         diskcache==5.6.3 annotated-types pydantic pydantic-core typing-inspection \
         model-hosting-container-standards jmespath supervisor; do
  get "$p"
done
ls "$work/wheels" | grep -q "^vllm-0.24.0-" || { echo "vllm 0.24.0's wheel did not download" >&2; exit 1; }
bash scripts/gpu/pack_parts.sh vllm "$work/wheels" .gpu-vllm "$PART_MB"
du -sh .gpu-vllm/*
