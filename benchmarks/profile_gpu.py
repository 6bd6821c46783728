"""Where the milliseconds go on a GPU: kernels of one decode step (eager and graph-replayed) of the
paged engine, of one update of the 0.5B shape (the bench_gpu.py workload), and of one long prompt's prefill
(bench_vllm.py's 16,000-token row, where vLLM is ahead) by kind of kernel. Prints the top kernels by GPU time.

    source scripts/gpu/setup.sh && python3 benchmarks/profile_gpu.py [--only decode,update,prefill] \
        [--engines paged] [--cases 0.5b:256,0.5b:64:2048]   (shape:batch[:prompt tokens]) [--prefill 0.5b,7b]
"""

from __future__ import annotations

import argparse
import time

import harness
import torch
from torch.profiler import ProfilerActivity, profile


def table(prof, n=18) -> str:
    ka = prof.key_averages()
    for key in ("self_device_time_total", "self_cuda_time_total", "device_time_total", "cuda_time_total"):
        try:
            return ka.table(sort_by=key, row_limit=n, max_name_column_width=60)
        except Exception:  # noqa: BLE001 - the key's name changed across versions
            continue
    return ka.table(row_limit=n)


def kernels_in(prof) -> tuple[int, float]:
    evs = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return len(evs), sum(e.device_time for e in evs) / 1000.0 if evs else 0.0


def build_engine(kind: str, shape: str):
    """The paged engine of the bench_gpu shape, bf16, on ``harness.DEV`` (``kind`` paged; hf has no step to profile)."""
    from masrl.models import load_model

    model, tok = load_model(harness.SHAPES[shape], seed=0, dtype=torch.bfloat16, device=harness.DEV)
    if kind != "paged":
        raise SystemExit(f"--engines {kind}: only the paged engine's decode step is profiled here")
    from masrl.engines.paged import PagedEngine

    return PagedEngine(model, tok, [tok.eos_token_id], device=harness.DEV, gpu_memory_utilization=0.05)


def decode(shape: str, batch: int, kind: str = "paged", prompt: int = 128) -> None:
    """One decode step of ``batch`` rows after a ``prompt``-token prompt: its kernels eager, then the replayed
    CUDA graph's time. The runner's step buffers (``step_state``) are rewound between steps."""
    from masrl.config import SamplingParams
    from masrl.messages import GenRequest

    eng = build_engine(kind, shape)
    sp = SamplingParams(temperature=1.0, max_new_tokens=64, ignore_eos=True)
    # a prompt of its own per row: rows that shared one would share the paged engine's blocks (and the cache lines)
    reqs = [GenRequest([100 + (i * 7 + r * 131) % 5000 for i in range(prompt)], sp) for r in range(batch)]
    eng.generate(reqs)
    torch.cuda.synchronize()
    run = eng.runner
    keys = [k for k in run.graphs if k[0] >= batch]  # the graphs the run decoded with: its batch bucket, widest
    if not keys:
        raise RuntimeError(f"the {kind} engine captured no decode graph for batch {batch} (graphs: {list(run.graphs)})")
    Bb = min(k[0] for k in keys)
    key = max((k for k in keys if k[0] == Bb), key=lambda k: k[1])
    S = key[1]
    with torch.inference_mode(), run.device_scope():
        saved = [(t, t.clone()) for t in run.step_state()]

        def rewind():
            for t, old in saved:
                t.copy_(old)

        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                rewind()
                run.step(Bb, S)
            torch.cuda.synchronize()
        n, ms = kernels_in(prof)
        print(f"\n== decode {kind} {shape} batch {batch}, {prompt}-token prompt (bucket {Bb}, graph key {key}), eager step: "
              f"{n / 5:.0f} kernels, {ms / 5:.3f} ms GPU time per step")
        print(table(prof, 14))
        g = run.graphs[key][0]
        print(f"graph replay: {harness.replay_ms(g.replay, rewind, n=30):.3f} ms per step (median of 30); "
              f"kernels fused: {eng.stats['fused_kernels']}")
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            rewind()
            g.replay()
            torch.cuda.synchronize()
        n, ms = kernels_in(prof)
        print(f"graph replay under the profiler: {n} kernels, {ms:.3f} ms of kernel time")
        print(table(prof, 14))


KINDS = (  # a kernel's kind, by the first of these its name holds (lower case)
    ("attention", ("flash", "fmha", "attn", "attention")),  # first: flash-attention's names hold "gemm" too
    ("matmul", ("gemm", "nvjet", "cutlass", "xmma", "cublas", "matmul", "splitk")),
    ("gather and copy", ("index", "gather", "copy", "memcpy", "cat_", "catarray", "scatter", "fill")),
)


