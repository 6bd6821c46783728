"""masrl vs peers on one GPU: rollout tokens/s, update MFU, a GRPO step vs TRL, the LoRA math team.

Run on a GPU host (set up with scripts/gpu/prepare.sh here, then there):
    source scripts/gpu/setup.sh && python3 benchmarks/bench_gpu.py [--only rollout,update,grpo,team] [--quick]

Every measurement runs in its own child process and prints JSON that this driver collects; the
driver prints one table with the command, the GPU, the versions and the ratios. Models are built
from config with random weights, bf16 (no hub): SmolLM2-135M's shape and Qwen2.5-0.5B's shape.
Random weights sample near-uniform tokens, so every side generates with EOS ignored.

Sides, and what each does differently:
* rollout: masrl's paged engine (paged KV cache, CUDA-graph decode, fused q/k/v and gate/up, host
  checks every 8 steps) vs ``model.generate`` (HF's default dynamic cache, sampling at T=1,
  top_k=0), both from 128-token distinct prompts, 256 new tokens, EOS ignored.
* update: masrl's trainer (packed rows with varlen flash attention, output head only on
  completion tokens, bf16 weights with fp32 master weights and fused AdamW) vs plain HF
  (``model(input_ids, attention_mask)`` on padded micro-batches of 8, full logits, bf16 weights,
  ``torch.optim.AdamW``). MFU counts the same useful FLOPs for both: 6 x linear params x tokens,
  causal attention, and the output head on completion tokens only, over 989 TFLOP/s (H100/H200
  dense bf16 peak).
* grpo: bench_cpu.py's single-agent workload scaled up (64 prompts x 8 samples x 256 new tokens,
  one update, no KL, token-level loss, pseudo-random rewards), masrl PolicyWorker vs TRL
  GRPOTrainer (bf16, no gradient checkpointing, HF generate: vLLM is not installed).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
from pathlib import Path

from harness import (
    DEV,
    PEAK_TFLOPS,
    SHAPES,
    decode_profile,
    fake_reward,
    grpo_prompts,
    header,
    peak_gb,
    sync,
    update_workload,
    useful_flops,
)
from harness import run_child as _run_child

from masrl.families import config_path


def run_child(*args: str, timeout: int = 900) -> dict:
    """One of this script's measurements in a fresh process (``--child``)."""
    return _run_child(__file__, *args, timeout=timeout)


# -- rollout -------------------------------------------------------------------------------------

def child_rollout(shape: str, batches: list[int], new_tokens: int, prompt_len: int, engine: str = "paged") -> dict:
    import torch

    from masrl.config import SamplingParams
    from masrl.messages import GenRequest
    from masrl.models import load_model

    model, tok = load_model(SHAPES[shape], seed=0, dtype=torch.bfloat16, device=DEV)
    rng = random.Random(0)
    out = {}
    from masrl.engines.base import make_engine

    eng = make_engine(engine, model, tok, [tok.eos_token_id], device=DEV, seed=0, max_batch_size=max(batches))
    sp = SamplingParams(temperature=1.0, max_new_tokens=new_tokens, ignore_eos=True)
    for B in batches:
        prompts = [[rng.randrange(100, 49000) for _ in range(prompt_len)] for _ in range(B)]
        reqs = [GenRequest(p, sp) for p in prompts]
        eng.generate(reqs)  # warm-up: captures this batch's graphs
        sync()
        t0 = time.perf_counter()
        res = eng.generate(reqs)
        sync()
        ours = time.perf_counter() - t0
        assert all(len(r.completion_ids) == new_tokens for r in res)
        ids = torch.tensor(prompts, device=DEV)
        kw = dict(do_sample=True, temperature=1.0, top_k=0, top_p=1.0, pad_token_id=tok.pad_token_id,
                  attention_mask=torch.ones_like(ids))
        with torch.inference_mode():
            model.generate(ids, max_new_tokens=8, min_new_tokens=8, **kw)
            sync()
            t0 = time.perf_counter()
            o = model.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, **kw)
            sync()
            hf = time.perf_counter() - t0
        assert o.shape[1] - prompt_len == new_tokens
        out[B] = {"ours_tps": B * new_tokens / ours, "hf_tps": B * new_tokens / hf, "ours_s": ours, "hf_s": hf}
        print(f"  rollout {shape} batch {B}: masrl {out[B]['ours_tps']:.0f} tok/s, generate {out[B]['hf_tps']:.0f} tok/s",
              flush=True)
    out["graphs"] = eng.stats["graphs_captured"]
    out["step_ms"] = decode_profile(eng, batches)
    return out


