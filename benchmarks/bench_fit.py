"""What fits one GPU: full fine-tuning of a big shape, one GRPO step, with and without optimizer offload.

    source scripts/gpu/setup.sh && python3 benchmarks/bench_fit.py [--shape 7b] [--calls 64] [--tokens 256]

Each setting runs in a child process of its own (an out-of-memory error ends that child only) and
prints the step's rollout and update seconds and the peak GPU memory, or the error. The policy is
one full-weight PolicyWorker in bf16 with fp32 master weights (masrl's default on CUDA): bf16
weights, fp32 masters, fp32 AdamW moments and an fp32 gradient buffer, i.e. 16 bytes a parameter
before activations. Prompts are 128 random tokens, completions ``--tokens`` with EOS ignored.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

import harness

SETTINGS = {
    "plain": {},
    "checkpointing": {"activation_checkpointing": True},
    "offload_optimizer": {"activation_checkpointing": True, "offload_optimizer": True},
}


def child(shape: str, setting: str, calls: int, tokens: int) -> dict:
    import random

    import torch

    from masrl.config import AlgorithmConfig, OptimConfig, SamplingParams
    from masrl.messages import GenCall
    from masrl.policies import PolicySpec
    from masrl.worker.policy_worker import PolicyWorker

    opts = SETTINGS[setting]
    algo = AlgorithmConfig(group_key=["task_id"], micro_batch_tokens=4096,
                           activation_checkpointing=opts.get("activation_checkpointing", False))
    t0 = time.perf_counter()
    spec = PolicySpec("p", harness.SHAPES[shape], optim=OptimConfig(lr=1e-6), device=harness.DEV,
                      offload_optimizer=opts.get("offload_optimizer", False))
    w = PolicyWorker(harness.SHAPES[shape], [spec], algo, device=harness.DEV, precision="bf16",
                     engine_options={"max_batch_size": calls})
    load_s = time.perf_counter() - t0
    n_params = sum(p.numel() for p in w.held.model.parameters())
    rng = random.Random(0)
    sp = SamplingParams(temperature=1.0, max_new_tokens=tokens, ignore_eos=True)
    steps = []
    for rep in range(2):
        gen = [GenCall(f"c{rep}-{i}", "p", [{"role": "user", "content": " ".join(str(rng.randrange(10**6))
                                                                              for _ in range(40))}], sp,
                       key={"task_id": i // 4}) for i in range(calls)]
        harness.sync()
        t1 = time.perf_counter()
        res = w.generate(gen)
        harness.sync()
        t2 = time.perf_counter()
        w.commit_rewards({r.call_id: harness.fake_reward(r.text + r.call_id) for r in res})
        m = w.train_step()["p"]
        harness.sync()
        steps.append({"rollout_s": t2 - t1, "update_s": time.perf_counter() - t2,
                      "trained_tokens": m["trained_tokens"], "offload_s": m.get("offload_s", 0.0)})
    return {"params_b": n_params / 1e9, "load_s": load_s, "steps": steps, "peak_gb": harness.peak_gb(),
            "total_gb": torch.cuda.get_device_properties(0).total_memory / 2**30 if torch.cuda.is_available() else 0}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--child", nargs=4)
    ap.add_argument("--shape", default="7b")
    ap.add_argument("--settings", default="checkpointing,offload_optimizer")
    ap.add_argument("--calls", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=256)
    a = ap.parse_args()
    if a.child:
        print("RESULT " + json.dumps(child(a.child[0], a.child[1], int(a.child[2]), int(a.child[3]))), flush=True)
        return
    print(harness.header().replace("bench_gpu.py", "bench_fit.py"), flush=True)
    rows = []
    for setting in a.settings.split(","):
        proc = subprocess.run([sys.executable, __file__, "--child", a.shape, setting, str(a.calls), str(a.tokens)],
                              capture_output=True, text=True, timeout=1200, cwd=harness.ROOT)
        lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
        if proc.returncode or not lines:
            err = [x for x in proc.stderr.strip().splitlines() if "Error" in x or "error" in x][-1:] or ["?"]
            rows.append((setting, "does not fit" if "out of memory" in err[0] else "failed", err[0][:120]))
            continue
        r = json.loads(lines[-1][len("RESULT "):])
        s = r["steps"][-1]
        rows.append((setting, f"peak {r['peak_gb']:.1f} of {r['total_gb']:.0f} GiB",
                     f"{r['params_b']:.2f}B params; rollout {s['rollout_s']:.1f} s, update {s['update_s']:.1f} s "
                     f"({s['trained_tokens']:.0f} trained tokens; offload {s['offload_s']:.1f} s)"))
    print(f"\n{a.shape} shape, full fine-tuning, {a.calls} calls x {a.tokens} tokens a step (second step shown)\n")
    print("| setting | memory | step |\n| --- | --- | --- |")
    for r in rows:
        print(f"| {r[0]} | {r[1]} | {r[2]} |")


if __name__ == "__main__":
    main()
