"""Synchronous against asynchronous rollouts, same config, same run: trained calls per second.

The math team (four agents on one policy) with a reward that keeps group variance, random
weights; ``--steps`` updates of ``--tasks`` tasks x ``--samples`` samples each side, after one
warm-up update. Prints trained calls/s for both and their ratio, with each side's mean staleness.
On one device the engine and the optimizer take turns (the compute lock), so async can only win
the time the synchronous step spends waiting for its slowest trace and between phases; policies
on other devices (Ray) would also overlap generation with the update itself.

    python benchmarks/bench_async.py [--model tiny-random] [--steps 4] [--tasks 8] [--samples 4] [--tokens 32]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))


def config(model: str, mode: str, a) -> dict:
    agent = {"policy": "shared", "temperature": 1.0, "max_new_tokens": a.tokens}
    return {"name": f"bench_async_{mode}", "model": model, "policies": {"shared": {}},
            "agents": {n: dict(agent) for n in ("solver", "verifier", "refiner", "finalizer")},
            "workflow": {"name": "math_team"},
            "data": {"train": {"source": "arithmetic", "n": 2000, "seed": 1},
                     "eval": {"source": "arithmetic", "n": 4, "seed": 2}},
            "rollout": {"tasks_per_step": a.tasks, "samples_per_task": a.samples, "mode": mode, "max_in_flight": 256,
                        "max_batch_size": 256},
            "rewards": [{"type": "helpers:task_hash_reward"}], "algorithm": {"micro_batch_size": 16},
            "train": {"steps": a.steps + 1, "eval_before": False, "eval_after": False, "save_every": 0}}


def measure(model: str, mode: str, a, run_dir: Path) -> dict:
    from masrl.config import load_config
    from masrl.driver.async_loop import AsyncRollouts, async_step
    from masrl.driver.loop import Trainer

    tr = Trainer(load_config(data=config(model, mode, a)), run_dir=run_dir)
    tr.prepare(resume=False)

    async def go():
        rollouts = AsyncRollouts(tr) if mode == "async" else None

        async def step():
            return await (async_step(tr, rollouts) if rollouts else tr.train_step())

        await step()  # warm-up
        t0 = time.perf_counter()
        recs = [await step() for _ in range(a.steps)]
        dt = time.perf_counter() - t0
        if rollouts:
            await rollouts.stop()
        await tr.rt.controller.aclose()
        trained = sum(r["policies"]["shared"]["n_seqs"] for r in recs if "shared" in r["policies"])
        stale = [r["policies"]["shared"].get("staleness_mean", 0.0) for r in recs if "shared" in r["policies"]]
        return {"calls_s": trained / dt, "seconds": dt, "staleness": sum(stale) / max(1, len(stale))}

    try:
        return asyncio.run(go())
    finally:
        tr.rt.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="tiny-random")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--tasks", type=int, default=8)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=32)
    a = ap.parse_args()
    import torch

    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for mode in ("sync", "async"):
            out[mode] = measure(a.model, mode, a, Path(tmp) / mode)
    print(f"command: python benchmarks/bench_async.py {' '.join(sys.argv[1:])}\n"
          f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, "
          f"cuda {torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'none'}")
    print(f"math team, model {a.model}, {a.steps} updates of {a.tasks} tasks x {a.samples} samples, "
          f"{a.tokens} new tokens per call at most\n")
    print("| mode | trained calls/s | seconds | mean staleness (versions) |\n| --- | --- | --- | --- |")
    for mode, r in out.items():
        print(f"| {mode} | {r['calls_s']:.1f} | {r['seconds']:.1f} | {r['staleness']:.2f} |")
    print(f"\nasync / sync: {out['async']['calls_s'] / out['sync']['calls_s']:.2f}x")


if __name__ == "__main__":
    main()