# -- update --------------------------------------------------------------------------------------

def child_update(side: str, repeats: int) -> dict:
    import torch

    from masrl.models import load_model

    rows = update_workload()
    if side == "ours":
        from masrl.config import AlgorithmConfig, OptimConfig
        from masrl.policies import PolicySpec
        from masrl.worker.model.held import HeldModel
        from masrl.worker.model.precision import MasterWeightsAdamW
        from masrl.worker.updater.batching import Sample
        from masrl.worker.updater.training import Learner

        host = HeldModel(SHAPES["0.5b"], [PolicySpec("p", SHAPES["0.5b"], optim=OptimConfig(lr=1e-6))],
                         device=DEV, dtype=torch.bfloat16)
        opt = MasterWeightsAdamW(host.policy_parameters("p"), lr=1e-6, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
        algo = AlgorithmConfig(group_key=["task_id"], micro_batch_tokens=32768)  # the whole workload in one pass
        cfg = host.core.config

        def step():
            samples = [Sample(f"s{i}", "p", p, c, [-10.0] * len(c), 1.0, {"task_id": i % 4}, reward=float(i % 5))
                       for i, (p, c) in enumerate(rows)]
            return Learner(host, algo, 0).train("p", samples, opt, 1.0)

        layout = Learner(host, algo).layout()
    else:
        model, _ = load_model(SHAPES["0.5b"], seed=0, dtype=torch.bfloat16, device=DEV)
        model.train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-6, weight_decay=0.0)
        cfg = model.config
        layout = "padded HF forward, micro-batches of 8"

        def step():
            opt.zero_grad(set_to_none=True)
            n_tok = sum(len(c) for _, c in rows)
            for k in range(0, len(rows), 8):
                mb = rows[k : k + 8]
                S = max(len(p) + len(c) for p, c in mb)
                ids = torch.zeros((len(mb), S), dtype=torch.long)
                att = torch.zeros((len(mb), S), dtype=torch.long)
                lab = torch.zeros((len(mb), S), dtype=torch.bool)
                for i, (p, c) in enumerate(mb):
                    ids[i, : len(p) + len(c)] = torch.tensor(p + c)
                    att[i, : len(p) + len(c)] = 1
                    lab[i, len(p) : len(p) + len(c)] = True
                ids, att, lab = ids.to(DEV), att.to(DEV), lab.to(DEV)
                logits = model(input_ids=ids, attention_mask=att).logits[:, :-1].float()
                logp = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
                loss = -(logp * lab[:, 1:]).sum() / n_tok
                loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            return {}

    step()  # warm-up
    sync()
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        step()
        sync()
        times.append(time.perf_counter() - t0)
    t = sorted(times)[len(times) // 2]
    flops = useful_flops(cfg, rows)
    return {"s": t, "mfu": flops / t / (PEAK_TFLOPS * 1e12), "tflops": flops / t / 1e12, "layout": layout,
            "tokens": sum(len(p) + len(c) for p, c in rows), "peak_gb": peak_gb()}


# -- GRPO step vs TRL --------------------------------------------------------------------------------

MEMORY_PARTS = ("weights", "weight_copy", "optimizer", "engine_kv", "engine_weights", "engine_buffers")


def child_grpo_ours(prompts_n: int, samples: int, new_tokens: int, repeats: int, shape: str = "0.5b",
                    lora: int = 0, engine: str = "auto", micro_tokens: int = 0, checkpointing: int = 0) -> dict:
    """``lora`` > 0: one LoRA adapter of that rank on every projection (the 7B comparison with TRL + peft);
    ``engine``: the rollout engine (auto: paged on CUDA; vllm: vLLM, its weights synced after the update);
    ``micro_tokens``: the update's micro-batch tokens (0: 16,384, or 8,192 with LoRA); ``checkpointing``: 1 for
    activation checkpointing. Returns the steps' times, the run's peak and what holds the memory (the worker's
    ``take_memory`` parts, GiB)."""
    from masrl.config import AlgorithmConfig, LoraConfig, OptimConfig, SamplingParams
    from masrl.messages import GenCall
    from masrl.policies import PolicySpec
    from masrl.worker.policy_worker import PolicyWorker

    adapter = LoraConfig(r=lora, alpha=2 * lora) if lora else None
    spec = PolicySpec("p", SHAPES[shape], lora=adapter, optim=OptimConfig(lr=5e-4 if lora else 1e-6), device=DEV)
    algo = AlgorithmConfig(group_key=["task_id"], micro_batch_tokens=micro_tokens or (8192 if lora else 16384),
                           activation_checkpointing=bool(checkpointing))
    w = PolicyWorker(SHAPES[shape], [spec], algo, device=DEV, precision="bf16",
                     engine=engine, engine_options={"max_batch_size": min(256, prompts_n * samples)})
    sp = SamplingParams(temperature=1.0, max_new_tokens=new_tokens, ignore_eos=True)
    msgs = grpo_prompts(prompts_n)
    steps = []
    for rep in range(repeats + 1):
        calls = [GenCall(f"c{rep}-{i}-{k}", "p", m, sp, key={"task_id": i}) for i, m in enumerate(msgs) for k in range(samples)]
        sync()
        t0 = time.perf_counter()
        res = w.generate(calls)
        sync()
        t1 = time.perf_counter()
        w.commit_rewards({r.call_id: fake_reward(r.text + r.call_id) for r in res})
        m = w.train_step()["p"]
        sync()
        t2 = time.perf_counter()
        # every sampled token trains, but for a group whose hash rewards happen to be all equal (no advantage)
        assert m["trained_tokens"] == (prompts_n * samples - m["skipped_zero_adv"]) * new_tokens, m
        if rep:
            steps.append({"rollout_s": t1 - t0, "update_s": t2 - t1, "step_s": t2 - t0,
                          "lp_mismatch": m["lp_mismatch"], "lp_mismatch_max": m["lp_mismatch_max"]})
    row = w.take_memory()[0] if DEV.startswith("cuda") else {}
    parts = {k: round(v, 2) for k, v in row.items() if isinstance(v, float) and (k.endswith("gib") or k in MEMORY_PARTS)}
    return {"steps": steps, "peak_gb": max(peak_gb(), row.get("peak_gib", 0.0)), "parts": parts}


def child_grpo_trl(prompts_n: int, samples: int, new_tokens: int, repeats: int) -> dict:
    import tempfile

    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from masrl.models import load_model

    model, tok = load_model(SHAPES["0.5b"], seed=0, dtype=torch.bfloat16, device="cpu")
    tmp = tempfile.mkdtemp(prefix="masrl-bench-trl-")
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    model = AutoModelForCausalLM.from_pretrained(tmp, dtype=torch.bfloat16)
    ds = Dataset.from_list([{"prompt": m} for m in grpo_prompts(prompts_n)] * (repeats + 1))

    def reward(completions, **kw):
        return [fake_reward(c[0]["content"] if isinstance(c, list) else c) for c in completions]

    times: list[float] = []

    class Timer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            sync()
            self.t = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            sync()
            times.append(time.perf_counter() - self.t)

    args = GRPOConfig(
        output_dir=tmp + "/out", per_device_train_batch_size=prompts_n, gradient_accumulation_steps=samples,
        num_generations=samples, max_completion_length=new_tokens, temperature=1.0, top_p=1.0, beta=0.0,
        num_iterations=1, max_steps=repeats + 1, learning_rate=1e-6, logging_steps=1000, report_to="none",
        save_strategy="no", loss_type="dapo", disable_dropout=True, seed=0, gradient_checkpointing=False,
        bf16=torch.cuda.is_available(), use_cpu=not torch.cuda.is_available(),
        generation_kwargs={"min_new_tokens": new_tokens}, dataloader_num_workers=0,
    )
    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=args, train_dataset=ds, processing_class=tok,
                          callbacks=[Timer()])
    trainer.train()
    return {"steps": [{"step_s": t} for t in times[1:]], "peak_gb": peak_gb()}


