#!/usr/bin/env bash
# On the GPU host, at the repo root: vLLM 0.24.0 and its wheels (scripts/gpu/prepare_vllm.sh) from the parts
# carried so far into /tmp/site-vllm, which `source scripts/gpu/setup.sh` puts on the path once installed. One part
# a call, back to back while the machine stays warm:
#   for k in 00 01 ... 08: call with carry [".gpu-vllm/$k"]: bash scripts/gpu/vllm_install.sh
# Each call says which parts are still missing; the last one joins, checks and installs.
set -euo pipefail
exec bash "$(dirname "$0")/parts_install.sh" vllm .gpu-vllm /tmp/site-vllm
