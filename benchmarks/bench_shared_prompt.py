"""The update when a call's samples share a long prompt: packed rows against the shared-prefix layout.

    source scripts/gpu/setup.sh && python3 benchmarks/bench_shared_prompt.py [--shape 135m] [--prompt 2900]

GRPO samples every call several times (8 here), so every sample of a call carries the same prompt: a
reading agent's 24 passages are ~2,900 tokens, its answer ~16. The packed layout (the CUDA default) runs
each row whole, the prompt 8 times; ``algorithm.share_prefix=true`` with ``micro_batch_tokens`` runs it
once per call (``batching.prefix_budget_chunks``). Same samples, same weights, one optimizer step each
way; prints seconds, peak GPU memory, and the largest difference between the two updates' weights.
On a CPU: ``MASRL_BENCH_MODEL=tiny-random MASRL_BENCH_DEVICE=cpu python3 benchmarks/bench_shared_prompt.py
--prompt 300 --calls 4``.
"""

from __future__ import annotations

import argparse
import platform
import time

import harness


def workload(calls: int, samples: int, prompt: int, completion: int, vocab: int, seed: int = 0):
    import random

    rng = random.Random(seed)
    system = [rng.randrange(3, vocab) for _ in range(200)]  # every call's system prompt and examples
    rows = []
    for c in range(calls):
        p = system + [rng.randrange(3, vocab) for _ in range(prompt - len(system))]
        rows += [(c, p, [rng.randrange(3, vocab) for _ in range(completion + (s % 5))]) for s in range(samples)]
    return rows


def run(host, rows, algo, start):
    import torch

    from masrl.worker.model.precision import MasterWeightsAdamW
    from masrl.worker.updater.batching import Sample
    from masrl.worker.updater.training import Learner

    with torch.no_grad():
        for p, s in zip(host.policy_parameters("p"), start):
            p.copy_(s)
    opt = MasterWeightsAdamW(host.policy_parameters("p"), lr=1e-5, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    samples = [Sample(f"s{i}", "p", p, c, [-10.0] * len(c), 1.0, {"task_id": t}, reward=float(i % 3))
               for i, (t, p, c) in enumerate(rows)]
    if host.device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    Learner(host, algo, 0).train("p", samples, opt, 1.0)
    if host.device.type == "cuda":
        torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() / 2**30 if host.device.type == "cuda" else float("nan")
    return time.perf_counter() - t0, peak, Learner(host, algo).layout(), [p.detach().float().clone()
                                                                      for p in host.policy_parameters("p")]


def main() -> None:
    import torch

    from masrl.config import AlgorithmConfig, OptimConfig
    from masrl.policies import PolicySpec
    from masrl.worker.model.held import HeldModel

    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="135m")
    ap.add_argument("--calls", type=int, default=36)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=2900)
    ap.add_argument("--completion", type=int, default=20)
    ap.add_argument("--budget", type=int, default=8192)
    args = ap.parse_args()
    cuda = harness.DEV.startswith("cuda")
    host = HeldModel(harness.SHAPES[args.shape], [PolicySpec("p", harness.SHAPES[args.shape], optim=OptimConfig(lr=1e-5))],
                     device=harness.DEV, dtype=torch.bfloat16 if cuda else torch.float32)
    rows = workload(args.calls, args.samples, args.prompt, args.completion, host.core.config.vocab_size)
    start = [p.detach().clone() for p in host.policy_parameters("p")]
    sides = {"rows whole (share_prefix=false)": AlgorithmConfig(group_key=["task_id"], share_prefix=False,
                                                               micro_batch_tokens=args.budget),
             "share_prefix=true, micro_batch_tokens": AlgorithmConfig(group_key=["task_id"], share_prefix=True,
                                                                      micro_batch_tokens=args.budget)}
    run(host, rows[: args.samples], sides["share_prefix=true, micro_batch_tokens"], start)  # warm-up
    results = {name: run(host, rows, algo, start) for name, algo in sides.items()}
    dev = torch.cuda.get_device_name(0) if cuda else platform.processor() or "cpu"
    print(f"`python3 benchmarks/bench_shared_prompt.py --shape {args.shape} --prompt {args.prompt}` on {dev}: "
          f"{args.calls} calls x {args.samples} samples, prompt {args.prompt} tokens, completions "
          f"{args.completion}-{args.completion + 4}, budget {args.budget} tokens, {harness.SHAPES[args.shape]}")
    print("| side | layout | update s | peak GiB | speed-up |")
    print("| --- | --- | --- | --- | --- |")
    base = results["rows whole (share_prefix=false)"][0]
    for name, (secs, peak, layout, _) in results.items():
        print(f"| {name} | {layout} | {secs:.2f} | {peak:.2f} | {base / secs:.2f}x |")
    a, b = (r[3] for r in results.values())
    diff = max((x - y).abs().max().item() for x, y in zip(a, b))
    moved = max((x - s.float()).abs().max().item() for x, s in zip(a, start))
    print(f"largest weight difference between the two updates: {diff:.2e} (the update itself moved weights up to "
          f"{moved:.2e}; AdamW's first step is about lr x the gradient's sign, so a gradient near zero summed in "
          f"another order can land on the other side)")


if __name__ == "__main__":
    main()