# -- the math team on four LoRA adapters ----------------------------------------------------------------

def child_team(steps: int, tasks: int, samples: int, shape: str = "0.5b") -> dict:
    import asyncio

    from masrl.config import load_config
    from masrl.driver.run.loop import Trainer

    cfg = load_config(config_path("math/team_lora"), [
        f"device={DEV}", f"model={SHAPES[shape]}", f"train.steps={steps}", "train.eval_before=false",
        "train.eval_after=false", "train.save_every=0", f"rollout.tasks_per_step={tasks}",
        f"rollout.samples_per_task={samples}", "rollout.max_batch_size=256", "rollout.max_in_flight=512",
        f"algorithm.micro_batch_tokens={4096 if shape == '7b' else 16384}", f"output_dir=/tmp/masrl-bench-team-{os.getpid()}",
        # random weights never write the tag format: a hash of each completion gives groups reward variance
        "rewards=[{type: outcome}, {type: format, weight: 0.5}, {type: 'harness:agent_hash_reward'}]"])
    tr = Trainer(cfg)
    tr.prepare(resume=False)
    recs = []
    for _ in range(steps):
        t0 = time.perf_counter()
        rec = asyncio.run(tr.train_step())
        sync()
        rec["step_s"] = time.perf_counter() - t0
        recs.append({k: rec[k] for k in ("step_s", "rollout_s", "update_s")} |
                    {"calls": sum(a["calls"] for a in rec["rollout"]["agents"].values()),
                     "trained_tokens": sum(m.get("trained_tokens", 0) for m in rec["policies"].values()),
                     "trained_samples": sum(m.get("n_seqs", 0) for m in rec["policies"].values()),
                     "mismatch": {p: (m["lp_mismatch"], m["lp_mismatch_max"]) for p, m in rec["policies"].items()}})
    asyncio.run(tr.rt.controller.aclose())
    return {"steps": recs, "peak_gb": peak_gb()}


