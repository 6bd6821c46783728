"""masrl's GRPO beside verl's (0.9.1, its own ``main_ppo``: FSDP2 actor, vLLM rollout), the same workload on the
same GPU, each in its own process (issue 74): step seconds (rollout, update), peak GPU memory, held-out accuracy.

    # on the GPU host, after scripts/gpu's set-up, SmolLM2, vLLM (vllm_install.sh), Ray and verl (verl_install.sh):
    python3 benchmarks/bench_verl.py --config reasoning_gym/solver --steps 60 --eval-every 10 --seeds 0 1 2

Both sides train on the same rows: ``masrl data export`` writes the config's train and eval tasks in verl's parquet
layout, each prompt the messages masrl's workflow sends, and verl pays each reply through
``masrl.driver.serving.verl_data.compute_score`` (the config's own rewards; ``--outcome-only``, the default, keeps
only the outcome reward on both sides, so the reward is the accuracy). The same model folder (masrl's converted
SmolLM2, or ``--model`` a Hugging Face folder), learning rate, prompts a step (``--tasks``), samples per prompt
(``--samples``), clip, KL off, temperature 1.0, reply length (``--new-tokens``), one optimizer step a step.
What differs is each framework's own: verl runs vLLM and its FSDP2 actor with Ray between them; masrl its paged
engine and its trainer in one process. verl runs with its own site folders first on the path
(``/tmp/site-verl:/tmp/site-vllm``, never masrl's ``/tmp/site``: hydra's antlr runtime and verl's transformers pin
differ from masrl's), masrl as ``scripts/gpu/setup.sh`` sets it up. ``--dry`` prints both commands and has verl
compose its config (``--cfg job``: every override is one verl 0.9.1 knows) without training.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VERL_PATH = "/tmp/site-verl:/tmp/site-vllm:/tmp/site-ray"  # scripts/gpu's installs
STEP_LINE = re.compile(r"step:(\d+) - (.*)")
VERL_DATA = ROOT / "src/masrl/driver/serving/verl_data.py"  # the config's own rewards (row 4)
COIN = ROOT / "benchmarks/verl_coin.py"  # a hash of the reply (row 1: random weights)


def random_model_folder(dest: Path, shape: str = "0.5b") -> str:
    """Qwen2.5-0.5B's or 7B's shape (masrl's ``random-qwen2.5-0.5b`` / ``-7b``) with SmolLM2's tokenizer and its
    49,152-token vocabulary (so that every sampled id decodes on both sides), random bf16 weights, saved as a Hugging
    Face folder both sides load."""
    if (dest / "config.json").is_file():
        return str(dest)
    import torch
    from transformers import AutoModelForCausalLM

    from masrl.models import SMOLLM2, load_tokenizer, qwen25_05b_shape_config, qwen25_7b_shape_config

    tok = load_tokenizer(SMOLLM2)
    cfg = {"0.5b": qwen25_05b_shape_config, "7b": qwen25_7b_shape_config}[shape](len(tok))
    cfg.vocab_size = len(tok)  # the shape's own is Qwen's 151,936
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    model.save_pretrained(dest)
    tok.save_pretrained(dest)
    return str(dest)


def verl_overrides(a, data: Path, model: str, seed: int, out: Path) -> list[str]:
    """verl's GRPO on one GPU, as its docs configure it, at ``a``'s workload."""
    return [
        "algorithm.adv_estimator=grpo", "algorithm.use_kl_in_reward=False",
        f"data.train_files={data / 'train.parquet'}", f"data.val_files={data / 'eval.parquet'}",
        f"data.train_batch_size={a.tasks}", f"data.max_prompt_length={a.prompt_tokens}",
        f"data.max_response_length={a.new_tokens}", "data.filter_overlong_prompts=True", "data.truncation=error",
        f"data.seed={seed}", "trainer.resume_mode=disable",
        f"actor_rollout_ref.model.path={model}",
        # flash-attn has no wheel for the image's torch 2.11 + CUDA 13 (PyPI holds its source only): the actor runs
        # SDPA, which reads packed rows as one sequence, so verl's remove-padding path is off (padded micro-batches)
        *(["actor_rollout_ref.model.use_remove_padding=True"] if a.verl_attn == "flash_attention_2" else
          ["actor_rollout_ref.model.use_remove_padding=False",
           f"+actor_rollout_ref.model.override_config.attn_implementation={a.verl_attn}"]),
        f"actor_rollout_ref.actor.optim.lr={a.lr}", f"actor_rollout_ref.actor.ppo_mini_batch_size={a.tasks}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={a.micro}", "actor_rollout_ref.actor.use_kl_loss=False",
        "actor_rollout_ref.actor.entropy_coeff=0", "actor_rollout_ref.actor.clip_ratio=0.2",
        "actor_rollout_ref.actor.strategy=fsdp2", "actor_rollout_ref.rollout.name=vllm",
        f"actor_rollout_ref.rollout.n={a.samples}", "actor_rollout_ref.rollout.temperature=1.0",
        f"actor_rollout_ref.rollout.gpu_memory_utilization={a.verl_kv}",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={a.micro}",
        f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={a.micro}",
        "trainer.logger=[console]", "trainer.n_gpus_per_node=1", "trainer.nnodes=1", "trainer.save_freq=-1",
        f"trainer.test_freq={a.eval_every or -1}", f"trainer.total_training_steps={a.steps}",
        f"trainer.val_before_train={bool(a.eval_every)}", f"trainer.default_local_dir={out / 'ckpt'}",
        f"reward.custom_reward_function.path={COIN if a.reward == 'coin' else VERL_DATA}",
        "reward.custom_reward_function.name=compute_score",
        # verl's LoRA path (FSDP + PEFT, vLLM loading the base from safetensors and taking the adapter natively)
        *([f"actor_rollout_ref.model.lora_rank={a.lora}", f"actor_rollout_ref.model.lora_alpha={2 * a.lora}",
           "actor_rollout_ref.model.target_modules=all-linear", "actor_rollout_ref.rollout.load_format=safetensors"]
          if a.lora else []),
    ]


def masrl_overrides(a, model: str, seed: int, out: Path, policy: str, agent: str) -> list[str]:
    """The same run in masrl's terms."""
    return [
        f"model={model}", f"seed={seed}", f"output_dir={out}", "device=cuda", "rollout.engine=paged",
        f"rollout.tasks_per_step={a.tasks}", f"rollout.samples_per_task={a.samples}",
        f"agents.{agent}.max_new_tokens={a.new_tokens}", f"agents.{agent}.temperature=1.0",
        f"policies.{policy}.optim.lr={a.lr}", "algorithm.advantage=grpo", "algorithm.clip_eps=0.2",
        "algorithm.kl_coef=0", "algorithm.mini_batches=1", "algorithm.ppo_epochs=1", f"train.steps={a.steps}",
        f"train.eval_every={a.eval_every}", "train.save_every=0", f"train.eval_before={str(bool(a.eval_every)).lower()}",
        f"algorithm.micro_batch_size={a.micro}",
        *(['rewards=[{type: "verl_coin:CoinReward"}]', "rollout.reward_isolation=thread"] if a.reward == "coin" else []),
        *([f"policies.{policy}.lora={{r: {a.lora}, alpha: {2 * a.lora}}}"] if a.lora else []),  # every linear layer
    ]


def model_folder(name: str | None, out: Path) -> str:
    if name is None:
        from masrl.models import smollm2_model_dir

        return str(smollm2_model_dir())
    if name in ("random-qwen2.5-0.5b", "random-qwen2.5-7b"):
        shape = name.rsplit("-", 1)[1]
        return random_model_folder(out / f"model-qwen2.5-{shape}-shape", shape)
    return name


def run_logged(cmd: list[str], env: dict, log: Path, timeout: float):
    """``cmd`` in its own process group, its output in ``log``, killed past ``timeout`` seconds: (exit status or
    "timeout", the log's text, the card's peak memory)."""
    with DeviceMemory() as mem, log.open("w") as sink:  # the whole card's, whichever process holds it
        proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=sink, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            rc = "timeout"
    return rc, log.read_text(errors="replace"), mem


class DeviceMemory:
    """The peak of the card's used memory (``nvidia-smi``, every half second) while the block runs."""

    def __enter__(self):
        import threading

        self.peak_gib, self._stop = 0.0, threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()
        return self

    def _poll(self) -> None:
        while not self._stop.wait(0.5):
            try:
                out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits",
                                      "--id=0"], capture_output=True, text=True, timeout=10).stdout
                self.peak_gib = max(self.peak_gib, float(out.strip() or 0) / 1024)
            except (OSError, ValueError, subprocess.TimeoutExpired):
                return

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def parse_verl(log: str) -> dict:
    """verl's console lines (``step:N - key:value - ...``): per step timings and memory, held-out rewards."""
    steps, evals = [], {}
    for line in log.splitlines():
        m = STEP_LINE.search(line)
        if not m:
            continue
        kv = {}
        for part in m.group(2).split(" - "):
            k, _, v = part.partition(":")
            try:
                kv[k.strip()] = float(v)
            except ValueError:
                continue
        step = int(m.group(1))
        val = [v for k, v in kv.items() if k.startswith("val-core/") and "reward/mean" in k]
        if val:
            evals[step] = sum(val) / len(val)
        if "timing_s/step" in kv:
            steps.append({"step": step, "s": kv["timing_s/step"], "rollout_s": kv.get("timing_s/gen"),
                          "update_s": kv.get("timing_s/update_actor"), "sync_s": kv.get("timing_s/update_weights"),
                          "old_logprob_s": kv.get("timing_s/old_log_prob"),
                          "peak_gib": next((v for k, v in kv.items() if k.endswith("perf/max_memory_allocated_gb")),
                                           None)})  # the actor's; vLLM's is apart
    return {"steps": steps, "evals": evals}


