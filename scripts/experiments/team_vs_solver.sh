#!/usr/bin/env bash
# On the GPU host, after `source scripts/gpu/setup.sh` and the SmolLM2 install (scripts/gpu/smollm2_install.sh):
# teams against their single agents at equal training compute, every seed of every arm side by side on
# one GPU; held-out results on 120 unseen tasks every EVAL steps. Writes $OUT/compare.html (masrl
# compare) and $OUT/runs.tgz (metrics, evals, logs).
#
# Arms (ARMS, default "checked solver_expr"): the arms of docs/results.md; each config's own header says what it
# trains. CALLS model calls a step (default 512) split as CALLS / (8 samples x calls per task) tasks:
#   math: checked (the checked team, 3 calls), solver_calc (one solver with its calculator), solver_expr (one solver
#     prompted as its checker), solver (one solver), team_roles (the four-agent team, 4 calls), debate (6 calls,
#     eval at temperature 0.7); chained math (CALLS a multiple of 28): chain_team, chain_stepwise (3.5 calls a
#     problem), chain_agent (1 call)
#   reading (qa_world with passages): reading_team8p (24 passages: 3 picking readers of 8, an answerer; 4 calls)
#     against reading_agent24 (one call over all 24); reading_team4 (8 passages: 2 readers of 4, an answerer; 3
#     calls), reading_team4s (the same readers naming a passage), reading_agent, reading_agent_sel (8 passages, one
#     call, naming a passage first); two-hop (CALLS a multiple of 64): reading_hops (8 calls), reading_hops_agent
#   code from documentation: code_docs_team (4 calls), code_docs_agent
#   reasoning-gym (the seven-dataset suite of reasoning_gym/*): rg_team (3 calls), rg_solver, rg_solver_calc
# and with their own task counts a step (8 samples each): code_team (code/team_review, CODE_TEAM_TASKS=16),
# code_solver (CODE_SOLVER_TASKS=24), code_solver_tests (CODE_SOLVER_TESTS_TASKS=20); search_team
# (SEARCH_TEAM_TASKS=8, 6 calls), search_agent (SEARCH_AGENT_TASKS=24; SEARCH_TEAM_EXTRA / SEARCH_AGENT_EXTRA:
# overrides for one search arm only). Arms of superseded runs (docs/log.md) are in this script's history.
# MAJ=k also scores each single-agent arm's final weights by maj@k at temperature 0.7 (equal inference
# calls: k = the team's calls per task). HUMANEVAL=k scores each code arm's final weights and the untrained
# model on HumanEval's 164 problems, k samples each at temperature 0.7 (pass@1, pass@k). STEPS, SEEDS, LIMIT (seconds per run: the runs stop their steps
# LIMIT/8 before it and evaluate what they reached; at LIMIT they are killed), EVAL, EXTRA (overrides
# for every run) and PY (the Python that has masrl; default python3) can be set too. The runs' checkpoints
# are deleted at the end (KEEP_CHECKPOINTS=1 keeps them): a host's disk outlives one call.
set -uo pipefail
PY=${PY:-python3}; STEPS=${STEPS:-30}; SEEDS=${SEEDS:-"0 1 2"}; LIMIT=${LIMIT:-540}; OUT=${OUT:-out}; CALLS=${CALLS:-512}
# memory per run (one H200, SmolLM2-135M): the paged engine's KV pool is 0.03 of the device (4.2 GiB) and the
# update's micro-batches hold 4096 tokens: peaks 9.5-9.9 GiB a run, where 16384-token micro-batches peaked at
# 15.8-16.1 GiB and twelve such runs ran out of memory (docs/gpu.md)
# each run ends its own steps in time for its final checkpoint and held-out evaluation (train.time_limit_s),
# LIMIT/8 (at least 120 s) before the hard kill at LIMIT
TL=$(( LIMIT - (LIMIT / 8 > 120 ? LIMIT / 8 : 120) ))
common=(device=cuda "train.steps=$STEPS" "train.eval_every=${EVAL:-10}" train.save_every=0 data.eval.n=120 train.log_traces=4
        "train.time_limit_s=$TL"
        rollout.max_in_flight=256 rollout.max_batch_size=256 rollout.engine=paged rollout.gpu_memory_utilization=0.03
        algorithm.micro_batch_tokens=4096 ${EXTRA:-})
