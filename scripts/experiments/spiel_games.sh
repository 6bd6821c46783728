#!/usr/bin/env bash
# On the GPU host, after `source scripts/gpu/setup.sh`, the SmolLM2 install (scripts/gpu/smollm2_install.sh) and
# OpenSpiel's wheels (.gpu-spiel: python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpu-spiel/*.whl):
# OpenSpiel self-play with the group baseline (GRPO) and with RAE (SPIRAL's per-seat running baseline), every seed of
# every arm side by side on one GPU, then the exact yardsticks of each run's last weights and of the untrained model
# (`masrl eval`: Kuhn Poker's exploitability, TicTacToe's minimax ladder). Writes $OUT/spiel.tgz (metrics, evals,
# logs) and $OUT/spiel.md (the table).
# ARMS (default "kuhn_grpo kuhn_rae ttt_grpo ttt_rae"), SEEDS ("0 1 2"), STEPS (a cap; LIMIT, seconds per run, ends
# them first: train.time_limit_s stops the steps LIMIT/6 before it and keeps what they reached), TASKS (seeds a step,
# 8 games each), EXTRA (overrides for every run), PY. An arm is GAME_SETUP, GAME one of kuhn, leduc, ttt:
#   GAME_grpo, GAME_rae     self-play on one policy with the group baseline / RAE (algorithm.advantage)
#   GAME_rae_ent            RAE with an entropy bonus (algorithm.entropy_coef=ENTROPY, default 0.02)
#   GAME_state              a turn-level baseline: each move against the moves made from the same information state
#                           across the step's games (algorithm.group_key=[agent,state]; GRPO)
#   GAME_state_t1           GAME_state sampling at temperature 1.0 (the configs' 0.7 plays one move almost everywhere)
#   GAME_pool               the player against a pool of its three most recent snapshots (games/spiel_*_pool; RAE)
set -uo pipefail
PY=${PY:-python3}; STEPS=${STEPS:-400}; SEEDS=${SEEDS:-"0 1 2"}; LIMIT=${LIMIT:-240}; OUT=${OUT:-out}; TASKS=${TASKS:-8}
TL=$(( LIMIT - LIMIT / 6 ))
common=("train.steps=$STEPS" train.eval_every=0 train.save_every=0 "train.time_limit_s=$TL" rollout.samples_per_task=8
        "rollout.tasks_per_step=$TASKS" ${EXTRA:-})
R=${RUNS:-runs/spiel-$(date +%s)}
mkdir -p "$R" "$OUT"
game_of() { case $1 in kuhn_*) echo kuhn_poker ;; leduc_*) echo leduc_poker ;; ttt_*) echo tic_tac_toe ;;
                        *) echo "unknown arm '$1' (GAME_SETUP, GAME one of kuhn, leduc, ttt)" >&2; exit 2 ;; esac; }
cfg_of() { case $1 in *_pool) echo "games/spiel_$(game_of "$1")_pool" ;; *) echo "games/spiel_$(game_of "$1")_selfplay" ;; esac; }
setup_of() { case ${1#*_} in grpo) echo algorithm.advantage=grpo ;; rae) echo algorithm.advantage=rae ;;
               rae_ent) echo "algorithm.advantage=rae algorithm.entropy_coef=${ENTROPY:-0.02}" ;; pool) ;;
               state) echo "algorithm.advantage=grpo algorithm.group_key=[agent,state]" ;;
               state_t1) echo "algorithm.advantage=grpo algorithm.group_key=[agent,state]" \
                              "agents.player_0.temperature=1.0 agents.player_1.temperature=1.0" ;;
               *) echo "unknown setup in arm '$1' (grpo, rae, rae_ent, state, state_t1, pool)" >&2; exit 2 ;; esac; }
ARMS=${ARMS:-kuhn_grpo kuhn_rae ttt_grpo ttt_rae}
for a in $ARMS; do game_of "$a" > /dev/null && setup_of "$a" > /dev/null || exit 2; done
for a in $ARMS; do
  for s in $SEEDS; do
    # shellcheck disable=SC2046  # the setup's overrides are words
    ( timeout "$((LIMIT + 120))" "$PY" -m masrl.cli train "$(cfg_of "$a")" "${common[@]}" $(setup_of "$a") \
        "seed=$s" "name=$a" "output_dir=$R/$a-seed$s" > "$R/$a-seed$s.log" 2>&1 ) &
  done
done
wait
for g in $(for a in $ARMS; do echo "${a%%_*}"; done | sort -u); do  # the untrained model's yardsticks, once per game
  ( "$PY" -m masrl.cli eval "games/spiel_$(game_of "${g}_")_selfplay" ${EXTRA:-} "output_dir=$R/untrained-$g" \
      > "$R/untrained-$g.log" 2>&1 ) &
done
for d in "$R"/*-seed*/; do
  ( "$PY" -m masrl.cli eval "$d" ${EXTRA:-} > "${d%/}-eval.log" 2>&1 ) &
done
wait
"$PY" - "$R" > "$OUT/spiel.md" <<'PYEOF'
import json, statistics, sys
from pathlib import Path
R = Path(sys.argv[1])
def yard(p):
    return json.loads(p.read_text()).get("yardsticks", {}) if p.is_file() else {}
rows = ["| run | steps | exploitability | ladder (seat0 / seat1 W-D-L at p=1, 0.5, 0.2, 0) |", "|---|---|---|---|"]
def ladder(y):
    lad = (y.get("ladder") or {}).get("random_move_probability", {})
    return "; ".join(f"p={p}: " + " / ".join(f"{r['win']:.2f}-{r['draw']:.2f}-{r['loss']:.2f}" for _, r in sorted(s.items()))
                     for p, s in lad.items())
def expl(y):
    e = y.get("exploitability")
    return f"{e['policy']:.4f} (uniform {e['uniform']:.4f})" if e else ""
for g in ("kuhn", "leduc", "ttt"):
    if not (R / f"untrained-{g}").is_dir():
        continue
    y = yard(R / f"untrained-{g}" / "eval.json")
    rows.append(f"| untrained ({g}) | 0 | {expl(y)} | {ladder(y)} |")
by_arm = {}
for d in sorted(R.glob("*-seed*/")):
    evals = sorted((d / "evals").glob("*.json")) if (d / "evals").is_dir() else []
    y = yard(evals[-1]) if evals else {}
    steps = max((json.loads(x).get("step", 0) for x in open(d / "metrics.jsonl") if x.strip()), default=0) \
        if (d / "metrics.jsonl").is_file() else 0
    rows.append(f"| {d.name} | {steps} | {expl(y)} | {ladder(y)} |")
    if y.get("exploitability"):
        by_arm.setdefault(d.name.rsplit("-seed", 1)[0], []).append(y["exploitability"]["policy"])
rows.append("")
for arm, xs in by_arm.items():
    rows.append(f"{arm}: exploitability mean {statistics.mean(xs):.4f}, range {min(xs):.4f}-{max(xs):.4f} ({len(xs)} seeds)")
print("\n".join(rows))
PYEOF
cat "$OUT/spiel.md"
tar czf "$OUT/spiel.tgz" --exclude='checkpoints' --exclude='*.safetensors' "$R" 2>/dev/null
