#!/usr/bin/env bash
# On the GPU host, at the repo root: verl 0.9.1 and its wheels (scripts/gpu/prepare_verl.sh) from the parts carried
# so far into /tmp/site-verl; verl then runs in its own process with PYTHONPATH=/tmp/site-verl:/tmp/site-vllm (and
# Ray's site), never on masrl's /tmp/site. One part a call, back to back while the machine stays warm:
#   for k in 00 01 ...: call with carry [".gpu-verl/$k"]: bash scripts/gpu/verl_install.sh
set -euo pipefail
exec bash "$(dirname "$0")/parts_install.sh" verl .gpu-verl /tmp/site-verl