R=${RUNS:-runs/cmp-$(date +%s)}  # a fresh folder: run directories left by an earlier call are refused
mkdir -p "$R" "$OUT"
free_gib=$(df -Pk "$R" | awk 'NR==2 {print int($4 / 1048576)}')  # a run keeps ~2 GiB of checkpoints (SmolLM2)
echo "free disk at $R: ${free_gib} GiB"
declare -A CFG=() ARG=()
arm() {  # name config overrides...
  local name=$1 cfg=$2; shift 2
  CFG[$name]=$cfg; ARG[$name]="$*"  # (overrides hold no spaces) the maj@k evaluation below needs them too
  for s in $SEEDS; do
    ( timeout "$LIMIT" "$PY" -m masrl.cli train "$cfg" "${common[@]}" "$@" "seed=$s" "name=$name" \
        "output_dir=$R/$name-seed$s" > "$R/$name-seed$s.log" 2>&1
      [ $? -ne 124 ] || echo "error: killed after LIMIT=${LIMIT}s, unfinished (raise LIMIT)" >> "$R/$name-seed$s.log" ) &
  done
}
math() {  # calls per task -> the rollout overrides for CALLS model calls a step
  echo "rollout.tasks_per_step=$((CALLS / (8 * $1))) rollout.samples_per_task=8"
}
for a in ${ARMS:-checked solver_expr}; do
  case $a in
    team_roles) arm team_roles math/team_roles $(math 4) ;;
    checked) arm checked math/team_checked $(math 3) ;;
    debate) arm debate math/debate_shared $(math 6) eval.temperature=0.7 ;;
    solver) arm solver math/solver $(math 1) ;;
    solver_calc) arm solver_calc math/solver_calculator $(math 1) ;;
    solver_expr) arm solver_expr math/solver_expression $(math 1) ;;
    code_team) arm code_team code/team_review \
                 "rollout.tasks_per_step=${CODE_TEAM_TASKS:-16}" rollout.samples_per_task=8 ;;
    code_solver) arm code_solver code/solver "rollout.tasks_per_step=${CODE_SOLVER_TASKS:-24}" \
                   rollout.samples_per_task=8 ;;
    code_solver_tests) arm code_solver_tests code/solver_tests \
                         "rollout.tasks_per_step=${CODE_SOLVER_TESTS_TASKS:-20}" rollout.samples_per_task=8 ;;
    search_team) arm search_team qa/search_team_shared "rollout.tasks_per_step=${SEARCH_TEAM_TASKS:-8}" \
                   rollout.samples_per_task=8 ${SEARCH_TEAM_EXTRA:-} ;;
    search_agent) arm search_agent qa/search_agent "rollout.tasks_per_step=${SEARCH_AGENT_TASKS:-24}" \
                    rollout.samples_per_task=8 ${SEARCH_AGENT_EXTRA:-} ;;
    reading_team4) arm reading_team4 qa/reading_team $(math 3) workflow.options.docs_per_reader=4 ;;
    reading_team4s) arm reading_team4s qa/reading_team $(math 3) workflow.options.docs_per_reader=4 \
      workflow.options.readers=select ;;
    reading_team8p) arm reading_team8p qa/reading_team_pick $(math 4) ;;
    reading_agent24) arm reading_agent24 qa/reading_agent $(math 1) data.world.context_docs=24 ;;
    reading_agent) arm reading_agent qa/reading_agent $(math 1) ;;
    reading_hops) arm reading_hops qa/reading_hops $(math 8) ;;
    reading_hops_agent) arm reading_hops_agent qa/reading_hops_agent $(math 1) ;;
    reading_agent_sel) arm reading_agent_sel qa/reading_agent $(math 1) workflow.options.select=true ;;
    code_docs_team) arm code_docs_team code/docs_team $(math 4) ;;
    code_docs_agent) arm code_docs_agent code/docs_agent $(math 1) ;;
    chain_team) arm chain_team math/chain_team "rollout.tasks_per_step=$((CALLS * 2 / 56))" \
      rollout.samples_per_task=8 ;;
    chain_agent) arm chain_agent math/chain_agent $(math 1) ;;
    chain_stepwise) arm chain_stepwise math/chain_stepwise "rollout.tasks_per_step=$((CALLS * 2 / 56))" \
      rollout.samples_per_task=8 ;;
    rg_team) arm rg_team reasoning_gym/team_checked $(math 3) ;;
    rg_solver) arm rg_solver reasoning_gym/solver $(math 1) ;;
    rg_solver_calc) arm rg_solver_calc reasoning_gym/solver_calculator $(math 1) ;;
    *) echo "unknown arm $a" >&2; exit 2 ;;
  esac