# -- driver ------------------------------------------------------------------------------------------

def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--child", nargs="+")
    ap.add_argument("--only", default="rollout,update,grpo,team")
    ap.add_argument("--quick", action="store_true", help="smaller workloads, for a first check")
    ap.add_argument("--json", help="also write all numbers to this file")
    ap.add_argument("--engine", choices=["paged", "vllm"], default="paged",
                    help="the rollout part's engine: paged (the default on CUDA) or vllm; with vllm the grpo part "
                         "runs the whole step on each engine")
    a = ap.parse_args()
    if a.child:
        kind, *rest = a.child
        fns = {
            "rollout": lambda: child_rollout(rest[0], [int(x) for x in rest[1].split(",")], int(rest[2]), int(rest[3]),
                                             *rest[4:5]),
            "update": lambda: child_update(rest[0], int(rest[1])),
            "grpo_ours": lambda: child_grpo_ours(*(int(x) for x in rest[:4]), *rest[4:5], *(int(x) for x in rest[5:6]),
                                                 *rest[6:7], *(int(x) for x in rest[7:9])),
            "grpo_trl": lambda: child_grpo_trl(*(int(x) for x in rest)),
            "team": lambda: child_team(*(int(x) for x in rest[:3]), *rest[3:]),
        }
        print("RESULT " + json.dumps(fns[kind]()), flush=True)
        return
    only = set(a.only.split(","))
    report: dict = {"header": header()}
    print(report["header"], flush=True)
    rows: list[tuple[str, str, str, str]] = []
    for part, measure in (("rollout", measure_rollout), ("update", measure_update), ("grpo", measure_grpo),
                          ("team", measure_team)):
        if part in only:
            rows += measure(report, a.quick, a.engine) if part in ("rollout", "grpo") else measure(report, a.quick)
    print("\n| measure | masrl | peer | ratio |\n| --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r[0]} | {r[1]} | {r[2]} | {r[3]} |")
    if a.json:
        Path(a.json).write_text(json.dumps(report, indent=2, default=str))