def parse_masrl(run: Path) -> dict:
    """masrl's metrics.jsonl: each step's rollout and update seconds and GPU peak, each evaluation's outcome."""
    path = run / "metrics.jsonl"
    recs = [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.is_file() else []
    steps = [{"step": r["step"], "s": (r.get("rollout_s") or 0.0) + (r.get("update_s") or 0.0),
              "rollout_s": r.get("rollout_s"), "update_s": r.get("update_s"), "peak_gib": r.get("gpu_peak_gib")}
             for r in recs if "rollout" in r]
    evals = {r["step"]: r.get("outcome") for r in recs if "eval" in r}
    return {"steps": steps, "evals": evals}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default="reasoning_gym/solver")
    ap.add_argument("--model", default=None, help="a Hugging Face folder, or random-qwen2.5-0.5b (default: masrl's "
                                                  "converted SmolLM2)")
    ap.add_argument("--reward", choices=["config", "coin"], default="config",
                    help="config: the config's own rewards (verl through verl_data.compute_score); coin: a hash of "
                         "the reply on both sides (random weights: the step's cost, not its learning)")
    ap.add_argument("--verl-attn", default="sdpa", help="verl's actor attention (flash_attention_2 needs flash-attn)")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds one side's run may take")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--eval-every", type=int, default=10)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--tasks", type=int, default=64)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--prompt-tokens", type=int, default=1024)
    ap.add_argument("--lr", type=float, default=1e-6)
    ap.add_argument("--micro", type=int, default=16)
    ap.add_argument("--lora", type=int, default=0, help="LoRA rank on every linear layer, alpha twice it (0: full)")
    ap.add_argument("--verl-kv", type=float, default=0.4, help="verl's rollout.gpu_memory_utilization")
    ap.add_argument("--train-n", type=int, default=2000)
    ap.add_argument("--eval-n", type=int, default=128)
    ap.add_argument("--outcome-only", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--sides", nargs="+", default=["verl", "masrl"], choices=["verl", "masrl"])
    ap.add_argument("--verl-path", default=VERL_PATH, help="verl's PYTHONPATH (before masrl's src, for its reward)")
    ap.add_argument("--verl-python", default=sys.executable)
    ap.add_argument("--dry", action="store_true")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()

    import yaml

    from masrl.families import config_path

    cfg_file = config_path(a.config)
    raw = yaml.safe_load(cfg_file.read_text())
    policy, agent = next(iter(raw["policies"])), next(iter(raw["agents"]))
    out = Path(a.out or tempfile.mkdtemp(prefix="bench-verl-"))
    model = model_folder(a.model, out)
    data = out / "data"
    data.mkdir(parents=True, exist_ok=True)
    base = [f"data.train.n={a.train_n}", f"data.eval.n={a.eval_n}",
            *(["rewards=[{type: outcome}]"] if a.outcome_only else [])]
    for split in ("train", "eval"):
        subprocess.run([sys.executable, "-m", "masrl.cli", "data", "export", str(cfg_file), *base, "--split", split,
                        "--out", str(data / f"{split}.parquet")], check=True, cwd=ROOT)
    verl_env = dict(os.environ, PYTHONPATH=os.pathsep.join([a.verl_path, str(ROOT / "src")]))
    bench_path = os.pathsep.join(filter(None, [os.environ.get("PYTHONPATH"), str(ROOT / "benchmarks")]))
    rows = []
    for seed in a.seeds:
        for side in a.sides:
            run = out / f"{side}-seed{seed}"
            if side == "verl":
                cmd = [a.verl_python, "-m", "verl.trainer.main_ppo", *verl_overrides(a, data, model, seed, run)]
                env = verl_env
            else:
                cmd = [sys.executable, "-m", "masrl.cli", "train", str(cfg_file), *base,
                       *masrl_overrides(a, model, seed, run, policy, agent)]
                env = dict(os.environ, PYTHONPATH=bench_path)
            if a.dry:
                print(" ".join(cmd))
                if side == "verl":
                    done = subprocess.run([*cmd[:3], "--cfg", "job", *cmd[3:]], env=env, capture_output=True, text=True)
                    print(f"  verl composes its config: {'ok' if done.returncode == 0 else done.stderr[-2000:]}")
                else:
                    import torch

                    from masrl.config import load_config
                    from masrl.driver.checks import check_run

                    here = [] if torch.cuda.is_available() else ["device=cpu"]  # a dry run on a machine without one
                    check_run(load_config(cfg_file, cmd[5:] + here))
                    print("  masrl checks its config: ok" + (" (on the CPU here)" if here else ""))
                continue
            run.mkdir(parents=True, exist_ok=True)
            t0 = time.time()
            rc, text, mem = run_logged(cmd, env, run / "console.log", a.timeout)
            got = parse_verl(text) if side == "verl" else parse_masrl(run)
            rows.append({"side": side, "seed": seed, "rc": rc, "wall_s": time.time() - t0,
                         "card_peak_gib": mem.peak_gib, **got})
            print(f"  {side} seed {seed}: exit {rc}, {time.time() - t0:.0f} s, "
                  f"{len(got['steps'])} steps, held-out {got['evals']}", flush=True)
            if rc != 0:
                print(text[-3000:], flush=True)
    if a.dry:
        return
    (out / "bench_verl.json").write_text(json.dumps(rows, indent=1))
    print(table(rows))


def table(rows: list[dict]) -> str:
    """Median step seconds (after the first step), rollout and update seconds, peak memory; held-out per step."""
    from statistics import median

    def med(xs):
        xs = [x for x in xs if x is not None]
        return median(xs) if xs else float("nan")
    lines = ["| side | seed | steps | step s | rollout s | update s | trainer peak GiB | card peak GiB | held-out by step |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        st = r["steps"][1:] or r["steps"]
        lines.append(f"| {r['side']} | {r['seed']} | {len(r['steps'])} | {med(s['s'] for s in st):.2f} | "
                     f"{med(s['rollout_s'] for s in st):.2f} | {med(s['update_s'] for s in st):.2f} | "
                     f"{max((s['peak_gib'] or 0) for s in r['steps']) if r['steps'] else float('nan'):.1f} | "
                     f"{r['card_peak_gib']:.1f} | "
                     + ", ".join(f"{k}: {v:.3f}" for k, v in sorted(r["evals"].items())) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
