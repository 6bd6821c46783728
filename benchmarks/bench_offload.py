"""Offload on one GPU: four full Qwen2.5-0.5B-shaped policies (the math team, one policy per agent),
bf16 with fp32 masters and a reference model each (KL), trained 2 steps with nothing offloaded,
with ``offload_optimizer``, and with ``offload_optimizer`` + ``offload_reference``.

    source scripts/gpu_setup.sh && python3 benchmarks/bench_offload.py

Each side runs in its own child process (clean peak-memory counters) and reports the peak GPU
memory allocated, the rollout and update seconds of the second step, and the seconds and GB
spent moving optimizer state. Random weights (built from config), EOS ignored, 64 new tokens.
What differs between the sides: with offload_optimizer, each policy's fp32 masters and AdamW
moments live in pinned CPU memory except during that policy's own update (moved in before, out
after); with offload_reference, its reference model too, except for its pass before the update.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def child(side: int, out: str) -> None:
    import asyncio

    import torch
    import yaml

    from masrl.config import load_config
    from masrl.runtime.loop import Trainer

    data = yaml.safe_load((ROOT / "configs" / "math_team_four_policies.yaml").read_text())
    data.update(model="random-qwen2.5-0.5b", device="cuda", precision="bf16", output_dir=out)
    offload = side > 0
    for p in data["policies"].values():
        p["offload_optimizer"] = offload
        p["offload_reference"] = side > 1
    for a in data["agents"].values():
        a.update(max_new_tokens=64, ignore_eos=True, temperature=1.0)
    data["rollout"] = {"tasks_per_step": 8, "samples_per_task": 4}
    data["train"] = {"steps": 2, "eval_before": False, "eval_after": False, "save_every": 100}
    data["algorithm"] = {"micro_batch_size": 16, "kl_coef": 0.01}  # a reference model per policy, as with KL
    # random weights earn no task reward: a pseudo-random reward per completion gives every group
    # variance, so every policy really updates (an all-zero group would skip its update)
    sys.path.insert(0, str(ROOT / "tests"))
    data["rewards"] = [{"type": "helpers:task_hash_reward"}]
    tr = Trainer(load_config(data=data), run_dir=Path(out))
    tr.prepare(resume=False)
    torch.cuda.reset_peak_memory_stats()
    recs = [asyncio.run(tr.train_step()) for _ in range(2)]
    last = recs[-1]
    pol = last["policies"].values()
    print(json.dumps({
        "side": ["all on GPU", "offload_optimizer", "offload_optimizer + offload_reference"][side],
        "peak_gb": torch.cuda.max_memory_allocated() / 2**30,
        "rollout_s": last["rollout_s"], "update_s": last["update_s"],
        "offload_s": sum(p.get("offload_s", 0.0) + p.get("reference_offload_s", 0.0) for p in pol), "offload_gb": sum(p.get("offload_gb", 0.0) for p in pol),
        "policies": len(last["policies"]), "optimizer_steps": sum(p["optimizer_steps"] for p in pol)}))


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(int(sys.argv[2]), sys.argv[3])
        return
    import torch

    rows = []
    for off in (0, 1, 2):
        res = subprocess.run([sys.executable, __file__, "--child", str(off), f"/tmp/bench_offload_{off}"],
                             capture_output=True, text=True, cwd=ROOT)
        if res.returncode:
            print(res.stdout[-2000:], res.stderr[-4000:])
            raise SystemExit(f"child offload={off} failed")
        rows.append(json.loads(res.stdout.strip().splitlines()[-1]))
    base, off, both = rows
    print(f"command: python3 benchmarks/bench_offload.py\nmachine: {torch.cuda.get_device_name(0)}, torch "
          f"{torch.__version__}\nworkload: math team, 4 full policies of Qwen2.5-0.5B's shape, bf16 + fp32 masters, "
          f"a reference model each (kl_coef 0.01), 8 tasks x 4 samples x 4 agents, 64 new tokens; second of 2 steps\n")
    print("| side | peak GPU memory (GB) | rollout s | update s | of which moving state s | state moved per step (GB) "
          "| optimizer steps |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['side']} | {r['peak_gb']:.2f} | {r['rollout_s']:.2f} | "
              f"{r['update_s']:.2f} | {r['offload_s']:.2f} | {r['offload_gb']:.2f} | {r['optimizer_steps']:.0f} |")
    for name, r in (("offload_optimizer", off), ("both", both)):
        print(f"ratios ({name} / all on GPU): peak memory {r['peak_gb'] / base['peak_gb']:.2f}, "
              f"update time {r['update_s'] / base['update_s']:.2f}")


if __name__ == "__main__":
    main()
