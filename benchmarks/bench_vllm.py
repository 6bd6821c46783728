"""masrl's paged engine against vLLM on one GPU: the same requests, the same KV budget, in the same run.

    source scripts/gpu/setup.sh && python3 benchmarks/bench_vllm.py [--shape 0.5b|7b] [--only rollout,grpo,tail,long]

vLLM is 0.24.0 (scripts/gpu/vllm_install.sh), as its users run it: the offline ``LLM`` (its engine core in a
process of its own, torch.compile and CUDA graphs on, prefix caching on, chunked prefill at its defaults) for
rollout, grpo and long; the ``AsyncLLM`` for the long tail, each episode a coroutine that submits its next call as
its last returns. Its weights are its dummy load (random, like masrl's random shapes); it works on token ids
(``skip_tokenizer_init``, no detokenizing; masrl's engine decodes each call's text when it ends, on its clock). Both
sides: bf16, EOS ignored (random weights never stop), temperature 1,
a seed per call, the sampled token's logprob returned (what an RL trainer needs), and the same KV cache:
``rollout.gpu_memory_utilization`` 0.04 of the card (``kv_cache_memory_bytes`` for vLLM).

The parts are bench_engine.py's (the same request ids, drawn from the same seeds):

* rollout: 128-token distinct prompts, 256 new tokens, batch 1 / 64 / 256: tok/s.
* grpo: 64 tasks x 8 samples, a 256-token shared preamble + 64 tokens each, 256 new tokens: tok/s, prompt tokens
  computed (vLLM: its prompt tokens less its prefix-cache hits), device memory in use.
* tail: 64 multi-turn episodes of 1-8 turns (geometric), each turn 16 new prompt tokens and a long-tailed completion
  (32 tokens; one call in 8: 512): episodes per second.
* long: one 16,000-token prompt with 256 new tokens (after a warm-up of the same length): seconds; and a second
  16,000-token prompt with 1 new token (its prefill alone).

The roofline column: a decode step must read every weight and the batch's KV once; its bytes over the card's
memory bandwidth (3.35 TB/s on an H100 SXM, 4.8 on an H200) bound a batch's tok/s from above.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

from bench_engine import Bench
from harness import SHAPES, header, run_child

KV_FRACTION = 0.04  # both engines' KV cache, as a fraction of the card's memory (masrl's default)
BANDWIDTH = {"H100": 3.35e12, "H200": 4.8e12}


def used_gib() -> float:
    """Device memory in use, whoever holds it (vLLM's engine core is another process): total less free."""
    import torch

    if not torch.cuda.is_available():
        return 0.0
    free, total = torch.cuda.mem_get_info()
    return (total - free) / 2**30


class VLLMBench(Bench):
    """bench_engine's parts on vLLM: the same requests (``Bench.rand`` from the same seed), vLLM's own engine."""

    def __init__(self, shape: str, seeded: bool = True):  # noqa: D107 - no HF model: vLLM loads its own weights
        from masrl.models import RANDOM_SHAPES, load_tokenizer

        self.kind = self.name = "vllm"
        self.seeded = seeded  # vllm@noseed: no per-call seed (vLLM samples seeded rows apart from the batch)
        self.logprobs = 0  # vllm@bare: no seed and no logprobs (vLLM's output processor handles them per token)
        self.rng = random.Random(0)
        self.tok = load_tokenizer(SHAPES[shape])
        cfg = RANDOM_SHAPES[SHAPES[shape]](len(self.tok))
        cfg.architectures = [{"qwen2": "Qwen2ForCausalLM", "llama": "LlamaForCausalLM"}[cfg.model_type]]
        cfg.torch_dtype = "bfloat16"
        self.dir = Path(tempfile.mkdtemp(prefix="bench-vllm-"))
        cfg.save_pretrained(self.dir)
        self.llm = None

    def args(self) -> dict:
        import torch

        total = torch.cuda.get_device_properties(0).total_memory
        return dict(model=str(self.dir), load_format="dummy", dtype="bfloat16", skip_tokenizer_init=True, seed=0,
                    max_model_len=16640, max_num_seqs=512, kv_cache_memory_bytes=int(KV_FRACTION * total),
                    gpu_memory_utilization=0.9, enable_prefix_caching=True)

    def params(self, r):
        from vllm import SamplingParams

        return SamplingParams(temperature=1.0, max_tokens=r.sampling.max_new_tokens, ignore_eos=True,
                              seed=r.seed if self.seeded else None,
                              logprobs=self.logprobs, detokenize=False)

    def engine(self, **_kw):
        if self.llm is None:
            from vllm import LLM

            t0 = time.perf_counter()
            self.llm = LLM(**self.args())
            print(f"  vllm LLM start: {time.perf_counter() - t0:.0f} s", flush=True)
        return _Offline(self)

    @staticmethod
    def done(eng) -> None:
        eng.bench.llm.reset_prefix_cache()

    def tail(self, out: dict) -> None:
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.inputs import TokensPrompt
        from vllm.v1.engine.async_llm import AsyncLLM

        episodes = self.episodes()
        warm = self.req(self.rand(128), 32, 1)

        async def run() -> float:
            eng = AsyncLLM.from_engine_args(AsyncEngineArgs(**self.args()))

            async def call(r, rid):
                final = None
                async for o in eng.generate(TokensPrompt(prompt_token_ids=list(r.prompt_ids)), self.params(r), rid):
                    final = o
                return final.outputs[0]

            await asyncio.gather(*[call(warm, f"warm{k}") for k in range(4)])

            async def one(i):
                ep = episodes[i]
                for t in range(ep["turns"]):
                    o = await call(self.req(ep["prompt"], ep["lens"][t], 7919 * t + i), f"{i}-{t}")
                    ep["prompt"] += list(o.token_ids) + self.rand(16)

            t0 = time.perf_counter()
            await asyncio.gather(*[one(i) for i in range(len(episodes))])
            dt = time.perf_counter() - t0
            out["tail_used_gib"] = used_gib()
            eng.shutdown()
            return dt

        dt = asyncio.run(run())
        out.update(tail_eps=len(episodes) / dt, tail_s=dt, tail_tokens_s=sum(sum(ep["lens"]) for ep in episodes) / dt)
        print(f"  vllm tail: {len(episodes)} episodes, {sum(ep['turns'] for ep in episodes)} calls in {dt:.2f} s",
              flush=True)


class _Offline:
    """vLLM's offline ``LLM`` behind the engine calls the parts make (``generate``, ``stats``, ``release``)."""

    def __init__(self, bench: VLLMBench):
        self.bench = bench
        self.stats = {"prefill_tokens": 0}

    def generate(self, reqs):
        from vllm.inputs import TokensPrompt

        from masrl.messages import GenOutput

        outs = self.bench.llm.generate([TokensPrompt(prompt_token_ids=list(r.prompt_ids)) for r in reqs],
                                       [self.bench.params(r) for r in reqs], use_tqdm=False)
        res = []
        for r, o in zip(reqs, outs):
            self.stats["prefill_tokens"] += len(r.prompt_ids) - (o.num_cached_tokens or 0)
            c = o.outputs[0]
            ids = list(c.token_ids)
            res.append(GenOutput(ids, [float(step[t].logprob) for step, t in zip(c.logprobs or [], ids)], "", "length"))
        return res

    def release(self) -> None:
        return None


def child(kind: str, shape: str, parts: list[str]) -> dict:
    out = {}
    if kind.startswith("vllm"):
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
        os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")  # this process touches CUDA first
        from masrl.engines.vllm_engine import no_flashinfer

        no_flashinfer()
        bench = VLLMBench(shape, seeded=kind == "vllm")
        if kind == "vllm@bare":
            bench.logprobs = None
        for part in ("rollout", "grpo", "long", "tail"):  # main() runs the tail (the AsyncLLM) in a child of its own
            if part in parts:
                getattr(bench, part)(out)
                out.setdefault(f"{part}_used_gib", used_gib())
        return out
    import torch

    bench = Bench("paged", shape)
    for part in ("rollout", "grpo", "tail", "long"):
        if part in parts:
            torch.cuda.reset_peak_memory_stats()
            getattr(bench, part)(out)  # the part releases its engine when done: its peak is what it held
            held = torch.cuda.max_memory_reserved() - torch.cuda.memory_reserved()  # torch's peak less what it holds now
            out[f"{part}_used_gib"] = used_gib() + held / 2**30  # plus the CUDA context, as vLLM's figure has it
    return out


def roofline_tps(shape: str, batch: int, context: int) -> float | None:
    """Tokens/s if a decode step took only the time to read the weights and the batch's KV at the card's bandwidth."""
    import torch

    from masrl.models import RANDOM_SHAPES, load_tokenizer

    name = torch.cuda.get_device_name(0) if torch.cuda.is_available() else ""
    bw = next((v for k, v in BANDWIDTH.items() if k in name), None)
    if bw is None:
        return None
    cfg = RANDOM_SHAPES[SHAPES[shape]](len(load_tokenizer(SHAPES[shape])))
    D, L, V, inter = cfg.hidden_size, cfg.num_hidden_layers, cfg.vocab_size, cfg.intermediate_size
    H, Hkv = cfg.num_attention_heads, cfg.num_key_value_heads
    hd = D // H
    params = L * (D * H * hd + 2 * D * Hkv * hd + H * hd * D + 3 * D * inter) + V * D * (1 if cfg.tie_word_embeddings
                                                                                         else 2)
    kv = 2 * L * Hkv * hd * context * batch
    return batch * bw / (2 * (params + kv))


def _fmt(v) -> str:
    return "-" if v is None else (f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}")


ROWS = [("rollout tok/s, batch 1", "rollout_tps_1", 1), ("rollout tok/s, batch 64", "rollout_tps_64", 64),
        ("rollout tok/s, batch 256", "rollout_tps_256", 256), ("GRPO 64x8: tok/s", "grpo_tps", None),
        ("GRPO 64x8: prompt tokens computed", "grpo_prefill_tokens", None),
        ("GRPO 64x8: device GiB in use", "grpo_used_gib", None), ("long tail: episodes/s", "tail_eps", None),
        ("long tail: seconds", "tail_s", None), ("16k prompt + 256 tokens: seconds", "long_s", None),
        ("16k prompt, 1 token (its prefill): seconds", "long_prefill_s", None),
        ("16k prompt: device GiB in use", "long_used_gib", None)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", choices=["0.5b", "7b"], default="0.5b")
    ap.add_argument("--only", default="rollout,grpo,tail,long")
    ap.add_argument("--engines", default="paged,vllm")
    ap.add_argument("--child")
    ap.add_argument("--json")
    a = ap.parse_args()
    parts = a.only.split(",")
    if a.child:
        print("RESULT " + json.dumps(child(a.child, a.shape, parts)), flush=True)
        return
    res = {}
    for kind in a.engines.split(","):
        t0 = time.perf_counter()
        if kind.startswith("vllm") and "tail" in parts and len(parts) > 1:  # the offline LLM, then the AsyncLLM: one at a time
            res[kind] = run_child(__file__, kind, "--shape", a.shape, "--only",
                                  ",".join(p for p in parts if p != "tail"), timeout=3000)
            res[kind].update(run_child(__file__, kind, "--shape", a.shape, "--only", "tail", timeout=3000))
        else:
            res[kind] = run_child(__file__, kind, "--shape", a.shape, "--only", a.only, timeout=3000)
        print(f"  [{kind}: {time.perf_counter() - t0:.0f} s]", flush=True)
    try:
        import vllm

        version = vllm.__version__
    except ImportError:
        version = "not installed"
    print(f"\n{header()}; vLLM {version}; shape {a.shape} ({SHAPES[a.shape]}), bf16, KV cache "
          f"{KV_FRACTION} of the card for each engine\n")
    names = [n for n in res if "error" not in res[n]]
    higher = "higher is better: tok/s, episodes/s; lower: seconds, tokens computed, GiB"
    cols = ["measure", *names, *(f"{n} / {names[-1]}" for n in names[:-1]), "roofline"]
    print("| " + " | ".join(cols) + " |\n|" + " --- |" * len(cols))
    for label, key, batch in ROWS:
        vals = [res[n].get(key) for n in names]
        if all(v is None for v in vals):
            continue
        last = vals[-1]
        ratios = [f"{v / last:.2f}x" if last and v is not None else "-" for v in vals[:-1]]
        roof = roofline_tps(a.shape, batch, 128 + 128) if batch else None
        print("| " + " | ".join([label, *(_fmt(v) for v in vals), *ratios, _fmt(roof)]) + " |")
    print(f"\n({higher}; the roofline at the mean context of a rollout call, 256 tokens)")
    for n, r in res.items():
        if "error" in r:
            print(f"{n} failed: {r['error']}")
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=2))


if __name__ == "__main__":
    sys.exit(main())
