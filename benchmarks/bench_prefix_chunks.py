"""The CPU update of a multi-turn tool-calling agent: micro-batches grouped by episode against the
cheaper of that and grouping by length.

    .venv/bin/python benchmarks/bench_prefix_chunks.py [--questions 6] [--samples 4] [--model random-smollm2-135m]

The workload is the shape of `make demo`'s search agent step (traces of that run: a 544-token system
prompt with worked examples, the question, 23-token answers; half the calls are second turns carrying
the first turn's completion and ~200 tokens of search results). On a CPU the update runs the ``prefix``
layout: each micro-batch runs its rows' shared prefix once and pads the rest of every row to the
longest. ``episode`` groups rows in token order, as every update did before (an episode's first and
second turns together: the short rows pad to the long ones); ``chosen`` is what ``micro_batches`` does
now (the grouping of the two that runs fewer tokens, here by length under the system prompt). Same
samples, same starting weights, one update each; prints the tokens each runs, the seconds, the ratio,
and the loss (equal up to summation order).
"""

from __future__ import annotations

import argparse
import platform
import random
import time


def workload(questions: int, samples: int, system_len: int = 544, vocab: int = 49_000, seed: int = 0):
    from masrl.worker.updater.batching import Sample

    rng = random.Random(seed)

    def toks(n):
        return [rng.randrange(3, vocab) for _ in range(n)]

    system, rows = toks(system_len), []
    for q in range(questions):
        first = system + toks(13)
        for _ in range(samples):
            answer = toks(23)
            rows.append((q, first, answer))
            rows.append((q, first + answer + toks(198), toks(23)))
    return [Sample(f"s{i}", "p", p, c, [-10.0] * len(c), 1.0, {"task_id": t}, reward=float(i % 3))
            for i, (t, p, c) in enumerate(rows)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--questions", type=int, default=6)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--model", default="random-smollm2-135m")
    ap.add_argument("--micro-batch-size", type=int, default=8)
    a = ap.parse_args()

    import torch

    from masrl.config import AlgorithmConfig
    from masrl.policies import PolicySpec
    from masrl.worker.model.held import HeldModel
    from masrl.worker.model.precision import MasterWeightsAdamW
    from masrl.worker.updater import batching
    from masrl.worker.updater.training import Learner

    host = HeldModel(a.model, [PolicySpec("p", a.model)], device="cpu", dtype=torch.float32, seed=0)
    start = [p.detach().clone() for p in host.policy_parameters("p")]
    algo = AlgorithmConfig(advantage="grpo", micro_batch_size=a.micro_batch_size, skip_zero_advantage=False)
    chosen = batching._length_chunks
    rows = []
    for side in ("episode", "chosen"):
        # "episode": the grouping before, where micro_batches knew only the token-order one
        batching._length_chunks = chosen if side == "chosen" else (lambda s, n, m=16: batching._prefix_chunks(s, n, m))
        samples = workload(a.questions, a.samples)
        tokens = sum(batching.prefix_cost(c) for c in batching.micro_batches(samples, a.micro_batch_size))
        with torch.no_grad():
            for p, s in zip(host.policy_parameters("p"), start):
                p.copy_(s)
        opt = MasterWeightsAdamW(host.policy_parameters("p"), lr=1e-5, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
        t0 = time.perf_counter()
        m = Learner(host, algo, 0).train("p", samples, opt, 1.0)
        rows.append((side, tokens, time.perf_counter() - t0, m["loss"]))
    batching._length_chunks = chosen
    print(f"\n`python benchmarks/bench_prefix_chunks.py --questions {a.questions} --samples {a.samples} --model {a.model}`"
          f" on {platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}, "
          f"fp32, layout {Learner(host, algo).layout()}, {len(samples)} rows, micro_batch_size {a.micro_batch_size}\n")
    print("| grouping | tokens run | update s | speed-up | loss |")
    print("| --- | --- | --- | --- | --- |")
    for side, tokens, secs, loss in rows:
        print(f"| {side} | {tokens:,} | {secs:.1f} | {rows[0][2] / secs:.2f}x | {loss:.5f} |")


if __name__ == "__main__":
    main()
