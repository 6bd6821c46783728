#!/usr/bin/env bash
# On the GPU host, after `source scripts/gpu/setup.sh`: issue 21's throughput measurements with
# benchmarks/bench_async.py, one after the other, each table also written as JSON under $OUT.
#   PARTS: any of solver, solver2 (engine on a second GPU), long_tail, long_calls (the long tail with
#   calls of different lengths: one in 8 runs to 64 tokens, the others to 8; the eager engine as the
#   baseline, the paged one streaming each call back as it ends), ray (two policies in two Ray actors on
#   two GPUs; needs scripts/gpu/ray_install.sh first), graph_prefill (the long tail's sync@paged with
#   rollout.graph_prefill off and on, alternated ROUNDS times, default 2: issue 28's token-row prefill),
#   overlap_chunks (the same with rollout.overlap_chunks: a decode chunk queued while the host takes the last);
#   default: those the host can run.
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
gpus=$(python3 -c "import torch; print(torch.cuda.device_count())")
PARTS=${PARTS:-"solver long_tail $([ "$gpus" -ge 2 ] && echo solver2 ray)"}
common=(--model random-qwen2.5-0.5b --precision bf16 --micro-batch-tokens 16384)
grpo=(--workload solver --tasks 64 --samples 8 --tokens 256 --steps 4)
for part in $PARTS; do
  echo "== $part"
  case $part in
    solver) python3 benchmarks/bench_async.py "${common[@]}" "${grpo[@]}" --device cuda --modes sync,async,async-turns \
              --json "$OUT/solver.json" ;;
    solver2) python3 benchmarks/bench_async.py "${common[@]}" "${grpo[@]}" --device cuda:0 --rollout-device cuda:1 \
               --modes sync,async --json "$OUT/solver2.json" ;;
    long_tail) python3 benchmarks/bench_async.py "${common[@]}" --workload long_tail --device cuda --tasks 32 --samples 8 \
                 --tokens 64 --max-turns 8 --steps 3 --modes sync,async,async-s1,async-s2,async-s4 --json "$OUT/long_tail.json" ;;
    long_calls) python3 benchmarks/bench_async.py "${common[@]}" --workload long_tail --device cuda --tasks 32 --samples 8 \
                  --tokens 64 --max-turns 8 --long-every 8 --steps 3 --modes sync@hf,sync@paged,async@hf,async@paged \
                  --json "$OUT/long_calls.json" ;;
    graph_prefill|overlap_chunks) for r in $(seq "${ROUNDS:-2}"); do for on in false true; do
                     python3 benchmarks/bench_async.py "${common[@]}" --workload long_tail --device cuda --tasks 32 \
                       --samples 8 --tokens 64 --max-turns 8 --steps 3 --modes sync@paged --set rollout.$part=$on \
                       --json "$OUT/$part-$r-$on.json"; done; done ;;
    ray) python3 benchmarks/bench_async.py "${common[@]}" --workload team_two --placement ray --device cuda --tasks 16 \
           --samples 8 --tokens 128 --steps 3 --modes sync,async --json "$OUT/ray.json" ;;
    *) echo "unknown part $part" >&2; exit 2 ;;
  esac 2>&1 | grep -v "^  "
done
