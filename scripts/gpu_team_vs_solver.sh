#!/usr/bin/env bash
# On the GPU host, after `source scripts/gpu_setup.sh` and the SmolLM2 install (gpu_smollm2_install.sh):
# teams against their single agents at equal training compute, every seed of every arm side by side on
# one GPU; held-out results on 120 unseen tasks every EVAL steps. Writes $OUT/compare.html (masrl
# compare) and $OUT/runs.tgz (metrics, evals, logs).
#
# Arms (ARMS, default "team_roles solver"): math, CALLS model calls a step (default 512) split as
# CALLS / (8 samples x calls per task) tasks:
#   team_roles, team_plain, team_cf   the four-agent math team (4 calls a task)
#   checked                           solver + checker with a calculator + finalizer (3 calls a task)
#   solver, solver_async              one solver (1 call), the second with rollout.mode async
#   solver_calc                       one solver whose calculation the calculator computes (1 call)
#   solver_expr                       one solver prompted as the checked team's checker: one expression, computed (1 call)
#   debate                            three debaters, one revision round, majority vote (6 calls), eval at temperature 0.7
# code, CODE_TEAM_TASKS (default 16), CODE_SOLVER_TASKS (default 24) and CODE_SOLVER_TESTS_TASKS (default 20)
# tasks of 8 samples a step:
#   code_team                         code_team_review: coder -> tests -> reviewer -> coder (1-3 calls a task)
#   code_solver                       one coder, one call, no tests shown
#   code_solver_tests                 one coder shown the visible tests' feedback, retries itself (1-2 calls)
# search, SEARCH_TEAM_TASKS (default 8) and SEARCH_AGENT_TASKS (default 24) tasks of 8 samples a step:
#   search_team                       search_team_shared: planner, searcher, summarizer, updater, answerer (6 calls)
#   search_agent                      one agent that calls search itself (up to 3 calls)
# reading (8 passages a question, qa_world level 1), CALLS model calls a step split as above:
#   reading_team                      4 readers of 2 passages each, then an answerer (5 calls)
#   reading_team4                     2 readers of 4 passages each, then an answerer (3 calls)
#   reading_team4v                    the same, and a reader's evidence reaches the answerer only if it is a quote
#   reading_team4s                    2 readers of 4 passages who name the passage that answers; the answerer reads it
#   reading_agent, reading_agent_ev   one call reads all 8 passages; the second prompted as the team's reader
#   reading_agent_sel                 one call reads all 8, names the passage that answers, then answers
#   reading_team4s_cf                 reading_team4s with counterfactual credit for the readers
#   reading_team8s, reading_agent_sel24   the same with 24 passages a question: 3 selecting readers of 8 and
#                                     the answerer (4 calls) against one selecting call over all 24
#   reading_team8p                    reading_team_pick, 24 passages: 3 readers of 8 that must each name one passage (found credit: a
#                                     reader whose chunk holds the answer earns its pick), then an answerer that
#                                     names one of the 3 picks and answers (4 calls)
#   reading_agent_sel24f              reading_agent_sel24 with the same found credit for the passage it names
#   reading_agent_sel24d              reading_agent_sel24 with dynamic sampling (2 refill rounds a step)
#   reading_agent24                   one call reads all 24 and answers (the shipped agent's prompt, no selection)
#   reading_agent24e                  reading_agent24 kept exploring: temperature 1.0 and an entropy bonus of 0.01
#   reading_team8pa                   reading_team8p whose answerer is prompted as the plain agent (reads the 3 picks,
#                                     answers, names none: workflow.options.answer_only=true)
#   reading_team12p48, reading_agent48   48 passages a question (one call's prompt ~4,400 tokens): 4 picking readers
#                                     of 12 and the answerer over their 4 picks (5 calls) against one call over all 48;
#                                     reading_team12p48a with the plain answerer
#   reading_team12p48ae, reading_team12p48ad   reading_team12p48a keeping the readers' picks diverse (they collapse onto one
#                                     pick per chunk by step 10): readers at temperature 1.0 with an entropy bonus of 0.01,
#                                     or dynamic sampling (2 refill rounds for groups whose rewards are all equal)
# two-hop reading (24 passages, qa_world level 2; CALLS a multiple of 64, e.g. 256 or 320, for equal calls; 320
#   also suits the 5-call reading_hops_pick):
#   reading_hops                      3 readers of 8 name the passage the question names, a bridger names what it
#                                     leads to, 3 readers name that one's passage, an answerer answers (8 calls)
#   reading_hops_pick                 3 readers of 8 name the passage the question names, a bridger picks the title it
#                                     leads to from the numbered titles of all 24, an answerer reads that passage (5 calls)
#   reading_hops_agent                one call reads all 24 and answers (a worked example of each kind of two-hop question)
#   reading_hops_agentb               the same, naming the bridge first, paid the mean of its F1 and the answer's
# code from documentation (source code_docs: 24 entries a task, the asked function's among 23 others'; CALLS
#   model calls a step split as above):
#   code_docs_team                    3 readers of 8 name the asked function's entry, the coder writes it from the 3
#                                     picks (4 calls)
#   code_docs_agent                   one coder call reads all 24 entries (the team coder's prompt and examples)
#   code_docs_agent_ds                the same with dynamic sampling (2 refill rounds for groups whose rewards are equal)
# chained math (source math_chain: 3 or 4 events on one count a problem, 3.5 calls a task on average for the
#   stepping arms; CALLS a multiple of 28, e.g. 280, for equal calls):
#   chain_team                        one stepper per event, each from the count so far, the calculator computes each
#   chain_agent                       one solver writes one expression for the whole chain (1 call)
#   chain_stepwise                    one solver works through the events in one conversation, a turn per event
# reasoning-gym (source reasoning_gym: the seven-dataset suite of configs/rg_*.yaml, scored by the library):
#   rg_team                           solver, checker with a calculator, finalizer (3 calls a task)
#   rg_solver                         one solver (1 call)
#   rg_solver_calc                    one solver with the calculator and both team prompts' examples (1 call)
#   (SEARCH_TEAM_EXTRA / SEARCH_AGENT_EXTRA: overrides for one search arm only, e.g. the team's
#    workflow.options.max_turns=2 against the agent's workflow.options.max_calls=5 for two-hop questions)
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
for a in ${ARMS:-team_roles solver}; do
  case $a in
    team_roles) arm team_roles math/team_roles $(math 4) ;;
    team_plain) arm team_plain math/team_shared $(math 4) ;;
    team_cf) arm team_cf math/team_counterfactual $(math 4) ;;
    checked) arm checked math/team_checked $(math 3) ;;
    debate) arm debate math/debate_shared $(math 6) eval.temperature=0.7 ;;
    solver) arm solver math/solver $(math 1) ;;
    solver_async) arm solver_async math/solver $(math 1) rollout.mode=async ;;
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
    reading_team) arm reading_team qa/reading_team $(math 5) ;;
    reading_team4) arm reading_team4 qa/reading_team $(math 3) workflow.options.docs_per_reader=4 ;;
    reading_team4v) arm reading_team4v qa/reading_team $(math 3) workflow.options.docs_per_reader=4 \
      workflow.options.verbatim=true ;;
    reading_team4s) arm reading_team4s qa/reading_team $(math 3) workflow.options.docs_per_reader=4 \
      workflow.options.readers=select ;;
    reading_team4s_cf) arm reading_team4s_cf qa/reading_team_counterfactual $(math 3) ;;
    reading_team8s) arm reading_team8s qa/reading_team $(math 4) workflow.options.docs_per_reader=8 \
      workflow.options.readers=select data.world.context_docs=24 ;;
    reading_team8p) arm reading_team8p qa/reading_team_pick $(math 4) ;;
    reading_agent_sel24f) arm reading_agent_sel24f qa/reading_agent $(math 1) workflow.options.select=true \
      workflow.options.found_credit=true data.world.context_docs=24 ;;
    reading_agent_sel24d) arm reading_agent_sel24d qa/reading_agent $(math 1) workflow.options.select=true \
      data.world.context_docs=24 rollout.dynamic_sampling=2 ;;
    reading_team12p48) arm reading_team12p48 qa/reading_team_pick $(math 5) data.world.context_docs=48 \
      workflow.options.docs_per_reader=12 ;;
    reading_team12p48a) arm reading_team12p48a qa/reading_team_pick $(math 5) data.world.context_docs=48 \
      workflow.options.docs_per_reader=12 workflow.options.answer_only=true ;;
    reading_team12p48ae) arm reading_team12p48ae qa/reading_team_pick $(math 5) data.world.context_docs=48 \
      workflow.options.docs_per_reader=12 workflow.options.answer_only=true agents.reader.temperature=1.0 \
      algorithm.entropy_coef=0.01 ;;
    reading_team12p48ad) arm reading_team12p48ad qa/reading_team_pick $(math 5) data.world.context_docs=48 \
      workflow.options.docs_per_reader=12 workflow.options.answer_only=true rollout.dynamic_sampling=2 ;;
    reading_team8pa) arm reading_team8pa qa/reading_team_pick $(math 4) workflow.options.answer_only=true ;;
    reading_agent48) arm reading_agent48 qa/reading_agent $(math 1) data.world.context_docs=48 ;;
    reading_agent24) arm reading_agent24 qa/reading_agent $(math 1) data.world.context_docs=24 ;;
    reading_agent24e) arm reading_agent24e qa/reading_agent $(math 1) data.world.context_docs=24 \
      agents.agent.temperature=1.0 algorithm.entropy_coef=0.01 ;;
    reading_agent) arm reading_agent qa/reading_agent $(math 1) ;;
    reading_hops) arm reading_hops qa/reading_hops $(math 8) ;;
    reading_hops_pick) arm reading_hops_pick qa/reading_hops $(math 5) workflow.options.bridger=pick ;;
    reading_hops_agent) arm reading_hops_agent qa/reading_hops_agent $(math 1) ;;
    reading_hops_agentb) arm reading_hops_agentb qa/reading_hops_agent $(math 1) workflow.options.bridge=true ;;
    reading_agent_sel24) arm reading_agent_sel24 qa/reading_agent $(math 1) workflow.options.select=true \
      data.world.context_docs=24 ;;
    reading_agent_sel) arm reading_agent_sel qa/reading_agent $(math 1) workflow.options.select=true ;;
    code_docs_team) arm code_docs_team code/docs_team $(math 4) ;;
    code_docs_agent) arm code_docs_agent code/docs_agent $(math 1) ;;
    code_docs_agent_ds) arm code_docs_agent_ds code/docs_agent $(math 1) rollout.dynamic_sampling=2 ;;
    chain_team) arm chain_team math/chain_team "rollout.tasks_per_step=$((CALLS * 2 / 56))" \
      rollout.samples_per_task=8 ;;
    chain_agent) arm chain_agent math/chain_agent $(math 1) ;;
    chain_stepwise) arm chain_stepwise math/chain_stepwise "rollout.tasks_per_step=$((CALLS * 2 / 56))" \
      rollout.samples_per_task=8 ;;
    rg_team) arm rg_team reasoning_gym/team_checked $(math 3) ;;
    rg_solver) arm rg_solver reasoning_gym/solver $(math 1) ;;
    rg_solver_calc) arm rg_solver_calc reasoning_gym/solver_calculator $(math 1) ;;
    reading_agent_ev) arm reading_agent_ev qa/reading_agent $(math 1) workflow.options.evidence=true ;;
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
