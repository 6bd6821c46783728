"""Placement local vs ray on this machine: step time and the bytes that cross between the driver
and the actors per step, for 1, 2 and 4 policies (math team: one shared policy, two policies, one
per agent).

    .venv/bin/python benchmarks/bench_ray.py [--model tiny-random] [--steps 3]

Each side trains the same config and seed for ``--steps`` steps; the table reports the mean of the
steps after the first (the first includes warm-up). With ``ray`` each model host is an actor on a
local Ray cluster (127.0.0.1) started for the run, and every call's arguments and results are
counted as pickled bytes (what Ray serialises). What differs between the sides: ``local`` runs
every model in the trainer's process and updates policies one after another; ``ray`` runs each in
its own process, updates them at once, and pays a round trip per call. On a machine with fewer
cores than actors the actors compete for them, so read the ray column here as overhead, not as the
speed-up separate GPUs or nodes would give.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = {1: "math/team_shared", 2: "math/team_two_policies", 4: "math/team_four_policies"}


def child(n: int, placement: str, model: str, steps: int, out: str) -> None:
    import yaml

    from masrl.config import load_config
    from masrl.driver.run.loop import Trainer
    from masrl.families import config_path

    # the shipped config at a small size: 24 new tokens a call, 4 tasks x 4 samples a step, and a hash reward so
    # that random weights' groups have reward variance and every policy really updates
    data = yaml.safe_load(config_path(CONFIGS[n]).read_text())
    data.update(model=model, seed=0, threads=1, output_dir=out, runtime={"placement": placement, "address": "local"},
                rewards=[{"type": "outcome"}, {"type": "format", "weight": 0.5}, {"type": "harness:agent_hash_reward"}],
                train={"steps": steps, "save_every": 0, "eval_before": False, "eval_after": False},
                algorithm={"micro_batch_size": 4})
    data["data"] = {"train": {"source": "arithmetic", "n": 40, "seed": 1}, "eval": {"source": "arithmetic", "n": 3, "seed": 2}}
    for p in data["policies"].values():
        p.pop("model", None)
    for a in data["agents"].values():
        a["max_new_tokens"] = 24
    data["rollout"] = {"tasks_per_step": 4, "samples_per_task": 4, "max_wait_ms": 5}
    tr = Trainer(load_config(data=data), run_dir=Path(out))
    t0 = time.perf_counter()
    tr.prepare(resume=False)
    setup_s = time.perf_counter() - t0
    rows = []  # each step's record counts that step's driver <-> actor traffic only
    try:
        for _ in range(steps):
            t0 = time.perf_counter()
            rec = asyncio.run(tr.train_step())
            row = {"step_s": time.perf_counter() - t0, "rollout_s": rec["rollout_s"], "update_s": rec["update_s"],
                   "calls": sum(a["calls"] for a in rec["rollout"]["agents"].values())}
            if placement == "ray":  # the loop's per-step account of driver <-> actor traffic
                t = rec["transfer"]
                row["sent"], row["received"], row["round_trips"] = (t["bytes_to_actors"], t["bytes_from_actors"],
                                                                    t["round_trips"])
            rows.append(row)
        asyncio.run(tr.rt.controller.aclose())
    finally:
        tr.rt.close()
    later = rows[1:] or rows
    mean = {k: sum(r[k] for r in later) / len(later) for k in later[0]}
    print(json.dumps({"policies": n, "placement": placement, "setup_s": setup_s, **mean}))


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        _, _, n, placement, model, steps, out = sys.argv
        child(int(n), placement, model, int(steps), out)
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="tiny-random")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--policies", type=int, nargs="+", default=[1, 2, 4])
    a = ap.parse_args()
    res = {}
    for n in a.policies:
        for placement in ("local", "ray"):
            out = f"/tmp/bench_ray_{n}_{placement}_{os.getpid()}"
            p = subprocess.run([sys.executable, __file__, "--child", str(n), placement, a.model, str(a.steps), out],
                               capture_output=True, text=True, cwd=ROOT)
            if p.returncode:
                print(p.stdout[-2000:], p.stderr[-4000:])
                raise SystemExit(f"{n} policies, {placement}: failed")
            res[(n, placement)] = json.loads(p.stdout.strip().splitlines()[-1])
            print(json.dumps(res[(n, placement)]), flush=True)
    print(f"\ncommand: .venv/bin/python benchmarks/bench_ray.py --model {a.model} --steps {a.steps}\nmachine: "
          f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}\n"
          f"workload: math team, 4 tasks x 4 samples x 4 agents = 64 calls a step, 24 new tokens, threads=1 per "
          f"process; mean of steps 2..{a.steps}\n")
    print("| policies | local step s | ray step s | ray / local | ray rollout s | ray update s | round trips | "
          "bytes driver->actors | bytes actors->driver | bytes per call |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for n in a.policies:
        lo, ra = res[(n, "local")], res[(n, "ray")]
        print(f"| {n} | {lo['step_s']:.2f} | {ra['step_s']:.2f} | {ra['step_s'] / lo['step_s']:.2f} | "
              f"{ra['rollout_s']:.2f} | {ra['update_s']:.2f} | {ra['round_trips']:.0f} | {ra['sent']:.0f} | "
              f"{ra['received']:.0f} | {(ra['sent'] + ra['received']) / ra['calls']:.0f} |")


if __name__ == "__main__":
    main()
