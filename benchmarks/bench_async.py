"""Synchronous against asynchronous rollouts, same config, same run: trained calls (samples) per second.

Each mode trains ``--steps`` updates after one warm-up update, in a process of its own, on the same
workload; rewards are a hash of each completion (random weights never answer right, and a hash keeps
every group's variance), so this measures throughput, not learning.

Workloads (``--workload``):
  solver     one call per task: bench_gpu.py's GRPO shape (64 tasks x 8 samples x 256 tokens on the
             0.5B shape) when run with ``--tasks 64 --samples 8 --tokens 256``;
  team       the math team (four agents, one policy): fixed turns;
  long_tail  benchmarks/long_tail.py: 1 to ``--max-turns`` turns per episode (geometric), so a
             synchronous step waits for its longest episode.

Modes (``--modes``, comma separated):
  sync              generate every episode of a step, then update;
  async             rollout.mode async, rollout.overlap_update on: the engine samples from its own copy
                    of the weights while the update runs (on CUDA in a stream of its own);
  async-turns       rollout.mode async, overlap_update off: episodes run on while the update waits for
                    the engine's batch and the engine waits for the update (the compute lock);
  async-sN          async with policies.shared.max_staleness N (older calls are dropped and counted).
  MODE@ENGINE       any mode with rollout.engine ENGINE (sync@paged, async@paged): default auto (paged on CUDA).
  MODE@ENGINE@torch the same with torch's ``sample_tokens`` in place of the fused sampler (sync@paged@torch).

``--rollout-device cuda:1`` (policies.X.rollout_device) trains on ``--device`` and samples on the
other GPU, in every mode: the synchronous step still does one after the other, the asynchronous
loop does both at once.

    python benchmarks/bench_async.py [--workload team] [--model tiny-random] [--device cpu] [--steps 4]
        [--tasks 8] [--samples 4] [--tokens 32] [--modes sync,async,async-turns]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

TEAM = ["solver", "verifier", "refiner", "finalizer"]
WORKFLOWS = {"solver": ("math_solver", ["solver"]), "team": ("math_team", TEAM), "team_two": ("math_team", TEAM),
             "long_tail": ("long_tail:LongTail", ["agent"])}


def policy_of(workload: str, agent: str) -> str:
    """team_two: solver and verifier on one policy, refiner and finalizer on another; else one policy."""
    if workload == "team_two":
        return "reasoner" if agent in ("solver", "verifier") else "writer"
    return "shared"


def config(a, mode: str) -> dict:
    mode, _, engine = mode.partition("@")
    engine = engine.partition("@")[0]
    wf, agents = WORKFLOWS[a.workload]
    per_step = a.tasks * a.samples
    names = sorted({policy_of(a.workload, n) for n in agents})
    data = {"name": f"bench_async_{mode}", "model": a.model, "device": a.device, "precision": a.precision,
            "policies": {p: {"optim": {"lr": 1e-6}} | ({"rollout_device": a.rollout_device} if a.rollout_device else {})
                         for p in names},
            "agents": {n: {"policy": policy_of(a.workload, n), "temperature": 1.0, "max_new_tokens": a.tokens}
                       for n in agents},
            "runtime": {"placement": a.placement},
            "workflow": {"name": wf, "options": {"max_turns": a.max_turns, "long_every": a.long_every}
                         if a.workload == "long_tail" else {}},
            "data": {"train": {"source": "arithmetic", "n": 5000, "seed": 1},
                     "eval": {"source": "arithmetic", "n": 4, "seed": 2}},
            "rollout": {"tasks_per_step": a.tasks, "samples_per_task": a.samples, "mode": "sync",
                        "max_in_flight": 2 * per_step, "max_batch_size": a.max_batch or per_step,
                        "engine": engine or "auto"},
            "rewards": [{"type": "harness:task_hash_reward"}],
            "algorithm": {"micro_batch_tokens": a.micro_batch_tokens},
            "train": {"steps": a.steps + 1, "eval_before": False, "eval_after": False, "save_every": 0}}
    if mode != "sync":
        data["rollout"]["mode"] = "async"
        data["rollout"]["overlap_update"] = mode != "async-turns"
        if mode.startswith("async-s"):
            for p in names:
                data["policies"][p]["max_staleness"] = int(mode[len("async-s"):])
    return data


def child(a, mode: str) -> dict:
    """One mode, in this process: trained calls/s over ``--steps`` updates after a warm-up."""
    import torch

    from masrl.config import load_config
    from masrl.driver.run.loop import Trainer

    def sync():
        if torch.cuda.is_available():
            torch.cuda.synchronize()

    if mode.count("@") == 2 and mode.endswith("@torch"):  # the engines' start-up check turns the fused sampler off
        from masrl.engines.paged.kernels import sample as sample_kernel

        sample_kernel.check = lambda device, dtype: {"sample": "off: torch's sampler asked for (bench_async)"}
    tr = Trainer(load_config(data=config(a, mode), overrides=a.set), run_dir=Path(a.run_dir) / mode)
    tr.prepare(resume=False)

    async def go():
        rollouts = tr.async_rollouts() if not mode.startswith("sync") else None

        async def step():
            return await (tr.async_step(rollouts) if rollouts else tr.train_step())

        await step()  # warm-up: graphs captured, kernels tuned
        sync()
        before = engine_counts(tr)
        t0 = time.perf_counter()
        recs = []
        for i in range(a.steps):
            if a.profile and i == a.steps - 1:
                recs.append(await profiled(step, Path(a.profile) / f"{mode.replace('@', '-')}.txt"))
            else:
                recs.append(await step())
            recs[-1]["t"] = time.perf_counter() - t0
        sync()
        dt = time.perf_counter() - t0
        after = engine_counts(tr)
        if rollouts:
            await rollouts.stop()
        await tr.rt.controller.aclose()
        pol = [m for r in recs for m in r["policies"].values()]
        return {"calls_s": sum(p.get("n_seqs", 0) for p in pol) / dt, "seconds": dt,
                "tokens_s": sum(p.get("trained_tokens", 0) for p in pol) / dt,
                "staleness": sum(p.get("staleness_mean", 0.0) for p in pol) / max(1, len(pol)),
                "dropped": sum(p.get("stale_dropped", 0.0) for p in pol),
                "during_update": sum(r.get("async", {}).get("calls_during_update", 0) for r in recs),
                "update_s": sum(r.get("update_s", 0.0) for r in recs) / max(1, len(recs)),  # the step's, wall
                "rollout_s": sum(r.get("rollout_s", 0.0) for r in recs) / max(1, len(recs)),
                "peak_gb": max([p.get("gpu_peak_gb", 0.0) for p in pol], default=0.0),
                "engine_per_step": {k: round((after[k] - before.get(k, 0)) / a.steps, 1) for k in after}}

    try:
        return asyncio.run(go())
    finally:
        tr.rt.close()


def engine_counts(tr) -> dict:
    """The in-process engines' counters summed (decode steps, prefill steps, tokens...): what a step did."""
    out: dict = {}
    for w in tr.rt.workers:
        eng = getattr(w, "engine", None)
        sched = getattr(eng, "sched", None)
        for src in (getattr(eng, "stats", {}), getattr(sched, "stats", None) or {}):
            for k, v in src.items():
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    out[k] = out.get(k, 0) + v
    return out


