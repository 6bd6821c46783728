#!/usr/bin/env bash
# On the GPU host: `bash scripts/gpu_ray_install.sh 1` (carrying .gpu-ray-1), then, in the next call
# while the machine is still warm, `bash scripts/gpu_ray_install.sh 2` (carrying .gpu-ray-2): puts the
# first half aside in /tmp, then joins both, checks the hash and installs Ray into /tmp/site (on the
# path after `source scripts/gpu_setup.sh`). See scripts/gpu_prepare_ray.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:?usage: gpu_ray_install.sh 1|2}" in
  1) mkdir -p /tmp/masrl-ray && cp .gpu-ray-1/part.00 /tmp/masrl-ray/ && echo "[gpu_ray] first half kept in /tmp/masrl-ray" ;;
  2) test -f /tmp/masrl-ray/part.00 || { echo "[gpu_ray] no first half: run step 1 in the call before, on a warm machine" >&2; exit 2; }
     name=$(cat .gpu-ray-2/name)
     cat /tmp/masrl-ray/part.00 .gpu-ray-2/part.01 > "/tmp/masrl-ray/$name"
     echo "$(cat .gpu-ray-2/sha256)  /tmp/masrl-ray/$name" | sha256sum -c -
     python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "/tmp/masrl-ray/$name" .gpu-ray-2/deps/*.whl \
       2>&1 | grep -v "^WARNING: Target directory" || true
     PYTHONPATH=/tmp/site python3 -c "import ray; print('[gpu_ray] ray', ray.__version__)" ;;
  *) echo "usage: gpu_ray_install.sh 1|2" >&2; exit 2 ;;
esac
