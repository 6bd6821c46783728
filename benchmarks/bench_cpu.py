"""masrl vs peers on this machine: one GRPO step vs TRL, engine vs model.generate, peak RSS.

Run: make bench   (installs TRL into the venv for this script only)
  or: python benchmarks/bench_cpu.py [--skip-trl] [--skip-rss] [--repeats N]

Each measurement runs in its own child process (one process tree), so models, threads and
allocator state do not leak between them, and prints JSON that this driver collects.

Workload of the GRPO step (both sides identical): SmolLM2-135M-Instruct, 4 prompts x 4 samples,
exactly 64 new tokens each (EOS ignored), temperature 1, one update of all 16 sequences, no KL,
token-level loss, micro-batches of 4 (TRL: per-device batch 4, gradient accumulation 4).
Rewards are a fixed pseudo-random function of the completion, so no group has zero variance
and neither side can skip work. TRL runs in fp32 without gradient checkpointing (its CPU
defaults would autocast to bf16, which CPUs without bf16 units emulate slowly, and recompute
activations), as masrl does by default on a CPU; `--bf16` adds masrl's step with precision=bf16
(bf16 weights, fp32 masters), which pays on CPUs with AVX512-BF16 or AMX.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

from masrl.families import config_path

ROOT = Path(__file__).resolve().parents[1]
QUESTIONS = [
    "Tom has 7 apples and buys 5 more. How many apples does Tom have now?",
    "Mei had 18 pencils and gave away 9. How many pencils are left?",
    "There are 12 books on a shelf and 6 on a desk. How many books are there in all?",
    "Omar has 4 bags with 3 coins in each bag. How many coins does Omar have?",
]
SYSTEM = "You solve math word problems. Write the calculation in <solution></solution> and the final number in <answer></answer>."
NEW_TOKENS = 64


def messages(q):
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}]


def fake_reward(text: str) -> float:
    import zlib

    return (zlib.crc32(text.encode()) % 1000) / 1000.0


# -- children ------------------------------------------------------------------------------------

def child_ours_step(repeats: int, precision: str = "fp32") -> dict:
    import torch

    from masrl.config import AlgorithmConfig, OptimConfig, SamplingParams
    from masrl.messages import GenCall
    from masrl.policies import PolicySpec
    from masrl.worker.policy_worker import PolicyWorker

    torch.manual_seed(0)
    w = PolicyWorker("smollm2-135m-instruct", [PolicySpec("p", "smollm2-135m-instruct", optim=OptimConfig(lr=1e-6))],
                     AlgorithmConfig(micro_batch_size=4, group_key=["task_id"]), device="cpu", seed=0,
                     precision=precision)
    sp = SamplingParams(temperature=1.0, max_new_tokens=NEW_TOKENS, ignore_eos=True)
    times = []
    for rep in range(repeats + 1):  # first is warm-up
        calls = [GenCall(f"c{rep}-{i}-{k}", "p", messages(q), sp, key={"task_id": i})
                 for i, q in enumerate(QUESTIONS) for k in range(4)]
        t0 = time.perf_counter()
        res = w.generate(calls)
        t1 = time.perf_counter()
        w.commit_rewards({r.call_id: fake_reward(r.text) for r in res})
        m = w.train_step()["p"]
        t2 = time.perf_counter()
        assert all(r.n_completion_tokens == NEW_TOKENS for r in res)
        assert m["trained_tokens"] == 16 * NEW_TOKENS, m
        if rep:
            times.append({"rollout_s": t1 - t0, "update_s": t2 - t1, "step_s": t2 - t0})
    return {"steps": times}


def child_trl_step(repeats: int) -> dict:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from masrl.models import smollm2_model_dir

    path = str(smollm2_model_dir())
    tok = AutoTokenizer.from_pretrained(path)
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    ds = Dataset.from_list([{"prompt": messages(q)} for q in QUESTIONS] * (repeats + 1))

    def reward(completions, **kw):
        return [fake_reward(c[0]["content"] if isinstance(c, list) else c) for c in completions]

    times: list[float] = []

    class Timer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            self.t = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            times.append(time.perf_counter() - self.t)

    args = GRPOConfig(
        output_dir="/tmp/masrl-bench-trl", per_device_train_batch_size=4, gradient_accumulation_steps=4,
        num_generations=4, max_completion_length=NEW_TOKENS, temperature=1.0, top_p=1.0, beta=0.0,
        num_iterations=1, max_steps=repeats + 1, learning_rate=1e-6, logging_steps=1000, report_to="none",
        use_cpu=True, save_strategy="no", loss_type="dapo", disable_dropout=True, seed=0,
        generation_kwargs={"min_new_tokens": NEW_TOKENS},
        # fair on a CPU without bf16 units: full fp32 like ours, no activation recomputation
        bf16=False, fp16=False, gradient_checkpointing=False,
    )
    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=args, train_dataset=ds, processing_class=tok,
                          callbacks=[Timer()])
    trainer.train()
    return {"steps": [{"step_s": t} for t in times[1:]]}


def child_generate(batch: int, repeats: int) -> dict:
    import torch

    from masrl.config import SamplingParams
    from masrl.engines.hf import HFEngine
    from masrl.messages import GenRequest
    from masrl.models import load_model, stop_token_ids

    model, tok = load_model("smollm2-135m-instruct")
    prompts = [tok(tok.apply_chat_template(messages(QUESTIONS[i % 4]), add_generation_prompt=True, tokenize=False),
                   add_special_tokens=False)["input_ids"] for i in range(batch)]
    eng = HFEngine(model, tok, stop_token_ids(tok, model), seed=0)
    out = {}
    # ours
    eng.generate([GenRequest(p, SamplingParams(max_new_tokens=8, ignore_eos=True)) for p in prompts])
    best = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        res = eng.generate([GenRequest(p, SamplingParams(temperature=1.0, max_new_tokens=NEW_TOKENS, ignore_eos=True))
                            for p in prompts])
        best.append(time.perf_counter() - t0)
        assert all(len(r.completion_ids) == NEW_TOKENS for r in res)
    out["ours_s"] = min(best)
    # plain model.generate, same prompts, same number of new tokens
    tok.padding_side = "left"
    texts = [tok.decode(p) for p in prompts]
    enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    kw = dict(do_sample=True, temperature=1.0, top_p=1.0, top_k=0, pad_token_id=tok.pad_token_id)
    with torch.inference_mode():
        model.generate(**enc, max_new_tokens=8, min_new_tokens=8, **kw)
        best = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            o = model.generate(**enc, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, **kw)
            best.append(time.perf_counter() - t0)
            assert o.shape[1] - enc["input_ids"].shape[1] == NEW_TOKENS
    out["generate_s"] = min(best)
    out["tokens"] = batch * NEW_TOKENS
    return out


def child_rss(config: str) -> dict:
    from masrl.config import load_config
    from masrl.driver.run.loop import train

    cfg = load_config(config_path(config), [
        "train.steps=1", "train.eval_before=false", "train.eval_after=false", "train.save_every=0",
        "rollout.tasks_per_step=2", "rollout.samples_per_task=4", f"output_dir=/tmp/masrl-bench-rss-{config.replace('/', '-')}",
    ])
    import shutil

    shutil.rmtree(cfg.run_dir(), ignore_errors=True)
    t0 = time.perf_counter()
    train(cfg)
    return {"wall_s": time.perf_counter() - t0,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


# -- driver --------------------------------------------------------------------------------------

def run_child(*args: str, timeout: int = 3600) -> dict:
    cmd = [sys.executable, __file__, "--child", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"child {args} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def machine() -> str:
    cpu = "unknown CPU"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import torch

    return (f"{cpu}, {os.cpu_count()} cores, torch {torch.__version__}, {torch.get_num_threads()} threads, "
            f"Python {platform.python_version()}")


def median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2]


def parts(steps) -> str:
    """The medians of a GRPO-step child's rollout and update seconds."""
    return (f"rollout {median([s['rollout_s'] for s in steps]):.1f} s, "
            f"update {median([s['update_s'] for s in steps]):.1f} s")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--child", nargs="+")
    ap.add_argument("--skip-trl", action="store_true")
    ap.add_argument("--skip-rss", action="store_true")
    ap.add_argument("--skip-generate", action="store_true")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--json", help="also write all numbers to this file")
    ap.add_argument("--bf16", action="store_true", help="also run masrl's GRPO step with precision=bf16 (bf16 weights and "
                    "compute, fp32 masters): worth it on CPUs with native bf16 (AVX512-BF16, AMX)")
    a = ap.parse_args()
    if a.child:
        kind, *rest = a.child
        fn = {"ours": lambda: child_ours_step(int(rest[0]), *rest[1:]), "trl": lambda: child_trl_step(int(rest[0])),
              "generate": lambda: child_generate(int(rest[0]), int(rest[1])), "rss": lambda: child_rss(rest[0])}[kind]
        print("RESULT " + json.dumps(fn()), flush=True)
        return

    from masrl.models import smollm2_model_dir

    smollm2_model_dir()  # convert once, outside the timings
    report: dict = {"machine": machine(), "command": "python benchmarks/bench_cpu.py " + " ".join(sys.argv[1:])}
    print(f"machine: {report['machine']}\ncommand: {report['command']}\n", flush=True)

    ours = run_child("ours", str(a.repeats))
    report["ours"] = ours
    o_step = median([s["step_s"] for s in ours["steps"]])
    rows = [("masrl GRPO step (rollout + update)", f"{o_step:.1f} s", parts(ours["steps"]))]
    if a.bf16:
        half = run_child("ours", str(a.repeats), "bf16")
        report["ours_bf16"] = half
        h_step = median([s["step_s"] for s in half["steps"]])
        rows.append(("masrl GRPO step, precision=bf16", f"{h_step:.1f} s",
                     f"{parts(half['steps'])}; fp32 / bf16 {o_step / h_step:.2f}x"))
    if not a.skip_trl:
        trl = run_child("trl", str(a.repeats))
        report["trl"] = trl
        t_step = median([s["step_s"] for s in trl["steps"]])
        rows.append(("TRL GRPOTrainer step", f"{t_step:.1f} s", ""))
        rows.append(("ratio masrl / TRL (lower is better)", f"{o_step / t_step:.2f}", "aim: 0.50"))
    print("GRPO step, 4 prompts x 4 samples x 64 new tokens, SmolLM2-135M-Instruct, one update, no KL")
    for r in rows:
        print(f"  {r[0]:<40} {r[1]:>10}  {r[2]}")

    if not a.skip_generate:
        print("\nrollout tokens/s, 64 new tokens per sequence (EOS ignored), temperature 1")
        print(f"  {'batch':>5} {'masrl engine':>14} {'model.generate':>15} {'ratio':>7}")
        report["generate"] = {}
        for b in (1, 8, 32):
            g = run_child("generate", str(b), str(a.repeats))
            report["generate"][b] = g
            ours_tps, hf_tps = g["tokens"] / g["ours_s"], g["tokens"] / g["generate_s"]
            print(f"  {b:>5} {ours_tps:>14.1f} {hf_tps:>15.1f} {ours_tps / hf_tps:>7.2f}", flush=True)

    if not a.skip_rss:
        print("\npeak RSS of one training step (2 tasks x 4 samples, SmolLM2-135M-Instruct)")
        report["rss"] = {}
        for cfg in ("math/team_four_policies", "math/team_lora", "math/team_shared"):
            r = run_child("rss", cfg)
            report["rss"][cfg] = r
            print(f"  {cfg:<28} {r['peak_rss_mb']:>8.0f} MB   ({r['wall_s']:.0f} s)", flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
