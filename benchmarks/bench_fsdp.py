"""One GRPO step of a policy sharded with FSDP2 over N GPUs (``policies.X.fsdp``): step time split into
rollout, weight sync and update, peak memory per GPU, update MFU.

    source scripts/gpu/setup.sh && python3 benchmarks/bench_fsdp.py [--shape 7b|8b] [--ranks 2]
        [--tasks 64] [--samples 8] [--tokens 512] [--checkpointing]

Each rank is a process of its own (``torch.multiprocessing``, NCCL on 127.0.0.1) holding one
``PolicyWorker`` on ``cuda:RANK`` with ``fsdp`` on, as a Ray actor would: it samples its share of the
calls with its own engine (a full bf16 copy gathered after every update), then all ranks update
together. Full fine-tuning, bf16 compute over fp32 shards, no offload, packed rows, no activation
checkpointing unless ``--checkpointing``. Prompts are 128 random tokens, completions ``--tokens``
with EOS ignored; rewards are a hash of the text. Two steps; the second is reported. MFU counts
bench_gpu.py's useful FLOPs (linear layers, causal attention, the head on completion tokens) over
989 TFLOP/s per GPU.

To check the script on a CPU: ``MASRL_BENCH_MODEL=tiny-random MASRL_BENCH_DEVICE=cpu python
benchmarks/bench_fsdp.py --tasks 4 --samples 2 --tokens 8`` (two gloo ranks).
"""

from __future__ import annotations

import argparse
import os
import socket
import tempfile
import time

import harness


def rank_main(rank: int, world: int, port: int, a: dict, out: str) -> None:
    import random

    import torch

    from masrl.config import AlgorithmConfig, OptimConfig, SamplingParams
    from masrl.messages import GenCall
    from masrl.policies import PolicySpec
    from masrl.worker.policy_worker import PolicyWorker

    cuda = harness.DEV.startswith("cuda")
    dev = f"cuda:{rank}" if cuda else "cpu"
    if cuda:
        torch.cuda.set_device(rank)
    model = harness.SHAPES[a["shape"]]
    algo = AlgorithmConfig(group_key=["task_id"], micro_batch_tokens=a["micro_batch_tokens"],
                           activation_checkpointing=a["checkpointing"])
    spec = PolicySpec("p", model, optim=OptimConfig(lr=1e-6), device=dev, fsdp=True, data_parallel=world)
    t0 = time.perf_counter()
    w = PolicyWorker(model, [spec], algo, device=dev, precision="bf16" if cuda else "fp32", seed=0,
                     engine_options={"max_batch_size": max(1, a["tasks"] * a["samples"] // world)})
    w.join_ranks(f"tcp://127.0.0.1:{port}", rank, world, "cpu:gloo,cuda:nccl" if cuda else "gloo")
    load_s = time.perf_counter() - t0
    rng = random.Random(rank)
    sp = SamplingParams(temperature=1.0, max_new_tokens=a["tokens"], ignore_eos=True)
    mine = [t for t in range(a["tasks"]) if t % world == rank]  # whole groups per rank
    steps = []
    for rep in range(2):
        calls = [GenCall(f"c{rep}-{t}-{k}", "p", [{"role": "user", "content": " ".join(
            str(rng.randrange(10**6)) for _ in range(40))}], sp, key={"task_id": t})
            for t in mine for k in range(a["samples"])]
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        harness.sync()
        t1 = time.perf_counter()
        res = w.generate(calls)
        harness.sync()
        t2 = time.perf_counter()
        w.commit_rewards({r.call_id: harness.fake_reward(r.text + r.call_id) for r in res})
        m = w.train_step()["p"]
        harness.sync()
        t3 = time.perf_counter()
        steps.append({"rollout_s": t2 - t1, "train_step_s": t3 - t2, "update_s": m["update_s"],
                      "weight_sync_s": m["weight_sync_s"], "weight_sync_gb": m["weight_sync_gb"],
                      "prompt_tokens": sum(r.n_prompt_tokens for r in res),
                      "completion_tokens": sum(r.n_completion_tokens for r in res),
                      "peak_gb": harness.peak_gb()})
    torch.save({"load_s": load_s, "steps": steps, "held_params": sum(p.to_local().numel()
                for p in w.held.policy_parameters("p")), "params": sum(p.numel() for p in w.held.policy_parameters("p"))},
               f"{out}/rank{rank}.pt")


def main() -> None:
    import torch
    import torch.multiprocessing as mp

    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="7b")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--tasks", type=int, default=64)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--micro-batch-tokens", type=int, default=16384)
    ap.add_argument("--checkpointing", action="store_true")
    args = ap.parse_args()
    a = {"shape": args.shape, "tasks": args.tasks, "samples": args.samples, "tokens": args.tokens,
         "micro_batch_tokens": args.micro_batch_tokens, "checkpointing": args.checkpointing}
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tempfile.mkdtemp(prefix="masrl-bench-fsdp-")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    mp.start_processes(rank_main, args=(args.ranks, port, a, out), nprocs=args.ranks, join=True, start_method="spawn")
    ranks = [torch.load(f"{out}/rank{r}.pt", weights_only=False) for r in range(args.ranks)]
    print(harness.header().replace("bench_gpu.py", "bench_fsdp.py"))
    from masrl.models import RANDOM_SHAPES

    cfg = RANDOM_SHAPES[harness.SHAPES[args.shape]](49152)
    st = [r["steps"][-1] for r in ranks]
    n = args.tasks * args.samples
    mean_prompt = sum(s["prompt_tokens"] for s in st) // n
    flops = harness.useful_flops(cfg, [(range(mean_prompt), range(args.tokens))]) * n  # every trained call, all ranks
    upd = max(s["update_s"] for s in st)
    mfu = flops / upd / (harness.PEAK_TFLOPS * 1e12 * args.ranks)
    print(f"\n{args.shape} shape ({harness.SHAPES[args.shape]}, {ranks[0]['params'] / 1e9:.2f}B parameters), "
          f"{args.ranks} ranks, full fine-tuning, "
          f"{args.tasks} tasks x {args.samples} samples x {args.tokens} tokens, second step\n")
    print("| rank | params held | rollout s | update s | weight sync s (GiB) | train step s | peak GiB |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for i, (r, s) in enumerate(zip(ranks, st)):
        print(f"| {i} | {r['held_params'] / r['params']:.2f} | {s['rollout_s']:.1f} | {s['update_s']:.1f} | "
              f"{s['weight_sync_s']:.2f} ({s['weight_sync_gb']:.1f}) | {s['train_step_s']:.1f} | {s['peak_gb']:.1f} |")
    print(f"\nupdate MFU {mfu:.2f} (bar 0.40); weight sync {max(s['weight_sync_s'] for s in st):.2f} s (bar 2 s); "
          f"step {max(s['rollout_s'] for s in st) + max(s['train_step_s'] for s in st):.1f} s")


if __name__ == "__main__":
    main()
