#!/usr/bin/env bash
# On the GPU host, after `source scripts/gpu/setup.sh`, the SmolLM2 install and the environment standards' wheels
# (.gpu-env: python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpu-env/*.whl): one environment of
# each standard that runs without network, trained from its shipped config, every seed side by side on one GPU,
# held-out score before and after (eval_before.json / eval_after.json):
#   guess: examples/openenv_guess.yaml, an OpenEnv Environment (workflow openenv), success rate in 4 guesses;
#   zoo:   games/zoo_tictactoe_selfplay, PettingZoo's tictactoe_v3 (workflow pettingzoo), score against random.
# (verifiers' seats run harness programs that uv builds from the package index: that row runs on a CPU with network.)
# ARMS ("guess zoo"), SEEDS ("0 1 2"), STEPS (cap), LIMIT (seconds a run; train.time_limit_s stops it LIMIT/6
# before), EXTRA (overrides for every run), PY. Writes $OUT/env_standards.md and $OUT/env_standards.tgz.
set -uo pipefail
PY=${PY:-python3}; STEPS=${STEPS:-200}; SEEDS=${SEEDS:-"0 1 2"}; LIMIT=${LIMIT:-300}; OUT=${OUT:-out}
TL=$(( LIMIT - LIMIT / 6 ))
R=${RUNS:-runs/env-standards-$(date +%s)}
mkdir -p "$R" "$OUT"
cfg_of() { case $1 in guess) echo examples/openenv_guess.yaml ;; zoo) echo games/zoo_tictactoe_selfplay ;; esac; }
for a in ${ARMS:-guess zoo}; do
  for s in $SEEDS; do
    ( PYTHONPATH="examples:${PYTHONPATH:-}" timeout "$((LIMIT + 240))" "$PY" -m masrl.cli train "$(cfg_of "$a")" \
        "train.steps=$STEPS" train.eval_every=0 train.save_every=0 "train.time_limit_s=$TL" ${EXTRA:-} \
        "seed=$s" "name=$a" "output_dir=$R/$a-seed$s" > "$R/$a-seed$s.log" 2>&1 ) &
  done
done
wait
"$PY" - "$R" > "$OUT/env_standards.md" <<'PYEOF'
import json, statistics, sys
from pathlib import Path
R = Path(sys.argv[1])
def score(p):
    if not p.is_file():
        return None
    s = json.loads(p.read_text())
    return s.get("outcome", s.get("accuracy"))
print("| run | steps | held-out before | after |\n|---|---|---|---|")
arms = {}
for d in sorted(R.glob("*-seed*/")):
    steps = max((json.loads(x).get("step", 0) for x in open(d / "metrics.jsonl") if x.strip()), default=0) \
        if (d / "metrics.jsonl").is_file() else 0
    b, a = score(d / "eval_before.json"), score(d / "eval_after.json")
    print(f"| {d.name} | {steps} | {b} | {a} |")
    if a is not None and b is not None:
        arms.setdefault(d.name.rsplit("-seed", 1)[0], []).append((b, a))
for arm, v in arms.items():
    bs, as_ = [x for x, _ in v], [y for _, y in v]
    print(f"\n{arm}: before {statistics.mean(bs):.3f} ({min(bs):.3f}-{max(bs):.3f}), after {statistics.mean(as_):.3f} "
          f"({min(as_):.3f}-{max(as_):.3f}), {len(v)} seeds")
PYEOF
tar czf "$OUT/env_standards.tgz" "$R"/*.log "$R"/*/metrics.jsonl "$R"/*/eval_*.json 2>/dev/null
cat "$OUT/env_standards.md"
