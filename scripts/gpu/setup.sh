# Source this on the GPU host, at the repo root: `source scripts/gpu/setup.sh`.
# It installs the wheels from .gpu/wheels (see scripts/gpu/prepare.sh) into /tmp/site without
# network, puts the repo's src/ and tests/ on the path, points masrl's cache at /tmp/masrl-cache, and
# prints what the run will use. Every GPU run starts this way.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .gpu/wheels/*.whl \
  2>&1 | grep -v "^WARNING: Target directory" || true
export PYTHONPATH=/tmp/site:$PWD/src:$PWD/tests${PYTHONPATH:+:$PYTHONPATH}
# vLLM and its wheels, once scripts/gpu/vllm_install.sh has put them there (after /tmp/site: masrl's pins win)
[ -f /tmp/site-vllm/.installed-vllm ] && export PYTHONPATH=$PYTHONPATH:/tmp/site-vllm
# masrl's cache (the tokenizer from .gpu/cache, the converted SmolLM2) lives in /tmp: files written
# inside the repo's ignored folders do not all survive the next call's copy of the working tree
mkdir -p /tmp/masrl-cache && { [ -d .gpu/cache ] && cp -rn .gpu/cache/. /tmp/masrl-cache/ 2>/dev/null; true; }
export MASRL_CACHE_DIR=/tmp/masrl-cache
export PYTHONUNBUFFERED=1
export TOKENIZERS_PARALLELISM=false
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
python3 - <<'PY'
import torch, transformers, peft
print(f"[gpu_setup] torch {torch.__version__} (CUDA {torch.version.cuda}), transformers {transformers.__version__}, "
      f"peft {peft.__version__}; GPUs: {[torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]}")
PY
