#!/usr/bin/env bash
# On the GPU host, after `source scripts/gpu/setup.sh`, the SmolLM2 install (scripts/gpu/smollm2_install.sh) and
# TextArena's wheels (scripts/gpu/prepare_games.sh): the games family's setups side by side on one GPU, every seed
# of every arm at once; held-out games against the random-legal-move player (both seats, EVAL_GAMES new seeds)
# every EVAL steps; then each self-play seed's last weights against the untrained model, head to head
# (scripts/head_to_head.py, H2H_GAMES games, both seats). Writes $OUT/games.tgz (metrics, evals, logs) and
# $OUT/h2h-*.md.
#
# Arms (ARMS, default "ttt_selfplay kuhn_selfplay | ttt_independent ttt_pool": two waves), at equal training calls:
# ttt_open is ttt_selfplay whose training games start after 0-OPENING (default 4) random moves (opening_moves);
# ttt_open_explore is ttt_open sampling at temperature 1.0 with an entropy bonus (algorithm.entropy_coef=ENTROPY,
# default 0.01), against the collapse onto one game; ttt_explore_moves is ttt_open with a share EXPLORE (default 0.2)
# of each seat's moves played at random (data.train.options.explore_moves); ttt_league is ttt_pool with openings and
# the random player among the opponents.
# TASKS seeds a step, 8 games of each, where every seat trains (self-play, two independent policies), twice as many
# where only one seat's calls train (the pool: its opponents are frozen past selves). ttt_random trains against the
# random player (TASKS x 2 seeds). STEPS, SEEDS, LIMIT (seconds per run; the runs stop their steps LIMIT/8 before
# it and evaluate what they reached), EVAL, EXTRA (overrides for every run) and PY can be set too.
# TRANSFER=CONFIG (e.g. reasoning_gym/solver, whose wheels .gpu-rg carries): does self-play move a reasoning score,
# as SPIRAL reports? Each self-play seed's last weights and the untrained model are evaluated on CONFIG's held-out
# set (its policy TRANSFER_POLICY, default solver, starting from the checkpoint; TRANSFER_EXTRA: overrides of those
# evaluations), table in $OUT/transfer.md.
set -uo pipefail
PY=${PY:-python3}; STEPS=${STEPS:-200}; SEEDS=${SEEDS:-"0 1 2"}; LIMIT=${LIMIT:-900}; OUT=${OUT:-out}
TASKS=${TASKS:-8}; EVAL_GAMES=${EVAL_GAMES:-128}; H2H_GAMES=${H2H_GAMES:-128}
TL=$(( LIMIT - (LIMIT / 8 > 120 ? LIMIT / 8 : 120) ))
# memory per run (SmolLM2-135M, a KV pool of 0.01 of the device per engine, the configs' 4096-token update
# micro-batches), measured on an H100: one policy peaks at 6-7.4 GiB and holds ~9 GB on nvidia-smi, the league (four
# engines) 8.3-13.3 GiB and ~17.5 GB (two independent policies: 10.8 GiB with a 0.02 pool and 2048 tokens). Three
# seeds each of ttt_explore_moves and ttt_league held ~79 GB of the 80, and a league seed ran out of memory at step
# 73: keep each wave's sum of nvidia-smi shares under ~70 GB, hence waves. Engines used at most 0.37 of their pool
common=(device=cuda "train.steps=$STEPS" "train.eval_every=${EVAL:-10}" train.save_every=0 "data.eval.n=$EVAL_GAMES"
        train.log_traces=4 "train.time_limit_s=$TL" rollout.samples_per_task=8
        rollout.max_in_flight=256 rollout.max_batch_size=256 rollout.engine=paged rollout.gpu_memory_utilization=0.01
        ${EXTRA:-})
