#!/usr/bin/env bash
# Run here, at the repo root: verl 0.9.1 and the Python 3.12 wheels its trainer imports that the device image lacks,
# packed by scripts/gpu/pack_parts.sh into .gpu-verl/NN/ for scripts/gpu/verl_install.sh on a GPU host with no
# network (issue 74: verl's GRPO beside masrl's on one card).
# verl runs in its own site folder and process (/tmp/site-verl, then vLLM's /tmp/site-vllm), never beside masrl's
# /tmp/site: hydra-core pins the antlr4 runtime 4.9, math-verify (masrl's) 4.13; verl 0.9.1 pins transformers
# <5.11 (the image has 5.17), so 5.10 travels with it, with the tokenizers and huggingface-hub it accepts (<=0.23.0, <2.0). Ray is scripts/gpu/prepare_ray.sh's trimmed wheel. The wheel
# set is verl's own Requires-Dist less what the image holds (/work/.library/device/KINDS.md lists it): accelerate,
# pandas, pyarrow, peft, pybind11, tensorboard, numpy and packaging are there. wandb is left out: verl imports it
# only for its wandb logger (trainer.logger=[console]).
# Checked on a CPU (Python 3.11 venv of torch 2.13, ray and the image's other packages, this set's cp312 wheels
# swapped for their 3.11 builds): `from verl.trainer import main_ppo` and `verl.trainer.ppo.ray_trainer` import,
# and `python -m verl.trainer.main_ppo --cfg job algorithm.adv_estimator=grpo` composes verl's GRPO config.
# vLLM (scripts/gpu/prepare_vllm.sh) brings fastapi and pydantic; verl's own uvicorn and cachetools travel here.
# TransferQueue: verl's v1 trainer (the default, trainer.use_v1) imports it in its task runner.
# Run on an H100 (2026-12-07): bench_verl.py's row 1 reached its first step with this set, vLLM's and trimmed Ray's.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-.venv/bin/python}
PART_MB=${PART_MB:-40}
source scripts/gpu/host_wheels.sh
start_wheels .gpu-verl
get verl==0.9.1
# hydra's antlr4 runtime 4.9.3 is published as a source archive only: built here into a (pure-Python) wheel
"$PY" -m pip wheel -q --no-deps antlr4-python3-runtime==4.9.3 -w "$work/wheels" 2>&1 | grep -v "^WARNING" || true
for p in "transformers>=5.5.3,<5.11,!=5.6.0" hydra-core==1.3.2 omegaconf==2.3.0 \
         "tokenizers>=0.22.0,<=0.23.0" "huggingface-hub>=1.5.0,<2.0" codetiming dill pylatexenc torchdata pyvers cachetools uvicorn "tensordict>=0.8.0,<=0.10.0,!=0.9.0" "datasets" multiprocess \
         cloudpickle orjson importlib-metadata "TransferQueue>=0.1.10"; do
  get "$p"
done
for w in verl-0.9.1- transferqueue- transformers-5.10 hydra_core- omegaconf- antlr4_python3_runtime- tensordict- torchdata-; do
  ls "$work/wheels" | grep -q "^$w" || { echo "prepare_verl: no wheel for $w" >&2; ls "$work/wheels" >&2; exit 1; }
done
ls "$work/wheels"
bash scripts/gpu/pack_parts.sh verl "$work/wheels" .gpu-verl "$PART_MB"
du -sh .gpu-verl/*
