"""Where the milliseconds go on a GPU: kernels of one decode step (eager and graph-replayed), and of
one update of the 0.5B shape (the bench_gpu.py workload). Prints the top kernels by GPU time.

    source scripts/gpu_setup.sh && python3 benchmarks/profile_gpu.py [--only decode,update]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).parent))
import bench_gpu as B  # noqa: E402


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


def decode(shape: str, batch: int) -> None:
    from masrl.config import SamplingParams
    from masrl.engines.decode_weights import slot_bucket
    from masrl.engines.static import StaticEngine
    from masrl.messages import GenRequest
    from masrl.models import load_model

    model, tok = load_model(B.SHAPES[shape], seed=0, dtype=torch.bfloat16, device="cuda")
    eng = StaticEngine(model, tok, [tok.eos_token_id], device="cuda:0")
    reqs = [GenRequest(list(range(100, 228)), SamplingParams(temperature=1.0, max_new_tokens=64, ignore_eos=True))] * batch
    eng.generate(reqs)
    torch.cuda.synchronize()
    Bb, S = batch, slot_bucket(128 + 64)
    with torch.inference_mode(), eng._kernels():
        saved = (eng.pos_buf.clone(), eng.slot_t.clone())
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                eng._decode_body(Bb, S)
            torch.cuda.synchronize()
        n, ms = kernels_in(prof)
        print(f"\n== decode {shape} batch {batch}, eager step: {n / 5:.0f} kernels, {ms / 5:.3f} ms GPU time per step")
        print(table(prof, 12))
        eng.pos_buf.copy_(saved[0])
        eng.slot_t.copy_(saved[1])
        if (Bb, S) not in eng.graphs:
            eng.graphs[(Bb, S)] = eng._capture(Bb, S)
        g = eng.graphs[(Bb, S)][0]
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        times = []
        for _ in range(30):  # every replay advances the slot: rewind it (outside the timing)
            eng.pos_buf.copy_(saved[0])
            eng.slot_t.copy_(saved[1])
            start.record()
            g.replay()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        print(f"graph replay: {sorted(times)[15]:.3f} ms per step (median of 30); kernels fused: {eng.stats['fused_kernels']}")
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            eng.pos_buf.copy_(saved[0])
            eng.slot_t.copy_(saved[1])
            g.replay()
            torch.cuda.synchronize()
        n, ms = kernels_in(prof)
        print(f"graph replay under the profiler: {n} kernels, {ms:.3f} ms of kernel time")


def update() -> None:
    from masrl.config import AlgorithmConfig, OptimConfig
    from masrl.policies import PolicySpec
    from masrl.worker.batching import Sample
    from masrl.worker.hosting import ModelHost
    from masrl.worker.precision import MasterWeightsAdamW
    from masrl.worker.training import train_policy

    rows = B.update_workload()
    host = ModelHost(B.SHAPES["0.5b"], [PolicySpec("p", B.SHAPES["0.5b"], optim=OptimConfig(lr=1e-6))],
                     device="cuda:0", dtype=torch.bfloat16)
    opt = MasterWeightsAdamW(host.policy_parameters("p"), lr=1e-6, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    for budget in (16384, 32768):
        algo = AlgorithmConfig(group_key=["task_id"], micro_batch_tokens=budget)

        def step(algo=algo):
            samples = [Sample(f"s{i}", "p", p, c, [-10.0] * len(c), 1.0, {"task_id": i % 4}, reward=float(i % 5))
                       for i, (p, c) in enumerate(rows)]
            return train_policy(host, "p", samples, opt, algo, 1.0, 0)

        step()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
        flops = B.useful_flops(host.core.config, rows)
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
    ap.add_argument("--only", default="decode,update")
    a = ap.parse_args()
    only = set(a.only.split(","))
    print(B.header(), flush=True)
    import traceback

    jobs = [(decode, (shape, batch)) for shape, batch in (("135m", 1), ("135m", 64), ("0.5b", 256))] if "decode" in only else []
    jobs += [(update, ())] if "update" in only else []
    for fn, args in jobs:
        try:
            fn(*args)
        except Exception:  # noqa: BLE001 - report and go on to the next measurement
            traceback.print_exc(limit=4)


if __name__ == "__main__":
    main()