async def profiled(step, path: Path) -> dict:
    """One step under torch's profiler: its wall time, the share of it the GPU ran a kernel (the union of
    the kernels' intervals, any stream), and the ops that took the most host and device time, to ``path``."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    path.parent.mkdir(parents=True, exist_ok=True)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    t0 = time.perf_counter()
    with profile(activities=acts) as prof:
        rec = await step()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    spans = sorted((e.time_range.start, e.time_range.end) for e in prof.events()
                   if e.device_type.name == "CUDA" and e.time_range.end > e.time_range.start)
    busy, end = 0.0, -1.0
    for lo, hi in spans:  # microseconds
        if hi > end:
            busy += hi - max(lo, end)
            end = hi
    ka = prof.key_averages()
    head = (f"step wall {wall:.3f} s; GPU busy {busy / 1e6:.3f} s ({busy / 1e6 / wall:.0%}); "
            f"rollout_s {rec.get('rollout_s', 0):.3f}, update_s {rec.get('update_s', 0):.3f}\n")
    path.write_text(head + ka.table(sort_by="self_cpu_time_total", row_limit=30) + "\n"
                    + (ka.table(sort_by="self_device_time_total", row_limit=20) if torch.cuda.is_available() else ""))
    print("PROFILE " + head.strip(), flush=True)
    return rec


def run_child(mode: str, argv: list[str], run_dir: str) -> dict:
    cmd = [sys.executable, __file__, *argv, "--child", mode, "--run-dir", run_dir]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    for x in proc.stdout.splitlines():
        if x.startswith("PROFILE "):
            print(f"  {mode}: {x[8:]}", flush=True)
    if proc.returncode != 0 or not lines:
        tail = proc.stderr.strip().splitlines()[-8:]
        print(f"  {mode} failed ({proc.returncode}):\n    " + "\n    ".join(tail), flush=True)
        return {"error": tail[-1] if tail else f"exit {proc.returncode}"}
    return json.loads(lines[-1][len("RESULT "):])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workload", choices=sorted(WORKFLOWS), default="team")
    ap.add_argument("--model", default="tiny-random")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--precision", default="auto")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--tasks", type=int, default=8)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--max-turns", type=int, default=8)
    ap.add_argument("--long-every", type=int, default=0, help="long_tail: one call in N may run to --tokens, the "
                                                               "others to an eighth of it (0: every call to --tokens)")
    ap.add_argument("--max-batch", type=int, default=0, help="engine batch; default tasks x samples")
    ap.add_argument("--micro-batch-tokens", type=int, default=4096)
    ap.add_argument("--rollout-device", help="policies.X.rollout_device: the engine samples on this device (cuda:1) "
                                             "while the policy trains on --device")
    ap.add_argument("--placement", choices=["local", "ray"], default="local",
                    help="ray: a Ray actor per policy (team_two on two GPUs: one each)")
    ap.add_argument("--modes", default="sync,async,async-turns")
    ap.add_argument("--switch-ms", type=float, default=0.0,
                    help="sys.setswitchinterval in each mode's process, in ms (Python's default is 5)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a config override for every mode (rollout.graph_prefill=true), as the CLI takes them")
    ap.add_argument("--child")
    ap.add_argument("--run-dir")
    ap.add_argument("--json")
    ap.add_argument("--profile", help="a folder: each mode's last step runs under torch's profiler, its summary there")
    a = ap.parse_args()
    if a.child:
        if a.switch_ms:
            sys.setswitchinterval(a.switch_ms / 1000)
        print("RESULT " + json.dumps(child(a, a.child)), flush=True)
        return
    argv = [x for x in sys.argv[1:]]
    modes = a.modes.split(",")
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for mode in modes:
            out[mode] = run_child(mode, argv, tmp)
            print(f"  {mode}: {out[mode]}", flush=True)
    import torch

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
    print(f"\ncommand: python benchmarks/bench_async.py {' '.join(argv)}\n"
          f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, "
          f"GPU {gpu}")
    layout = f"{a.placement}" + (f", trains on {a.device}, samples on {a.rollout_device}" if a.rollout_device else "")
    print(f"workload {a.workload} ({layout}), model {a.model} ({a.precision}), {a.steps} updates of {a.tasks} "
          f"tasks x {a.samples} samples, {a.tokens} new tokens per call at most\n")
    print(f"| mode | trained calls/s | trained tok/s | seconds | vs {modes[0]} | mean staleness | stale dropped "
          "| calls sampled during updates | update s | peak GiB |\n" + "| --- " * 10 + "|")
    base = out.get(modes[0], {}).get("calls_s")  # the first mode listed is the baseline
    for mode, r in out.items():
        if "error" in r:
            print(f"| {mode} | failed: {r['error'][:80]} |" + " |" * 8)
            continue
        ratio = f"{r['calls_s'] / base:.2f}x" if base else "-"
        print(f"| {mode} | {r['calls_s']:.1f} | {r['tokens_s']:,.0f} | {r['seconds']:.1f} | {ratio} | {r['staleness']:.2f} "
              f"| {r['dropped']:.0f} | {r['during_update']} | {r['update_s']:.2f} | {r['peak_gb']:.1f} |")
    if a.json:
        Path(a.json).write_text(json.dumps({"argv": argv, "gpu": gpu, "results": out}, indent=2))


if __name__ == "__main__":
    main()
