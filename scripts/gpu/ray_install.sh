#!/usr/bin/env bash
# On the GPU host, after `source scripts/gpu/setup.sh`, carrying [".gpu", ".gpu-ray"]:
# `bash scripts/gpu/ray_install.sh` installs the trimmed Ray wheel and its dependencies from
# .gpu-ray (made by scripts/gpu/prepare_ray.sh) into /tmp/site (or $RAY_SITE: verl reads /tmp/site-ray), unless
# the host already has Ray.
set -euo pipefail
cd "$(dirname "$0")/../.."
if python3 -c "import ray" 2>/dev/null; then
  python3 -c "import ray; print('[gpu_ray] ray', ray.__version__, 'already installed')"; exit 0
fi
python3 -m pip install -q --no-index --no-deps --no-compile --target "${RAY_SITE:-/tmp/site}" .gpu-ray/ray-*.whl .gpu-ray/deps/*.whl \
  2>&1 | grep -v "^WARNING: Target directory" || true
PYTHONPATH="${RAY_SITE:-/tmp/site}" python3 -c "import ray; print('[gpu_ray] ray', ray.__version__)"
