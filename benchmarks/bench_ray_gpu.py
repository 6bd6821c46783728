"""Placement on GPUs: two policies on one GPU in one process (``placement: local``) against two
policies in two Ray actors on two GPUs (``placement: ray``); and one policy on one GPU against the
same policy data-parallel on two GPUs (``data_parallel: 2``, NCCL for gradients, gloo for the
exchanged samples).

    source scripts/gpu/setup.sh && bash scripts/gpu/ray_install.sh && python3 benchmarks/bench_ray_gpu.py

Workload: the math team (four agents) on Qwen2.5-0.5B-shaped policies with random weights, bf16
with fp32 masters, 8 tasks x 4 samples a step (128 calls), 64 new tokens each (EOS ignored), a
pseudo-random reward per task so that every group has variance and every policy updates. Each
side runs in its own child process with the same seed; the table gives each step's wall time,
rollout and update seconds, and for the Ray sides the driver<->actor traffic the loop records
(round trips, pickled bytes each way) and the time those bytes take to move: an echo actor on the
same cluster is timed with payloads of the step's mean size per round trip, times the step's
round trips (an upper bound: the run overlaps many of its calls). With one GPU visible, the Ray
sides share it (``num_gpus: 0.5`` each) and the table says so. ``--model tiny-random --device cpu``
runs the same sides on a CPU, to check the script.
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

from masrl.families import config_path

ROOT = Path(__file__).resolve().parents[1]
SIDES = {  # name: (config, placement, data_parallel)
    "two policies, local": ("math/team_two_policies", "local", 1),
    "two policies, ray": ("math/team_two_policies", "ray", 1),
    "one policy, local": ("math/team_shared", "local", 1),
    "one policy, ray, data_parallel 2": ("math/team_shared", "ray", 2),
    "one policy, ray, data_parallel 2, shard_optimizer": ("math/team_shared", "ray", 2),
}


def _echo_seconds(payload_bytes: int, trips: int, reps: int = 20) -> float:
    """Seconds Ray takes for ``trips`` round trips of ``payload_bytes`` each way, measured."""
    import ray

    @ray.remote(num_cpus=0)
    class Echo:
        def echo(self, x):
            return x

    e = Echo.remote()
    blob = os.urandom(max(1, payload_bytes))
    ray.get(e.echo.remote(blob))  # warm
    t0 = time.perf_counter()
    for _ in range(reps):
        ray.get(e.echo.remote(blob))
    per = (time.perf_counter() - t0) / reps
    ray.kill(e)
    return per * trips


def child(side: str, model: str, device: str, steps: int, gpus: int, out: str) -> None:
    import yaml

    from masrl.config import load_config
    from masrl.driver.run.loop import Trainer

    config, placement, ranks = SIDES[side]
    data = yaml.safe_load(config_path(config).read_text())
    data.update(model=model, device=device, output_dir=out, seed=0)
    if device == "cuda":
        data["precision"] = "bf16"
    for p in data["policies"].values():
        p.pop("model", None)
        if placement == "ray":
            p["num_gpus"] = (1.0 if gpus >= 2 else 0.5) if device == "cuda" else 0.0
            p["data_parallel"] = ranks
            p["shard_optimizer"] = "shard_optimizer" in side
    for a in data["agents"].values():
        a.update(max_new_tokens=64 if device == "cuda" else 12, ignore_eos=True, temperature=1.0)
    data["rollout"] = {"tasks_per_step": 8, "samples_per_task": 4}
    data["train"] = {"steps": steps, "eval_before": False, "eval_after": False, "save_every": 100}
    data["algorithm"] = {"micro_batch_size": 16}
    data["rewards"] = [{"type": "harness:task_hash_reward"}]
    data["runtime"] = {"placement": placement, "address": "local"}
    t0 = time.perf_counter()
    tr = Trainer(load_config(data=data), run_dir=Path(out))
    tr.prepare(resume=False)
    setup_s = time.perf_counter() - t0
    print(f"[bench] {side}: ready in {setup_s:.1f}s", file=sys.stderr, flush=True)
    rows = []
    try:
        for _ in range(steps):
            t0 = time.perf_counter()
            rec = asyncio.run(tr.train_step())
            row = {"step_s": time.perf_counter() - t0, "rollout_s": rec["rollout_s"], "update_s": rec["update_s"],
                   "reward": rec["rollout"]["reward"],
                   "loss": {p: m["loss"] for p, m in sorted(rec["policies"].items())},
                   "adam_gb": sum(m.get("optimizer_state_gb", 0) for m in rec["policies"].values()),
                   "peak_gb": max(m.get("gpu_peak_gb", 0) for m in rec["policies"].values()),
                   "calls": sum(a["calls"] for a in rec["rollout"]["agents"].values())}
            if "transfer" in rec:
                row.update(rec["transfer"])
                trips = rec["transfer"]["round_trips"]
                size = (rec["transfer"]["bytes_to_actors"] + rec["transfer"]["bytes_from_actors"]) // (2 * trips)
                row["moving_s"] = _echo_seconds(size, trips)
            rows.append(row)
            print(f"[bench] {side}: step {len(rows)} {row['step_s']:.2f}s", file=sys.stderr, flush=True)
        fingerprints = {p: w.fingerprint(p) for w in tr.rt.workers for p in w.trainable_names}
        asyncio.run(tr.rt.controller.aclose())
    finally:
        tr.rt.close()
    print(json.dumps({"side": side, "setup_s": setup_s, "steps": rows, "fingerprints": fingerprints}))


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        _, _, side, model, device, steps, gpus, out = sys.argv
        child(side, model, device, int(steps), int(gpus), out)
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="random-qwen2.5-0.5b")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--sides", nargs="+", default=list(SIDES))
    ap.add_argument("--json", help="also append each side's result to this file")
    a = ap.parse_args()
    gpus = 0
    if a.device == "cuda":
        import torch

        gpus = torch.cuda.device_count()
    res = {}
    for side in a.sides:
        out = f"/tmp/bench_ray_gpu_{os.getpid()}_{len(res)}"
        t0 = time.perf_counter()
        p = subprocess.run([sys.executable, __file__, "--child", side, a.model, a.device, str(a.steps), str(gpus), out],
                           capture_output=True, text=True, cwd=ROOT)
        if p.returncode:
            print(p.stdout[-2000:], p.stderr[-6000:])
            print(f"[bench] {side}: failed after {time.perf_counter() - t0:.0f}s")
            continue
        res[side] = json.loads(p.stdout.strip().splitlines()[-1])
        print(json.dumps(res[side]), flush=True)
        if a.json:
            with open(a.json, "a") as f:
                f.write(json.dumps(res[side]) + "\n")
    names = [torch.cuda.get_device_name(0)] * gpus if gpus else [platform.processor() or platform.machine()]
    print(f"\ncommand: python3 benchmarks/bench_ray_gpu.py --model {a.model} --device {a.device} --steps {a.steps}\n"
          f"machine: {gpus} x {names[0]} GPU(s), {os.cpu_count()} CPU cores, Python {platform.python_version()}"
          + ("" if gpus >= 2 or a.device != "cuda" else "; ONE GPU: the ray sides share it (num_gpus 0.5 each)") + "\n")
    print("| side | setup s | step | step s | rollout s | update s | round trips | bytes driver->actors | "
          "bytes actors->driver | moving s (echo-timed) | AdamW state GB per process | peak GPU GB per process | "
          "loss per policy |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for side, r in res.items():
        for i, s in enumerate(r["steps"], 1):
            ray_cols = (f"{s['round_trips']} | {s['bytes_to_actors']} | {s['bytes_from_actors']} | {s['moving_s']:.3f}"
                        if "round_trips" in s else "- | - | - | -")
            loss = ", ".join(f"{p} {v:.3g}" for p, v in s["loss"].items())
            print(f"| {side} | {r['setup_s']:.1f} | {i} | {s['step_s']:.2f} | {s['rollout_s']:.2f} | {s['update_s']:.2f} | "
                  f"{ray_cols} | {s['adam_gb']:.2f} | {s['peak_gb']:.2f} | {loss} |")
    for a_, b_ in (("two policies, local", "two policies, ray"), ("one policy, local", "one policy, ray, data_parallel 2"),
                   ("one policy, ray, data_parallel 2", "one policy, ray, data_parallel 2, shard_optimizer")):
        if a_ in res and b_ in res:
            fa, fb = res[a_]["fingerprints"], res[b_]["fingerprints"]
            ra = [s["reward"] for s in res[a_]["steps"]]
            rb = [s["reward"] for s in res[b_]["steps"]]
            gap = max(abs(x - y) / max(abs(y), 1e-12) for p in fa for x, y in zip(fb[p], fa[p]))
            print(f"\n{b_} vs {a_}: rewards {rb} vs {ra}; weight fingerprints (sum, sum of squares per policy) "
                  f"{fb} vs {fa}: largest relative gap {gap:.1e}")


if __name__ == "__main__":
    main()
