#!/usr/bin/env bash
# On the GPU host, after `source scripts/gpu_setup.sh` and the SmolLM2 install (gpu_smollm2_install.sh):
# the math team with role credit against one solver at equal training compute (512 model calls a step on
# both sides), every seed of both arms side by side on one GPU; held-out accuracy on 120 unseen problems
# every 10 steps. Writes $OUT/compare.html (masrl compare) and $OUT/runs.tgz (metrics, evals, logs).
# STEPS, SEEDS, LIMIT (seconds per run), EVAL (steps between held-out evaluations), EXTRA (overrides for
# every run) and ARMS (of team_roles, solver, team_plain, team_cf, solver_async: the solver with
# rollout.mode async; default the first two) can be set in the environment.
set -uo pipefail
STEPS=${STEPS:-30}; SEEDS=${SEEDS:-"0 1 2"}; LIMIT=${LIMIT:-540}; OUT=${OUT:-out}
common=(device=cuda "train.steps=$STEPS" "train.eval_every=${EVAL:-10}" train.save_every=0 data.eval.n=120 train.log_traces=4
        rollout.max_in_flight=256 rollout.max_batch_size=256 algorithm.micro_batch_tokens=16384 ${EXTRA:-})
R=${RUNS:-runs/cmp-$(date +%s)}  # a fresh folder: run directories left by an earlier call are refused
mkdir -p "$R" "$OUT"
arm() {  # name config overrides...
  local name=$1 cfg=$2; shift 2
  for s in $SEEDS; do
    timeout "$LIMIT" python3 -m masrl.cli train "$cfg" "${common[@]}" "$@" "seed=$s" "name=$name" \
      "output_dir=$R/$name-seed$s" > "$R/$name-seed$s.log" 2>&1 &
  done
}
team=(rollout.tasks_per_step=16 rollout.samples_per_task=8)
for a in ${ARMS:-team_roles solver}; do
  case $a in
    team_roles) arm team_roles configs/math_team_roles.yaml "${team[@]}" ;;
    team_plain) arm team_plain configs/math_team_shared.yaml "${team[@]}" ;;
    team_cf) arm team_cf configs/math_team_counterfactual.yaml "${team[@]}" ;;
    solver) arm solver configs/math_solver.yaml rollout.tasks_per_step=64 rollout.samples_per_task=8 ;;
    solver_async) arm solver_async configs/math_solver.yaml rollout.tasks_per_step=64 rollout.samples_per_task=8 \
                    rollout.mode=async ;;
    *) echo "unknown arm $a" >&2; exit 2 ;;
  esac
done
wait
for f in "$R"/*.log; do echo "== $f"; grep -E "held-out|error|Error" "$f" | tail -4; done
python3 -m masrl.cli compare "$R"/*-seed*/ --out "$OUT/compare.html"
tar czf "$OUT/runs.tgz" "$R"/*/metrics.jsonl "$R"/*/eval_*.json "$R"/*/config.yaml "$R"/*.log 2>/dev/null
ls -la "$OUT"