def kernel_kind(name: str) -> str:
    low = name.lower()
    return next((kind for kind, keys in KINDS if any(k in low for k in keys)), "other (norms, RoPE, SwiGLU, ...)")


def prefill(shape: str, tokens: int = 16000) -> None:
    """One ``tokens``-token prompt's prefill (one new token) on the paged engine, as bench_engine's long part times
    it (first prefill untimed, then a new prompt): wall time, and its kernels' GPU time by kind. bench_vllm.py's
    table gives vLLM's time for the same prefill; its matrix products are the same FLOPs."""
    import random

    from masrl.config import SamplingParams
    from masrl.messages import GenRequest

    eng = build_engine("paged", shape)
    rng = random.Random(0)
    sp = SamplingParams(temperature=1.0, max_new_tokens=1, ignore_eos=True)

    def req(n, seed):
        return GenRequest([rng.randrange(100, 49000) for _ in range(n)], sp, seed=seed)

    eng.generate([req(1200, 1)])
    eng.generate([req(tokens, 2)])  # one-time costs: compiled kernels, the long length class
    torch.cuda.synchronize()
    r = req(tokens, 3)
    t0 = time.perf_counter()
    eng.generate([r])
    torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        eng.generate([req(tokens, 4)])
        torch.cuda.synchronize()
    evs = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    by: dict[str, list[float]] = {}
    for e in evs:
        by.setdefault(kernel_kind(e.name), []).append(e.device_time / 1000.0)
    total = sum(sum(v) for v in by.values())
    print(f"\n== prefill paged {shape}, {tokens}-token prompt: {wall * 1000:.1f} ms wall (unprofiled), "
          f"{len(evs)} kernels, {total:.1f} ms of kernel time")
    print("| kind | kernels | ms | share |\n| --- | --- | --- | --- |")
    for kind, ts in sorted(by.items(), key=lambda kv: -sum(kv[1])):
        print(f"| {kind} | {len(ts)} | {sum(ts):.1f} | {sum(ts) / max(total, 1e-9):.0%} |")
    print(table(prof, 16))
    eng.release()


def update() -> None:
    from masrl.config import AlgorithmConfig, OptimConfig
    from masrl.policies import PolicySpec
    from masrl.worker.model.held import HeldModel
    from masrl.worker.model.precision import MasterWeightsAdamW
    from masrl.worker.updater.batching import Sample
    from masrl.worker.updater.training import Learner

    rows = harness.update_workload()
    host = HeldModel(harness.SHAPES["0.5b"], [PolicySpec("p", harness.SHAPES["0.5b"], optim=OptimConfig(lr=1e-6))],
                     device="cuda:0", dtype=torch.bfloat16)
    opt = MasterWeightsAdamW(host.policy_parameters("p"), lr=1e-6, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    for budget in (16384, 32768):
        algo = AlgorithmConfig(group_key=["task_id"], micro_batch_tokens=budget)

        def step(algo=algo):
            samples = [Sample(f"s{i}", "p", p, c, [-10.0] * len(c), 1.0, {"task_id": i % 4}, reward=float(i % 5))
                       for i, (p, c) in enumerate(rows)]
            return Learner(host, algo, 0).train("p", samples, opt, 1.0)

        step()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
        flops = harness.useful_flops(host.core.config, rows)
        print(f"\n== update 0.5B, micro_batch_tokens {budget}: {wall * 1000:.0f} ms wall, MFU {flops / wall / 989e12:.3f}, "
              f"peak {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB")
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    n, ms = kernels_in(prof)
    print(f"profiled: {n} kernels, {ms:.0f} ms GPU time")
    print(table(prof, 25))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="decode,update", help="parts: decode, update, prefill")
    ap.add_argument("--engines", default="paged", help="whose decode step to profile")
    ap.add_argument("--cases", default="135m:1,135m:64,0.5b:256",
                    help="decode shapes, batches and prompt lengths, shape:batch[:prompt],... (prompt default 128)")
    ap.add_argument("--prefill", default="0.5b,7b", help="the prefill part's shapes, each with a 16,000-token prompt")
    a = ap.parse_args()
    only = set(a.only.split(","))
    print(harness.header(), flush=True)
    import traceback

    cases = [(c.split(":")[0], int(c.split(":")[1]), int((c.split(":") + ["128"])[2])) for c in a.cases.split(",")]
    jobs = [(decode, (shape, batch, kind, prompt)) for kind in a.engines.split(",") for shape, batch, prompt in cases] \
        if "decode" in only else []
    jobs += [(update, ())] if "update" in only else []
    jobs += [(prefill, (shape,)) for shape in a.prefill.split(",")] if "prefill" in only else []
    for fn, args in jobs:
        try:
            fn(*args)
        except Exception:  # noqa: BLE001 - report and go on to the next measurement
            traceback.print_exc(limit=4)


if __name__ == "__main__":
    main()