done
wait
if [ -n "${MAJ:-}" ]; then  # the single agents at the team's inference calls
  for name in "${!CFG[@]}"; do
    case $name in solver*|code_solver*|code_docs_agent*|chain_agent*|reading_agent*|reading_hops_agent*|rg_solver*) ;;
      *) continue ;; esac
    for s in $SEEDS; do
      "$PY" -m masrl.cli eval "${CFG[$name]}" --checkpoint "$R/$name-seed$s" "${common[@]}" ${ARG[$name]} "seed=$s" \
        "eval.samples_per_task=$MAJ" eval.temperature=0.7 "output_dir=$R/$name-seed$s-maj$MAJ" \
        > "$R/$name-seed$s-maj$MAJ.log" 2>&1 &
    done
  done
  wait
fi
if [ -n "${HUMANEVAL:-}" ]; then  # the code arms' final weights, and the untrained model, on HumanEval
  he=(data.eval.source=humaneval data.eval.n=164 data.eval.levels=[1] "eval.samples_per_task=$HUMANEVAL"
      eval.temperature=0.7)
  for name in "${!CFG[@]}"; do
    case $name in code_*) ;; *) continue ;; esac
    "$PY" -m masrl.cli eval "${CFG[$name]}" "${common[@]}" ${ARG[$name]} "${he[@]}" \
      "output_dir=$R/$name-untrained-humaneval" > "$R/$name-untrained-humaneval.log" 2>&1 &
    for s in $SEEDS; do
      "$PY" -m masrl.cli eval "${CFG[$name]}" --checkpoint "$R/$name-seed$s" "${common[@]}" ${ARG[$name]} "seed=$s" \
        "${he[@]}" "output_dir=$R/$name-seed$s-humaneval" > "$R/$name-seed$s-humaneval.log" 2>&1 &
    done
  done
  wait
fi
for f in "$R"/*.log; do echo "== $f"; grep -E "held-out|maj@|error|Error" "$f" | tail -4; done
"$PY" -m masrl.cli compare "$R"/*-seed?/ --out "$OUT/compare.html"
tar czf "$OUT/runs.tgz" "$R"/*/metrics.jsonl "$R"/*/traces.jsonl "$R"/*/eval_traces.jsonl "$R"/*/eval*.json "$R"/*/data.json "$R"/*/config.yaml "$R"/*.log 2>/dev/null
if [ -z "${KEEP_CHECKPOINTS:-}" ]; then  # weights do not travel back, and a host's disk is shared by later calls
  rm -rf "$R"/*/checkpoints; echo "removed the runs' checkpoints (KEEP_CHECKPOINTS=1 keeps them)"
fi
ls -la "$OUT"
