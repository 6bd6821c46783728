"""The paged engine on one GPU, against the eager engine or against itself (another build, another variant), the same
requests in the same run.

    source scripts/gpu/setup.sh && python3 benchmarks/bench_engine.py [--shape 0.5b] [--only rollout,grpo,tail,long] \
        [--engines paged,hf]

Each engine runs in a child process of its own (peak memory is per process) on random weights of
the shape (bf16, EOS ignored: random weights never stop). ``DIR:`` before a child's name
(``--engines paged,/tmp/old/src:paged``) runs it on another build's ``src`` (a before/after comparison: DIR goes first on
the child's PYTHONPATH); each child compiles its Triton kernels into a cache of its own (``harness.run_child``), so
the order of the children does not favour the later ones. Parts:

* rollout: 128-token distinct prompts, 256 new tokens, batch 1/64/256: tok/s, and the median time
  of one replayed decode step at the largest batch.
* grpo: 64 tasks x 8 samples, each prompt a 256-token shared preamble + 64 tokens of its own,
  256 new tokens: prompt tokens computed by prefill (the paged engine shares every full block, the group's question
  included), tok/s, peak GiB.
* tail: 64 multi-turn episodes of 1-8 turns (geometric), each turn 16 new prompt tokens and a
  long-tailed completion (32 tokens; one call in 8: 512). The eager engine: rounds, every episode's next call
  in one batch that waits for its longest call (what a batcher gets); paged: each episode in its own
  thread, its calls joining the running decode. Episodes per second.
* long: one 16,000-token prompt, 256 new tokens: peak GiB and tok/s (after a 1,200-token call, so that
  compiling and capturing the long length class is not timed, and a 16,000-token prefill, whose first
  one pays one-time costs), and another 16,000-token prompt with 1 new token (its prefill alone).

Paged: blocks of 16 slots from a budget (rollout.gpu_memory_utilization 0.04), a prefix cache, one decode graph per
batch bucket, decode chunks of 8 steps read back once, the fused sampler (``engines/paged/kernels``);
``--engines paged@torch`` runs it with torch's ``sample_tokens`` instead, ``paged@nosplit`` with one attention
program a (row, KV head) for long rows too (no split attention); every column is compared with the first.
vLLM on the same parts: bench_vllm.py.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
import threading
import time
from pathlib import Path

from harness import DEV, SHAPES, decode_profile, run_child

ROOT = Path(__file__).resolve().parents[1]


def sync():
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def peak_reset():
    import torch

    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()


def peak_gib() -> float:
    import torch

    return torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else 0.0


# ENGINE@VARIANT in --engines: a fused kernel the engine would use, turned off
VARIANTS = {"torch": "sample", "nosplit": "paged_attention_split"}


def make(kind, model, tok, **kw):
    kind, _, variant = kind.partition("@")
    eng = _make(kind, model, tok, **kw)
    if variant in VARIANTS:
        eng.runner.fused[VARIANTS[variant]] = False
    elif variant:
        raise SystemExit(f"unknown variant {variant!r} in --engines (use ENGINE or ENGINE@{'|'.join(VARIANTS)})")
    return eng


def _make(kind, model, tok, **kw):
    if kind == "paged":
        from masrl.engines.paged import PagedEngine

        return PagedEngine(model, tok, [tok.eos_token_id], device=DEV, **kw)
    if kind == "hf":
        from masrl.engines.hf import HFEngine

        return HFEngine(model, tok, [tok.eos_token_id])
    raise SystemExit(f"unknown engine {kind!r} in --engines (paged or hf; vLLM: bench_vllm.py)")


def timed(fn):
    sync()
    t0 = time.perf_counter()
    out = fn()
    sync()
    return out, time.perf_counter() - t0


class Bench:
    """One engine kind on one model shape: random requests, and the parts of the benchmark."""

    def __init__(self, kind: str, shape: str):
        import torch

        from masrl.models import load_model

        self.kind = kind.partition("@")[0]
        self.name = kind
        self.model, self.tok = load_model(SHAPES[shape], seed=0, dtype=torch.bfloat16, device=DEV)
        self.rng = random.Random(0)

    def sp(self, n: int):
        from masrl.config import SamplingParams

        return SamplingParams(temperature=1.0, max_new_tokens=n, ignore_eos=True)

    def req(self, prompt: list[int], n: int, seed: int):
        from masrl.messages import GenRequest

        return GenRequest(list(prompt), self.sp(n), seed=seed)

    def rand(self, n: int) -> list[int]:
        return [self.rng.randrange(100, 49000) for _ in range(n)]

    def engine(self, **kw):
        return make(self.name, self.model, self.tok, **kw)

    @staticmethod
    def done(eng) -> None:
        import torch

        eng.release()
        torch.cuda.empty_cache()

    def rollout(self, out: dict) -> None:
        eng = self.engine(max_batch_size=256)
        for B in (1, 64, 256):
            reqs = [self.req(self.rand(128), 256, i) for i in range(B)]
            eng.generate(reqs)  # warm-up: graphs captured
            res, dt = timed(lambda reqs=reqs: eng.generate(reqs))
            assert all(len(r.completion_ids) == 256 for r in res)
            out[f"rollout_tps_{B}"] = B * 256 / dt
            print(f"  {self.kind} rollout batch {B}: {B * 256 / dt:,.0f} tok/s", flush=True)
        out["step_ms_256"] = decode_profile(eng, [256]).get(256)
        self.done(eng)

    def grpo(self, out: dict) -> None:
        preamble = self.rand(256)
        prompts = [preamble + self.rand(64) for _ in range(64)]
        reqs = [self.req(p, 256, 1000 + 8 * i + j) for i, p in enumerate(prompts) for j in range(8)]
        eng = self.engine(max_batch_size=512)
        eng.generate(reqs[:16])  # warm-up
        before = eng.stats.get("prefill_tokens", 0)
        peak_reset()
        _, dt = timed(lambda: eng.generate(reqs))
        out["grpo_tps"] = len(reqs) * 256 / dt
        out["grpo_peak_gib"] = peak_gib()
        if "prefill_tokens" in eng.stats:  # the paged engine (and bench_vllm's vLLM) count what they prefill
            out["grpo_prefill_tokens"] = eng.stats["prefill_tokens"] - before
        else:  # the eager engine prefills every prompt whole
            out["grpo_prefill_tokens"] = sum(len(r.prompt_ids) for r in reqs)
        print(f"  {self.kind} grpo: {out['grpo_tps']:,.0f} tok/s, {out['grpo_prefill_tokens']:,} prompt tokens "
              f"computed, peak {out['grpo_peak_gib']:.1f} GiB", flush=True)
        self.done(eng)

    def episodes(self) -> list[dict]:
        """The tail's 64 episodes: 1-8 turns (geometric), a 128-token first prompt, each turn's completion 32 tokens
        or (one in 8) 512."""
        erng = random.Random(1)
        episodes = []
        for _ in range(64):
            turns = 1
            while turns < 8 and erng.random() > 0.5:
                turns += 1
            episodes.append({"prompt": self.rand(128), "turns": turns,
                             "lens": [512 if erng.random() < 0.125 else 32 for _ in range(turns)]})
        return episodes

    def tail(self, out: dict) -> None:
        eng = self.engine(max_batch_size=256)
        episodes = self.episodes()
        eng.generate([self.req(self.rand(128), 32, 1)] * 4)  # warm-up

        def call(i, t):
            return self.req(episodes[i]["prompt"], episodes[i]["lens"][t], 7919 * t + i)

        def advance(i, o):
            episodes[i]["prompt"] += o.completion_ids + self.rand(16)

        n = len(episodes)
        run = (lambda: run_threads(eng, n, episodes, call, advance)) if self.kind == "paged" else (
            lambda: run_rounds(eng, n, episodes, call, advance))
        peak_reset()
        _, dt = timed(run)
        out.update(tail_eps=len(episodes) / dt, tail_s=dt, tail_peak_gib=peak_gib(),
                   tail_tokens_s=sum(sum(ep["lens"]) for ep in episodes) / dt)
        print(f"  {self.kind} tail: {len(episodes)} episodes, {sum(ep['turns'] for ep in episodes)} calls in "
              f"{dt:.2f} s", flush=True)
        self.done(eng)

    def long(self, out: dict) -> None:
        eng = self.engine(max_batch_size=8)
        r = self.req(self.rand(16000), 256, 3)
        eng.generate([self.req(self.rand(64), 8, 1)])
        eng.generate([self.req(self.rand(1200), 8, 2)])  # the long length class's kernels compiled, its graph captured
        eng.generate([self.req(self.rand(16000), 1, 5)])  # a first 16k prefill's one-time costs (~1.5 s), not timed
        _, pre = timed(lambda: eng.generate([self.req(self.rand(16000), 1, 4)]))  # another prompt: nothing cached
        peak_reset()
        _, dt = timed(lambda: eng.generate([r]))
        out.update(long_tps=256 / dt, long_s=dt, long_peak_gib=peak_gib(), long_prefill_s=pre)
        print(f"  {self.kind} 16k prompt: {dt:.2f} s (a prefill alone: {pre:.2f} s), peak {out['long_peak_gib']:.1f} GiB",
              flush=True)


def run_rounds(eng, n: int, episodes: list[dict], call, advance) -> None:
    """An engine without joined batches as a batcher drives it: every episode's next call in one batch, which waits
    for its longest call."""
    live, t = list(range(n)), 0
    while live:
        for i, o in zip(live, eng.generate([call(i, t) for i in live])):
            advance(i, o)
        t += 1
        live = [i for i in live if episodes[i]["turns"] > t]


def run_threads(eng, n: int, episodes: list[dict], call, advance) -> None:
    """Each episode in its own thread: its calls join the paged engine's running decode."""
    def one(i):
        for t in range(episodes[i]["turns"]):
            advance(i, eng.generate([call(i, t)])[0])

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()


