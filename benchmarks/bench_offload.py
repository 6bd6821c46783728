"""Offload on one GPU: four full Qwen2.5-0.5B-shaped policies (the math team, one policy per agent),
bf16 with fp32 masters and a reference model each (KL), trained 2 steps with nothing offloaded,
with ``offload_optimizer``, with ``offload_optimizer`` + ``offload_reference``, and with all three
of those plus ``offload_weights``.

    source scripts/gpu/setup.sh && python3 benchmarks/bench_offload.py

Each side runs in its own child process (clean peak-memory counters) and reports the peak GPU
memory allocated, the rollout and update seconds of the second step, and the seconds and GB
spent moving optimizer state. Random weights (built from config), EOS ignored, 64 new tokens.
What differs between the sides: with offload_optimizer, each policy's fp32 masters and AdamW
moments live in pinned CPU memory except during that policy's own update (moved in before, out
after); with offload_reference, its reference model too, except for its pass before the update;
with offload_weights, its bf16 weights (and the engine's KV cache, fused weight copies and
CUDA graphs, rebuilt when it next generates) too, except while it generates or updates, so during
one policy's update the other three hold nothing on the GPU. Peaks are reported for the rollout and
the update of the second step separately.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from masrl.families import config_path

ROOT = Path(__file__).resolve().parents[1]


def child(side: int, out: str) -> None:
    import asyncio
    import time

    import torch
    import yaml

    from masrl.config import load_config
    from masrl.driver.run.loop import Trainer

    data = yaml.safe_load(config_path("math/team_four_policies").read_text())
    data.update(model="random-qwen2.5-0.5b", device="cuda", precision="bf16", output_dir=out)
    offload = side > 0
    for p in data["policies"].values():
        p["offload_optimizer"] = offload
        p["offload_reference"] = side > 1
        p["offload_weights"] = side > 2
    for a in data["agents"].values():
        a.update(max_new_tokens=64, ignore_eos=True, temperature=1.0)
    data["rollout"] = {"tasks_per_step": 8, "samples_per_task": 4}
    data["train"] = {"steps": 2, "eval_before": False, "eval_after": False, "save_every": 100}
    data["algorithm"] = {"micro_batch_size": 16, "kl_coef": 0.01}  # a reference model per policy, as with KL
    # random weights earn no task reward: a pseudo-random reward per completion gives every group
    # variance, so every policy really updates (an all-zero group would skip its update)
    data["rewards"] = [{"type": "harness:task_hash_reward"}]
    tr = Trainer(load_config(data=data), run_dir=Path(out))
    tr.prepare(resume=False)
    peaks = {}
    update = tr.rt.controller.update

    def timed_update(traces=None):  # the rollout's peak, then the update's
        peaks["rollout"] = torch.cuda.max_memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        out = update(traces)
        peaks["update"] = torch.cuda.max_memory_allocated()
        return out

    tr.rt.controller.update = timed_update
    t0 = time.perf_counter()
    recs = [asyncio.run(tr.train_step())]
    print(f"[bench] side {side}: step 1 done at {time.perf_counter() - t0:.1f}s", file=sys.stderr, flush=True)
    torch.cuda.reset_peak_memory_stats()
    recs.append(asyncio.run(tr.train_step()))
    print(f"[bench] side {side}: step 2 done at {time.perf_counter() - t0:.1f}s", file=sys.stderr, flush=True)
    last = recs[-1]
    pol = last["policies"].values()
    print(json.dumps({
        "side": ["all on GPU", "offload_optimizer", "offload_optimizer + offload_reference",
                 "optimizer + reference + offload_weights"][side],
        "peak_gb": max(peaks.values()) / 2**30, "rollout_peak_gb": peaks["rollout"] / 2**30,
        "update_peak_gb": peaks["update"] / 2**30,
        "rollout_s": last["rollout_s"], "update_s": last["update_s"],
        "offload_s": sum(p.get("offload_s", 0.0) + p.get("reference_offload_s", 0.0) for p in pol),
        "offload_gb": sum(p.get("offload_gb", 0.0) for p in pol),
        "weights_s": sum(p.get("weights_offload_s", 0.0) for p in pol),
        "weights_gb": sum(p.get("weights_offload_gb", 0.0) for p in pol),
        "policies": len(last["policies"]), "optimizer_steps": sum(p["optimizer_steps"] for p in pol)}))


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(int(sys.argv[2]), sys.argv[3])
        return
    import torch

    sides = [int(a) for a in sys.argv[1:]] or [0, 1, 2, 3]  # a subset: `bench_offload.py 0 3`
    rows = []
    for off in sides:
        res = subprocess.run([sys.executable, __file__, "--child", str(off), f"/tmp/bench_offload_{off}"],
                             capture_output=True, text=True, cwd=ROOT)
        if res.returncode:
            print(res.stdout[-2000:], res.stderr[-4000:])
            raise SystemExit(f"child offload={off} failed")
        rows.append(json.loads(res.stdout.strip().splitlines()[-1]))
        print(json.dumps(rows[-1]), flush=True)  # each side as it finishes
    by_side = dict(zip(sides, rows))
    print(f"command: python3 benchmarks/bench_offload.py {' '.join(sys.argv[1:])}\n"
          f"machine: {torch.cuda.get_device_name(0)}, torch "
          f"{torch.__version__}\nworkload: math team, 4 full policies of Qwen2.5-0.5B's shape, bf16 + fp32 masters, "
          f"a reference model each (kl_coef 0.01), 8 tasks x 4 samples x 4 agents, 64 new tokens; second of 2 steps\n")
    print("| side | peak GPU memory (GB): rollout / update | rollout s | update s | moving optimizer + reference s "
          "| optimizer state moved (GB) | moving weights s | weights moved (GB) | optimizer steps |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['side']} | {r['rollout_peak_gb']:.2f} / {r['update_peak_gb']:.2f} | {r['rollout_s']:.2f} | "
              f"{r['update_s']:.2f} | {r['offload_s']:.2f} | {r['offload_gb']:.2f} | {r['weights_s']:.2f} | "
              f"{r['weights_gb']:.2f} | {r['optimizer_steps']:.0f} |")
    base = by_side.get(0)
    for name, r in [(n, by_side[i]) for i, n in ((1, "offload_optimizer"), (2, "+ reference"), (3, "+ weights"))
                    if i in by_side and base]:
        print(f"ratios ({name} / all on GPU): peak memory {r['peak_gb'] / base['peak_gb']:.2f}, "
              f"update peak {r['update_peak_gb'] / base['update_peak_gb']:.2f}, rollout time "
              f"{r['rollout_s'] / base['rollout_s']:.2f}, update time {r['update_s'] / base['update_s']:.2f}")


if __name__ == "__main__":
    main()
