"""The 7B shape on one GPU: rollout tokens/s against ``model.generate``, and four LoRA agents on one
7B base (the math team) against TRL's GRPOTrainer with peft on the same base.

Run on a GPU host (set up with scripts/gpu/prepare.sh here, then there):
    source scripts/gpu/setup.sh && python3 benchmarks/bench_7b.py [--only rollout,team,trl] [--quick]

The model is ``random-qwen2.5-7b`` (Qwen2.5-7B's shape, 7.6B parameters, random bf16 weights drawn
on the GPU: nothing is downloaded). Each part runs in its own child process (bench_gpu.py's
children, with the 7B shape), so one part's memory never counts in another's peak.

Sides, and what each does differently:
* rollout: as bench_gpu.py (masrl's paged engine vs ``model.generate``, 128-token prompts, 256
  new tokens, EOS ignored), at batch 1 / 64 / 256.
* team: ``math/team_lora`` on the 7B shape: four LoRA adapters (r 16 on every
  projection) on one frozen base, 32 tasks x 8 samples x 4 agents = 1,024 calls a step (new tokens
  64/48/64/16 by role), mixed-adapter engine batches, then four LoRA updates (micro-batches of
  4,096 tokens). Random weights never
  write the answer format: a hash of each completion gives groups reward variance.
* single: masrl on TRL's workload (one agent with a LoRA of the same rank, the same prompts, sample
  count and new tokens, EOS ignored), the like-for-like comparison; one child per update setting in
  ``--single`` (micro-batch tokens, ``TOKENS:ckpt`` with activation checkpointing), each row with its
  peak memory and what holds it.
* trl: one agent, TRL GRPOTrainer with a peft LoRA of the same rank and targets, the same number
  of samples a step (128 prompts x 8), 64 new tokens, HF generate (vLLM is not installed), bf16,
  no KL (beta 0), no gradient checkpointing, micro-batches of 16 sequences. Compared as seconds per trained sample.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import harness

GPU_BENCH = harness.ROOT / "benchmarks" / "bench_gpu.py"  # its rollout, team and grpo_ours children


def child_trl_lora(prompts_n: int, samples: int, new_tokens: int, steps: int) -> dict:
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from masrl.models import load_model

    model, tok = load_model(harness.SHAPES["7b"], seed=0, dtype=torch.bfloat16, device=harness.DEV)
    ds = Dataset.from_list([{"prompt": m} for m in harness.grpo_prompts(prompts_n)] * steps)
    times: list[float] = []

    class Timer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            harness.sync()
            self.t = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            harness.sync()
            times.append(time.perf_counter() - self.t)

    def reward(completions, **kw):
        return [harness.fake_reward(c[0]["content"] if isinstance(c, list) else c) for c in completions]

    args = GRPOConfig(
        # micro-batches of 16 sequences (128 at once would not fit a 7B model's activations), one
        # optimizer step and one generation round per prompts_n x samples
        output_dir=f"/tmp/masrl-bench-trl7b-{time.time_ns()}", per_device_train_batch_size=16,
        gradient_accumulation_steps=prompts_n * samples // 16, num_generations=samples, max_completion_length=new_tokens,
        temperature=1.0, top_p=1.0, beta=0.0, num_iterations=1, max_steps=steps, learning_rate=5e-4,
        logging_steps=1000, report_to="none", save_strategy="no", loss_type="dapo", disable_dropout=True, seed=0,
        gradient_checkpointing=False, bf16=torch.cuda.is_available(), use_cpu=not torch.cuda.is_available(),
        dataloader_num_workers=0)
    lora = LoraConfig(r=16, lora_alpha=32, target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                            "up_proj", "down_proj"], task_type="CAUSAL_LM")
    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=args, train_dataset=ds, processing_class=tok,
                          peft_config=lora, callbacks=[Timer()])
    trainer.train()
    return {"steps": [{"step_s": t} for t in times], "samples": prompts_n * samples, "peak_gb": harness.peak_gb()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--child", nargs="+")
    ap.add_argument("--only", default="rollout,team,trl,single")
    ap.add_argument("--quick", action="store_true", help="smaller workloads, for a first check")
    ap.add_argument("--single", default="8192,2048", help="the single part's update micro-batch tokens, one child "
                    "each; TOKENS:ckpt adds activation checkpointing")
    a = ap.parse_args()
    if a.child:
        print("RESULT " + json.dumps(child_trl_lora(*(int(x) for x in a.child[1:]))), flush=True)
        return
    only = set(a.only.split(","))
    print(harness.header().replace("bench_gpu.py", "bench_7b.py"), flush=True)
    rows: list[tuple] = []
    if "rollout" in only:
        batches = "1,64" if a.quick else "1,64,256"
        r = harness.run_child(GPU_BENCH, "rollout", "7b", batches, "64" if a.quick else "256", "128")
        for b in batches.split(","):
            x = r.get(b)
            if x:
                rows.append((f"rollout tok/s, 7B shape, batch {b}", f"{x['ours_tps']:,.0f}", f"generate {x['hf_tps']:,.0f}",
                             f"{x['ours_tps'] / x['hf_tps']:.1f}x"))
        if "step_ms" in r:
            rows.append(("  decode step (graph replay), 7B", ", ".join(f"b{k}: {v:.2f} ms" for k, v in r["step_ms"].items()),
                         "", ""))
    team_args = ("2", "4", "4") if a.quick else ("2", "32", "8")
    team = harness.run_child(GPU_BENCH, "team", *team_args, "7b", timeout=1200) if "team" in only else {}
    trl_args = ("16", "4", "64", "2") if a.quick else ("128", "8", "64", "2")
    trl = run_trl(trl_args) if "trl" in only else {}
    rows += team_rows(team, trl)
    if "single" in only:  # one agent on TRL's prompts and sample count: the same workload on both sides
        n = int(trl_args[0]) * int(trl_args[1])
        for variant in a.single.split(","):
            tokens, _, flag = variant.partition(":")
            ckpt = flag == "ckpt"
            one = harness.run_child(GPU_BENCH, "grpo_ours", *trl_args[:3], "1", "7b", "16", "auto", tokens,
                                    str(int(ckpt)), timeout=1200)
            if not one.get("steps"):
                rows.append((f"one agent on TRL's workload, micro-batches of {variant}", "failed (see above)", "", ""))
                continue
            s = one["steps"][-1]
            parts = ", ".join(f"{k} {v:.1f}" for k, v in one.get("parts", {}).items() if v >= 0.05)
            rows.append((f"one agent, LoRA r16 on 7B, TRL's workload ({n} samples x {trl_args[2]} tokens), update "
                         f"micro-batches of {tokens} tokens{', activation checkpointing' if ckpt else ''}",
                         f"{s['step_s']:.1f} s (rollout {s['rollout_s']:.1f}, update {s['update_s']:.1f}); peak "
                         f"{one['peak_gb']:.1f} GiB ({parts})",
                         f"TRL {trl['steps'][-1]['step_s']:.1f} s, peak {trl['peak_gb']:.1f} GiB" if trl.get("steps") else "",
                         f"{trl['steps'][-1]['step_s'] / s['step_s']:.2f}x faster, "
                         f"{one['peak_gb'] / trl['peak_gb']:.2f}x the memory" if trl.get("steps") else ""))
    print("\n| measure | masrl | peer | ratio |\n| --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r[0]} | {r[1]} | {r[2]} | {r[3]} |")


def run_trl(args) -> dict:
    import subprocess

    proc = subprocess.run([sys.executable, __file__, "--child", "trl", *args], capture_output=True, text=True,
                          timeout=1500, cwd=harness.ROOT)
    lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    if proc.returncode or not lines:
        tail = proc.stderr.strip().splitlines()[-8:]
        print("  TRL child failed:\n    " + "\n    ".join(tail), flush=True)
        return {"error": tail[-1] if tail else f"exit {proc.returncode}"}
    return json.loads(lines[-1][len("RESULT "):])


def team_rows(team: dict, trl: dict) -> list[tuple]:
    rows = []
    steps = team.get("steps", [])
    for i, s in enumerate(steps):
        rows.append((f"math team, 4 LoRA on 7B, step {i + 1} ({s['calls']} calls, {s['trained_samples']:.0f} trained)",
                     f"{s['step_s']:.1f} s (rollout {s['rollout_s']:.1f}, update {s['update_s']:.1f})", "",
                     f"peak GPU memory {team['peak_gb']:.1f} GiB" if i == 0 else ""))
    if "error" in team:
        rows.append(("math team, 4 LoRA on 7B", f"failed: {team['error'][:80]}", "", ""))
    if trl.get("steps"):
        rows.append((f"TRL GRPOTrainer + peft, 7B, {trl['samples']} samples", "",
                     ", ".join(f"{s['step_s']:.1f} s" for s in trl["steps"]), f"peak GPU memory {trl['peak_gb']:.1f} GiB"))
    if steps and trl.get("steps"):
        ours = steps[-1]["step_s"] / max(1.0, steps[-1]["trained_samples"])
        theirs = trl["steps"][-1]["step_s"] / trl["samples"]
        rows.append(("s per trained sample, 7B LoRA (last step)", f"{ours * 1e3:.1f} ms (team, 4 adapters)",
                     f"TRL+peft {theirs * 1e3:.1f} ms (1 agent; peak {trl['peak_gb']:.1f} GiB)",
                     f"{theirs / ours:.2f}x faster"))
    elif "error" in trl:
        rows.append(("TRL GRPOTrainer + peft, 7B", f"failed: {trl['error'][:80]}", "", ""))
    return rows


if __name__ == "__main__":
    main()