def child(kind: str, shape: str, parts: list[str]) -> dict:
    bench, out = Bench(kind, shape), {}
    for part in ("rollout", "grpo", "tail", "long"):
        if part in parts:
            getattr(bench, part)(out)
    return out


def _fmt(v) -> str:
    return "-" if v is None else (f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", choices=sorted(SHAPES), default="0.5b")
    ap.add_argument("--only", default="rollout,grpo,tail,long")
    ap.add_argument("--engines", default="paged,hf")
    ap.add_argument("--child")
    ap.add_argument("--json")
    a = ap.parse_args()
    parts = a.only.split(",")
    if a.child:
        print("RESULT " + json.dumps(child(a.child, a.shape, parts)), flush=True)
        return
    res = {}
    for kind in a.engines.split(","):
        src, _, name = kind.rpartition(":")  # DIR:ENGINE: the child imports masrl from DIR (another build)
        res[kind] = run_child(__file__, name, "--shape", a.shape, "--only", a.only, timeout=3600, src=src)
    import torch

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
    print(f"\ncommand: python benchmarks/bench_engine.py {' '.join(sys.argv[1:])}\n"
          f"machine: {gpu}, {os.cpu_count()} cores, torch {torch.__version__}, {platform.python_version()}; "
          f"shape {a.shape} ({SHAPES[a.shape]}), bf16\n")
    rows = [("rollout tok/s, batch 1", "rollout_tps_1"), ("rollout tok/s, batch 64", "rollout_tps_64"),
            ("rollout tok/s, batch 256", "rollout_tps_256"), ("decode step ms, batch 256", "step_ms_256"),
            ("GRPO 64x8: prompt tokens prefilled", "grpo_prefill_tokens"),
            ("GRPO 64x8: tok/s", "grpo_tps"), ("GRPO 64x8: peak GiB", "grpo_peak_gib"),
            ("long tail: episodes/s", "tail_eps"), ("long tail: seconds", "tail_s"),
            ("long tail: peak GiB", "tail_peak_gib"),
            ("16k prompt + 256: seconds", "long_s"), ("16k prompt, 1 token (the prefill): seconds", "long_prefill_s"),
            ("16k prompt: peak GiB", "long_peak_gib")]
    names = list(res)
    print(f"| measure | {' | '.join(names)} | {' | '.join(f'{n} / {names[0]}' for n in names[1:])} |\n"
          f"| --- |{' --- |' * (2 * len(names) - 1)}")
    for label, key in rows:
        vals = [res[n].get(key) for n in names]
        if all(v is None for v in vals):
            continue
        ratios = [f"{v / vals[0]:.2f}x" if vals[0] and v is not None else "-" for v in vals[1:]]
        print(f"| {label} | {' | '.join(_fmt(v) for v in vals)} | {' | '.join(ratios)} |")
    if a.json:
        Path(a.json).write_text(json.dumps({"gpu": gpu, "results": res}, indent=2))


if __name__ == "__main__":
    main()