R=${RUNS:-runs/games-$(date +%s)}
mkdir -p "$R" "$OUT"
arm() {  # name config overrides...
  local name=$1 cfg=$2; shift 2
  for s in $SEEDS; do
    ( timeout "$LIMIT" "$PY" -m masrl.cli train "$cfg" "${common[@]}" "$@" "seed=$s" "name=$name" \
        "output_dir=$R/$name-seed$s" > "$R/$name-seed$s.log" 2>&1
      [ $? -ne 124 ] || echo "error: killed after LIMIT=${LIMIT}s, unfinished (raise LIMIT)" >> "$R/$name-seed$s.log" ) &
  done
}
# ARMS may name waves split by '|' ("ttt_selfplay kuhn_selfplay | ttt_independent ttt_pool"): each wave's runs
# start together once the wave before has ended (each wave gets LIMIT seconds)
IFS='|' read -r -a waves <<< "${ARMS:-ttt_selfplay kuhn_selfplay | ttt_independent ttt_pool}"
for wave in "${waves[@]}"; do
  echo "wave: $wave"
  for a in $wave; do
    case $a in
      ttt_selfplay) arm ttt_selfplay games/tictactoe_selfplay "rollout.tasks_per_step=$TASKS" ;;
      ttt_open) arm ttt_open games/tictactoe_selfplay "rollout.tasks_per_step=$TASKS" \
                  "data.train.options.opening_moves=${OPENING:-4}" ;;
      ttt_open_explore) arm ttt_open_explore games/tictactoe_selfplay "rollout.tasks_per_step=$TASKS" \
                  "data.train.options.opening_moves=${OPENING:-4}" agents.player_0.temperature=1.0 \
                  agents.player_1.temperature=1.0 "algorithm.entropy_coef=${ENTROPY:-0.01}" ;;
      ttt_explore_moves) arm ttt_explore_moves games/tictactoe_selfplay "rollout.tasks_per_step=$TASKS" \
                  "data.train.options.opening_moves=${OPENING:-4}" "data.train.options.explore_moves=${EXPLORE:-0.2}" ;;
      ttt_independent) arm ttt_independent games/tictactoe_independent "rollout.tasks_per_step=$TASKS" ;;
      ttt_league) arm ttt_league games/tictactoe_pool "rollout.tasks_per_step=$((TASKS * 2))" \
                  "data.train.options.opening_moves=${OPENING:-4}" \
                  'workflow.options.players=[player, "past_0|past_1|past_2|random"]' ;;
      ttt_pool) arm ttt_pool games/tictactoe_pool "rollout.tasks_per_step=$((TASKS * 2))" ;;
      ttt_random) arm ttt_random games/tictactoe_vs_random "rollout.tasks_per_step=$((TASKS * 2))" ;;
      kuhn_selfplay) arm kuhn_selfplay games/kuhn_poker_selfplay "rollout.tasks_per_step=$TASKS" ;;
      *) echo "unknown arm $a" >&2; exit 2 ;;
    esac
  done
  wait
done
last() { ls -d "$1"/checkpoints/step_* 2>/dev/null | tail -n 1; }
# the arms whose trained weights play against themselves: one shared policy in both seats, or the pool's player
# (trained against its own past selves); pol names the policy each one's checkpoint holds
ttt_selfplay_arms="ttt_selfplay ttt_open ttt_open_explore ttt_explore_moves ttt_pool ttt_league"
pol() { case $1 in ttt_pool|ttt_league) echo player ;; *) echo shared ;; esac; }
h2h=(device=cuda rollout.engine=paged rollout.gpu_memory_utilization=0.02 ${EXTRA:-})
for s in $SEEDS; do  # each self-play seed's last weights against the untrained model (and each other), both seats
  k=$(last "$R/kuhn_selfplay-seed$s")
  players=()
  for a in $ttt_selfplay_arms; do t=$(last "$R/$a-seed$s"); [ -n "$t" ] && players+=("$a=$t/$(pol "$a")"); done
  [ ${#players[@]} -gt 0 ] && "$PY" scripts/head_to_head.py games/tictactoe_vs_frozen "${players[@]}" untrained=untrained \
    --games "$H2H_GAMES" "seed=$s" "${h2h[@]}" > "$OUT/h2h-ttt-seed$s.md" 2> "$R/h2h-ttt-seed$s.log" &
  [ -n "$k" ] && "$PY" scripts/head_to_head.py games/tictactoe_vs_frozen "trained=$k/shared" untrained=untrained \
    --games "$H2H_GAMES" "seed=$s" "${h2h[@]}" workflow.options.game=KuhnPoker-v0-train \
    'workflow.options.example=[check]' > "$OUT/h2h-kuhn-seed$s.md" 2> "$R/h2h-kuhn-seed$s.log" &
done
wait
if [ -n "${TRANSFER:-}" ]; then  # the training runs' overrides (EXTRA) are not the reasoning config's: left out
  tr=(device=cuda rollout.engine=paged rollout.gpu_memory_utilization=0.02 ${TRANSFER_EXTRA:-})
  "$PY" -m masrl.cli eval "$TRANSFER" "${tr[@]}" "output_dir=$R/transfer-untrained" > "$R/transfer-untrained.log" 2>&1 &
  for s in $SEEDS; do
    for a in $ttt_selfplay_arms kuhn_selfplay; do
      t=$(last "$R/$a-seed$s")
      [ -n "$t" ] && "$PY" -m masrl.cli eval "$TRANSFER" "${tr[@]}" "policies.${TRANSFER_POLICY:-solver}.init_from=$t/$(pol "$a")" \
        "output_dir=$R/transfer-$a-seed$s" > "$R/transfer-$a-seed$s.log" 2>&1 &
    done
  done
  wait
  "$PY" scripts/transfer_table.py "$R"/transfer-*/ > "$OUT/transfer.md"
fi
for f in "$R"/*-seed?.log; do echo "== $f"; grep -E "held-out|error|Error" "$f" | tail -3; done
for f in "$OUT"/h2h-*.md "$OUT"/transfer.md; do [ -f "$f" ] && { echo "== $f"; cat "$f"; }; done
tar czf "$OUT/games.tgz" "$R"/*/metrics.jsonl "$R"/*/eval*.json "$R"/*/eval_traces.jsonl "$R"/*/config.yaml \
  "$R"/*.log 2>/dev/null
rm -rf "$R"/*/checkpoints
ls -la "$OUT"
