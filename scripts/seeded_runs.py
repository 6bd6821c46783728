"""Seeded tiny-random runs whose numbers a refactor must not move: the demo team (3 steps), a LoRA team, a
game (OpenSpiel's Kuhn Poker) and two policies in two Ray actors, each built as the integration tests build
them (``tests/integration/tinycfg.py``: tiny sizes, a reward that reads the completions).

    .venv/bin/python scripts/seeded_runs.py runs/before          # on the commit before the change
    .venv/bin/python scripts/seeded_runs.py runs/after           # on the change
    .venv/bin/python benchmarks/same_numbers.py --tol 0 runs/before/demo runs/after/demo \
        runs/before/lora runs/after/lora runs/before/game runs/after/game runs/before/ray2 runs/after/ray2

Names after the folder run only those runs (``demo lora game ray2``). About 35 s on 2 CPU cores.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUNS = {
    "demo": dict(base="math/team_shared", steps=3),
    "lora": dict(base="math/team_lora", steps=3),
    "game": dict(base="games/spiel_kuhn_poker_selfplay", steps=3),
    "ray2": dict(base="math/team_two_policies", steps=2, ray=True),
}


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1].startswith("-"):
        sys.exit(__doc__)
    sys.path[:0] = [str(ROOT / "tests" / "integration"), str(ROOT / "tests")]  # tinycfg and its reward
    from tinycfg import tiny_config

    from masrl.config import load_config
    from masrl.driver.run.loop import train

    out = Path(sys.argv[1])
    for name in sys.argv[2:] or list(RUNS):
        if name not in RUNS:
            sys.exit(f"no run '{name}': the runs are {', '.join(RUNS)}")
        r = RUNS[name]
        data = tiny_config(r["base"], out / name, steps=r["steps"], threads=1, seed=0)
        data["train"]["eval_after"] = True
        if r.get("ray"):
            data["runtime"] = {"placement": "ray", "address": "local"}
        train(load_config(data=data))
        print(f"[seeded_runs] {name} -> {out / name}", flush=True)


if __name__ == "__main__":  # (reward processes are spawned: they import this file again)
    main()