def measure_rollout(report: dict, quick: bool, engine: str = "paged") -> list[tuple]:
    rows = []
    batches = "1,64" if quick else "1,64,256"
    for shape in ("135m",) if quick else ("135m", "0.5b"):
        r = run_child("rollout", shape, batches, "256", "128", engine)
        report[f"rollout_{shape}"] = r
        for B in batches.split(","):
            x = r.get(B) or r.get(int(B))
            if x:
                bar = 20 if B == "1" else (10 if B == "256" else None)
                ratio = x["ours_tps"] / x["hf_tps"]
                rows.append((f"rollout tok/s ({engine} engine), {shape} shape, batch {B}", f"{x['ours_tps']:,.0f}",
                             f"generate {x['hf_tps']:,.0f}",
                             f"{ratio:.1f}x" + (f" (bar {bar}x: {'met' if ratio >= bar else 'missed'})" if bar else "")))
        if "step_ms" in r:
            rows.append((f"  decode step (graph replay), {shape}",
                         ", ".join(f"b{k}: {v:.3f} ms" for k, v in r["step_ms"].items()), "", ""))
    return rows


def measure_update(report: dict, quick: bool) -> list[tuple]:
    ours, hf = run_child("update", "ours", "3"), run_child("update", "hf", "3")
    report["update"] = {"ours": ours, "hf": hf}
    if "mfu" not in ours or "mfu" not in hf:
        return []
    return [("update MFU, 0.5B shape, 32 seqs 256-1024 tok", f"{ours['mfu']:.2f} ({ours['s']:.2f} s)",
             f"plain HF {hf['mfu']:.2f} ({hf['s']:.2f} s)",
             f"{hf['s'] / ours['s']:.2f}x faster (bar MFU 0.40: {'met' if ours['mfu'] >= 0.40 else 'missed'})")]


def measure_grpo(report: dict, quick: bool, engine: str = "paged") -> list[tuple]:
    """A whole GRPO step (rollout, update, weight sync) against TRL's; with ``engine`` vllm, also on vLLM."""
    args = ("16", "8", "128", "1") if quick else ("64", "8", "256", "2")
    engines = ["paged"] + (["vllm"] if engine == "vllm" else [])
    ours = {e: run_child("grpo_ours", *args, "0.5b", "0", e) for e in engines}
    trl = run_child("grpo_trl", *args, timeout=1500)
    report["grpo"] = {"ours": ours, "trl": trl}
    rows = []
    t = min(x["step_s"] for x in trl["steps"]) if trl.get("steps") else None
    for e, r in ours.items():
        if "steps" not in r:
            rows.append((f"GRPO step, {e} engine", f"failed: {r.get('error', '?')[:60]}", "", ""))
            continue
        o = min(x["step_s"] for x in r["steps"])
        mm = r["steps"][-1]
        note = f"rollout {mm['rollout_s']:.1f} s, update {mm['update_s']:.1f} s"
        name = f"GRPO step ({e} engine), 0.5B, {args[0]}x{args[1]}x{args[2]} tok"
        rows.append((name, f"{o:.1f} s ({note})", f"TRL {t:.1f} s" if t else f"TRL failed: {trl.get('error', '?')[:60]}",
                     f"{o / t:.2f}x TRL's time (bar 0.33: {'met' if o / t <= 0.33 else 'missed'})" if t else ""))
        rows.append((f"  rollout/trainer logprob gap (bf16, {e})",
                     f"mean {mm['lp_mismatch']:.2e}, max {mm['lp_mismatch_max']:.2e}", "", ""))
    return rows


def measure_team(report: dict, quick: bool) -> list[tuple]:
    args = ("2", "8", "4") if quick else ("3", "32", "8")
    r = run_child("team", *args)
    report["team"] = r
    return [(f"math team, 4 LoRA on 0.5B, step {i + 1} ({s['calls']} calls)",
             f"{s['step_s']:.1f} s (rollout {s['rollout_s']:.1f}, update {s['update_s']:.1f})", "",
             f"peak GPU memory {r['peak_gb']:.1f} GiB" if i == 0 else "") for i, s in enumerate(r.get("steps", []))]


if __name__ == "__main__":
    main()
