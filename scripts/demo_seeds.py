"""One config over several seeds, mean and spread (the four-agent math team's table in docs/results.md).

    .venv/bin/python scripts/demo_seeds.py [--seeds 0 1 2] [--config math/team_shared] [--name N] [ARGS...]

Runs `masrl train CONFIG seed=S output_dir=runs/seeds/<config>-seed-S` for each seed (skipping runs that
already finished), then prints, per agent, held-out accuracy / format rate / mean reward before -> after
as the mean over seeds with the min-max range, and each seed's accuracy.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from statistics import mean

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--config", default="math/team_shared")
    ap.add_argument("--name", help="run folder prefix under runs/seeds/ (default: the config's file name)")
    ap.add_argument("overrides", nargs="*")
    a = ap.parse_args()
    name = a.name or Path(a.config).stem
    runs = {}
    for seed in a.seeds:
        out = ROOT / "runs" / "seeds" / f"{name}-seed-{seed}"
        if not (out / "eval_after.json").is_file():
            cmd = [sys.executable, "-m", "masrl.cli", "train", a.config, f"seed={seed}", f"output_dir={out}", *a.overrides]
            print("$", " ".join(cmd), flush=True)
            if out.exists():
                cmd.append("--resume")
            subprocess.run(cmd, cwd=ROOT, check=True)
        runs[seed] = {k: json.loads((out / f"eval_{k}.json").read_text()) for k in ("before", "after")}
    print(f"\nheld-out results of {a.config} over seeds {a.seeds}: before -> after, mean (min-max)")
    print("| agent | accuracy | format rate | mean reward |\n| --- | --- | --- | --- |")

    def cell(get):
        b = [get(r["before"]) for r in runs.values()]
        f = [get(r["after"]) for r in runs.values()]
        return f"{mean(b):.3f} ({min(b):.3f}-{max(b):.3f}) -> {mean(f):.3f} ({min(f):.3f}-{max(f):.3f})"

    fmt = lambda s: mean(x["format_rate"] for x in s["agents"].values())  # noqa: E731
    print(f"| all agents | {cell(lambda s: s['outcome'])} | {cell(fmt)} | {cell(lambda s: s['reward'])} |")
    first = next(iter(runs.values()))["after"]["agents"]
    for agent in first:
        print(f"| {agent} | {cell(lambda s, a=agent: s['agents'][a]['accuracy'])} | "
              f"{cell(lambda s, a=agent: s['agents'][a]['format_rate'])} | "
              f"{cell(lambda s, a=agent: s['agents'][a]['reward'])} |")
    calls = lambda s: sum(a["calls"] for a in s["agents"].values()) / max(1, s["traces"])  # noqa: E731
    train_calls = []
    for seed in runs:
        recs = [json.loads(x) for x in (ROOT / "runs" / "seeds" / f"{name}-seed-{seed}" / "metrics.jsonl").read_text()
                .splitlines() if '"rollout"' in x]
        train_calls += [sum(a["calls"] for a in r["rollout"]["agents"].values()) for r in recs]
    print(f"\nmodel calls per training step: {mean(train_calls):.1f} (min {min(train_calls)}, max {max(train_calls)}); "
          f"per held-out task: {cell(calls)}")
    print("\nper seed, accuracy before -> after: " + ", ".join(
        f"seed {s}: {r['before']['outcome']:.3f} -> {r['after']['outcome']:.3f}" for s, r in runs.items()))


if __name__ == "__main__":
    main()
