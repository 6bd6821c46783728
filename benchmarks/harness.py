"""What the benchmarks share: the model shapes and device, timers, the child-process protocol, the header line
(machine and versions), the toy workloads and the hash rewards that give random weights reward variance.

A benchmark runs as a script (``python3 benchmarks/bench_x.py``), so this folder is on its path and ``import harness``
needs no path set-up; the rewards are config plugins by name, ``harness:agent_hash_reward`` (see ``rewards=`` in
bench_gpu.py's team part). Set ``MASRL_BENCH_MODEL=tiny-random MASRL_BENCH_DEVICE=cpu`` to check a GPU benchmark on
a CPU.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import tempfile
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PEAK_TFLOPS = 989.0  # an H100/H200's dense bf16 peak, for the MFU columns
SHAPES = {"135m": "random-smollm2-135m", "0.5b": "random-qwen2.5-0.5b", "7b": "random-qwen2.5-7b", "8b": "random-llama3.1-8b"}
if os.environ.get("MASRL_BENCH_MODEL"):  # a small model (and MASRL_BENCH_DEVICE=cpu), to check a benchmark on a CPU
    SHAPES = {k: os.environ["MASRL_BENCH_MODEL"] for k in SHAPES}
DEV = os.environ.get("MASRL_BENCH_DEVICE", "cuda:0")


# -- timers and memory ---------------------------------------------------------------------------------

def peak_gb() -> float:
    import torch

    return torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else 0.0


def sync():
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def replay_ms(replay, rewind=None, n: int = 20) -> float:
    """Median milliseconds of ``replay()`` by CUDA events; ``rewind()``, if given, runs before each, untimed."""
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(n):
        if rewind is not None:
            rewind()
        start.record()
        replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[n // 2]


def decode_profile(eng, batches) -> dict:
    """Median milliseconds of one replayed decode step per batch (the engine's floor per token)."""
    res = {}
    for B in batches:
        graphs = getattr(getattr(eng, "runner", None), "graphs", {})
        key = next((k for k in graphs if k[0] == B), None)
        if key is not None:
            res[B] = replay_ms(graphs[key][0].replay)
    return res


# -- workloads ------------------------------------------------------------------------------------------

def fake_reward(text: str) -> float:
    return (zlib.crc32(text.encode()) % 1000) / 1000.0


def update_workload(n=32, lo=256, hi=1024, prompt=32, seed=0):
    if os.environ.get("MASRL_BENCH_MODEL"):  # checking the script on a CPU
        n, lo, hi = 8, 64, 128
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        L = rng.randint(lo, hi)
        ids = [rng.randrange(100, 49000) for _ in range(L)]
        rows.append((ids[:prompt], ids[prompt:]))
    return rows


def useful_flops(cfg, rows) -> float:
    D, L, inter = cfg.hidden_size, cfg.num_hidden_layers, cfg.intermediate_size
    H, Hkv = cfg.num_attention_heads, cfg.num_key_value_heads
    hd = D // H
    linear = L * (D * H * hd + 2 * D * Hkv * hd + H * hd * D + 3 * D * inter)
    tokens = sum(len(p) + len(c) for p, c in rows)
    comp = sum(len(c) for _, c in rows)
    attn = sum(6 * L * (len(p) + len(c)) ** 2 * H * hd for p, c in rows)  # causal: half of 4 S^2 H hd, x3
    return 6 * linear * tokens + attn + 6 * cfg.vocab_size * D * comp


def grpo_prompts(n):
    names = ["Tom", "Mei", "Omar", "Ana", "Raj", "Lena", "Kofi", "Ivy"]
    things = ["apples", "pencils", "books", "coins", "cards", "stamps", "shells", "marbles"]
    rng = random.Random(0)
    qs = []
    for i in range(n):
        a, b = rng.randint(2, 60), rng.randint(2, 60)
        qs.append(f"{names[i % 8]} has {a} {things[(i // 8) % 8]} and gets {b} more. How many {things[(i // 8) % 8]} now?")
    system = ("You solve math word problems. Write the calculation in <solution></solution> and the final number in "
              "<answer></answer>.")
    return [[{"role": "system", "content": system}, {"role": "user", "content": q}] for q in qs]


# -- rewards for random weights (config plugins: harness:agent_hash_reward, harness:task_hash_reward) ----------

@dataclass
class HashReward:
    """A meaningless but deterministic reward with variance: a hash of each call's completion (and, with
    ``by_task``, its task's id, so that a greedy random model's repeated text still differs between tasks). Random
    weights never write a task's answer format, so real rewards are all zero and no group has an advantage."""

    weight: float = 1.0
    agents: tuple[str, ...] | None = None
    by_task: bool = False
    name: str = "text_hash"

    def allocate(self, trace, task):
        from masrl.rewards.base import RewardAssignment

        key = f"{task.id}|" if self.by_task else ""
        return [RewardAssignment(c.call_id, self.weight * (zlib.crc32(f"{key}{c.completion}".encode()) % 97) / 97.0,
                                 self.name) for c in trace.calls if self.agents is None or c.agent in self.agents]


def agent_hash_reward(weight: float = 1.0, agents: list[str] | None = None) -> HashReward:
    return HashReward(weight=weight, agents=tuple(agents) if agents else None)


def task_hash_reward(weight: float = 1.0) -> HashReward:
    return HashReward(weight=weight, by_task=True, name="task_text_hash")


# -- the child-process protocol and the header ------------------------------------------------------------

def run_child(script: str, *args: str, timeout: int = 900, src: str = "") -> dict:
    """``script --child ARGS`` in a fresh process (each measurement its own CUDA context and peak memory): the
    indented lines it prints are echoed, its last ``RESULT {json}`` line is returned, or ``{"error": ...}``.
    ``src``: a directory put first on the child's PYTHONPATH (another build of masrl, for a before/after). Each
    child compiles its Triton kernels into a cache of its own, so no child skips compiles an earlier one paid
    inside its timed parts."""
    cmd = [sys.executable, str(script), "--child", *args]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [src, os.environ.get("PYTHONPATH")])))
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="bench-triton-") as cache:
        env["TRITON_CACHE_DIR"] = cache
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env)
    for line in proc.stdout.splitlines():
        if line.startswith("  "):
            print(line, flush=True)
    lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        tail = proc.stderr.strip().splitlines()[-12:]
        print(f"  child {args} failed ({proc.returncode}) after {time.time() - t0:.0f}s:\n    " + "\n    ".join(tail), flush=True)
        return {"error": tail[-1] if tail else f"exit {proc.returncode}"}
    return json.loads(lines[-1][len("RESULT "):])


def header() -> str:
    import torch
    import transformers

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    try:
        import trl

        trl_v = trl.__version__
    except Exception:  # noqa: BLE001
        trl_v = "not installed"
    return (f"GPU: {gpu}; torch {torch.__version__} (CUDA {torch.version.cuda}), transformers {transformers.__version__}, "
            f"trl {trl_v}; command: python3 benchmarks/{Path(sys.argv[0]).name} {' '.join(sys.argv[1:])}")
